"""``GET /v1/info``: what this daemon is and where its parts are (version, broker, ledger root, Spark).

Behind the token like every ``/v1`` path (the read token allows it): it names the broker's address and
the ledger root, which an unauthenticated caller never sees (a daemon without a token serves loopback
only, unless the operator allowed otherwise).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter

from compactord.api.models import Info
from compactord.api.schema import V1, errors
from compactord.api.views import info_json

if TYPE_CHECKING:
    from compactord.daemon.core import Daemon

__all__ = ["router"]


def router(daemon: Daemon) -> APIRouter:
    api = APIRouter()

    @api.get("/v1/info", tags=["info"], response_model=Info, responses=errors(*V1))
    def info() -> dict[str, Any]:
        """The version, the broker's bootstrap servers (and whether it is the embedded one), the ledger
        root and the Spark master. ``compactord demo --url`` learns the broker here."""
        return info_json(daemon)

    return api
