"""The preview of a topic's next compaction (``daemon/preview.py``): ``GET`` estimates from a sample
and starts nothing; ``POST`` runs the exact preview, a task with a slot, broker and Spark time. It is not
a GET: any web page could send a GET to a daemon on loopback, while a POST without a token must say
``Content-Type: application/json``, which no page can send cross-site without a preflight
(``api/auth.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Query

from compactord.api.models import Preview
from compactord.api.schema import CONFLICT, LEDGER, TopicName, errors
from compactord.errors import InvalidArgument
from compactord.model import validate_topic_name

if TYPE_CHECKING:
    from compactord.daemon.core import Daemon

__all__ = ["router"]


def router(daemon: Daemon, broker_slot: Any) -> APIRouter:
    api = APIRouter()

    # exclude_unset: the keys only the exact preview has are absent from an estimate, not null.
    @api.get("/v1/topics/{topic}/compaction/preview", tags=["compaction"], dependencies=[broker_slot],
             response_model=Preview, response_model_exclude_unset=True, responses=errors(*LEDGER))
    def preview(topic: TopicName, exact: bool = Query(False, description=(
            "refused: the exact preview starts a task, so it is POST .../compaction/preview"))
                ) -> dict[str, Any]:
        """What the next compaction would keep and remove: records, bytes of keys and values, the dirty
        ratio and an estimated duration, estimated from a sample of the tail (it starts no task)."""
        from compactord.daemon.preview import preview as run_preview

        validate_topic_name(topic)
        if exact:
            raise InvalidArgument(f"exact=true: an exact preview starts a task (a slot, broker and Spark time), "
                                  f"so it is POST /v1/topics/{topic}/compaction/preview; GET only estimates")
        return run_preview(daemon, topic, exact=False)

    @api.post("/v1/topics/{topic}/compaction/preview", tags=["compaction"], dependencies=[broker_slot],
              response_model=Preview, response_model_exclude_unset=True, responses=errors(*CONFLICT))
    def exact_preview(topic: TopicName) -> dict[str, Any]:
        """Run the job's read and choose steps exactly as the next compaction would and count the result
        instead of writing a ledger (a preview task: takes a slot, DELETE .../compaction cancels it)."""
        from compactord.daemon.preview import preview as run_preview

        validate_topic_name(topic)
        return run_preview(daemon, topic, exact=True)

    return api
