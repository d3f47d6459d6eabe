"""The preview of a topic's next compaction (``daemon/preview.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Query

from compactord.model import validate_topic_name

if TYPE_CHECKING:
    from compactord.daemon.core import Daemon

__all__ = ["router"]


def router(daemon: Daemon, broker_slot: Any) -> APIRouter:
    api = APIRouter()

    @api.get("/v1/topics/{topic}/compaction/preview", tags=["compaction"], dependencies=[broker_slot])
    def preview(topic: str, exact: bool = Query(False, description=(
            "run the job's read and choose steps (a preview task: takes a slot, DELETE .../compaction "
            "cancels it) instead of estimating from a sample of the tail"))) -> dict[str, Any]:
        """What the next compaction would keep and remove: records, bytes of keys and values, the dirty
        ratio and an estimated duration; an estimate from a sample of the tail unless ``exact``."""
        from compactord.daemon.preview import preview as run_preview

        validate_topic_name(topic)
        return run_preview(daemon, topic, exact=exact)

    return api
