"""``GET /v1/info``: what this daemon is and where its parts are (version, broker, ledger root, Spark);
``GET /v1/cluster``: the cluster it is a member of.

Behind the token like every ``/v1`` path (the read token allows it): it names the broker's address and
the ledger root, which an unauthenticated caller never sees (a daemon without a token serves loopback
only, unless the operator allowed otherwise).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter

from compactord.api.models import Cluster, Info
from compactord.api.schema import V1, errors
from compactord.api.views import cluster_json, info_json

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

    @api.get("/v1/cluster", tags=["info"], response_model=Cluster, responses=errors(*V1))
    def cluster() -> dict[str, Any]:
        """The cluster this daemon is a member of (clusterName): its members with their URLs, versions and
        coordination partitions, the topics this member owns, the partitions no member holds and the last
        rebalance. A daemon without clusterName answers an empty name and no members."""
        return cluster_json(daemon)

    return api
