"""The run history of a topic: its ended tasks, kept across restarts (``daemon/history.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Query

from compactord.api.models import History
from compactord.api.schema import V1, TopicName, errors
from compactord.api.views import history_json
from compactord.model import validate_topic_name

if TYPE_CHECKING:
    from compactord.daemon.core import Daemon

__all__ = ["router"]


def router(daemon: Daemon, store_answers: Any) -> APIRouter:
    """``store_answers``: the dependency that answers 503 at once while the store is known to be down."""
    api = APIRouter(dependencies=[store_answers])

    @api.get("/v1/topics/{topic}/history", tags=["compaction"], response_model=History, responses=errors(*V1))
    def history(topic: TopicName, limit: int = Query(50, description="runs per page, 1 to 1000"),
                cursor: str | None = Query(None, description="the 'next' of the previous page")) -> dict[str, Any]:
        """The topic's runs, newest first: ``{"runs": [...], "next": cursor or null}``. A run says why it
        ran, who asked (a manual trigger), when, how it ended, what it read and wrote, and the ledgers
        before and after. Kept under the ledger root within compactionHistoryMaxRuns and
        compactionHistoryMaxAgeDays; deleted with the topic. 404 topic_not_found for a name that has
        no run, no state here and is not on the broker."""
        validate_topic_name(topic)
        page = daemon.history.page(topic, limit, cursor)
        if not page.runs and daemon.history.last(topic) is None:
            daemon.topics.require_known_topic(topic)  # no runs: is the topic known at all? (as every topic route)
        return history_json(topic, page)

    return api
