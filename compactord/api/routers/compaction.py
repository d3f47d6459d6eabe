"""Compaction of one topic: trigger, status, cancel; and the recent tasks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from compactord.api.models import Task, TaskList
from compactord.api.schema import CONFLICT, V1, TopicName, errors
from compactord.api.views import task_status, tasks_json, topic_status
from compactord.model import validate_topic_name

if TYPE_CHECKING:
    from compactord.daemon.core import Daemon

__all__ = ["router"]


def router(daemon: Daemon, broker_slot: Any, store_answers: Any, lease_held: Any) -> APIRouter:
    """``broker_slot``: the dependency that bounds the requests calling the broker; ``store_answers`` and
    ``lease_held``: the ones that refuse a trigger at once (503 storage_unavailable) while the ledger root's store
    is known to be down, or its lease is not held (``limits.py``)."""
    api = APIRouter()
    cancel_timeout = float(daemon.settings.cancel_timeout_seconds)

    @api.put("/v1/topics/{topic}/compaction", status_code=202, tags=["compaction"], response_model=Task,
             responses=errors(*CONFLICT), dependencies=[store_answers, lease_held, broker_slot])
    def trigger(request: Request, topic: TopicName,
                rebuild: bool = Query(False, description="ignore the ledger, re-read the topic")) -> JSONResponse:
        """Trigger a compaction (202 and the task; 409 if one runs; 404 if the broker has no such topic; 503
        while the ledger root's store does not answer or its lease is not held)."""
        validate_topic_name(topic)
        daemon.topics.require_topic(topic)
        daemon.require_owner(topic)
        daemon.policies.set_unloaded(topic, False)  # a manual trigger brings an unloaded topic back
        caller = request.client.host if request.client is not None else None
        ctx = daemon.registry.trigger(topic, rebuild=rebuild, caller=caller)
        return JSONResponse(task_status(ctx), status_code=202)

    @api.get("/v1/topics/{topic}/compaction", tags=["compaction"], response_model=Task, responses=errors(*V1))
    def status(topic: TopicName) -> dict[str, Any]:
        """Status of the topic's last compaction: NOT_RUN, RUNNING, SUCCESS or ERROR (404 for a name that
        has no state here and that the broker lacks)."""
        validate_topic_name(topic)
        daemon.topics.require_known_topic(topic)
        return topic_status(daemon, topic)

    @api.delete("/v1/topics/{topic}/compaction", tags=["compaction"], response_model=Task,
                responses={202: {"model": Task, "description": "still stopping"}, **errors(*CONFLICT)})
    def cancel(topic: TopicName) -> JSONResponse:
        """Cancel the running compaction (200 when stopped, 202 while stopping, 409 while switching)."""
        validate_topic_name(topic)
        outcome = daemon.registry.cancel(topic, cancel_timeout)
        return JSONResponse(task_status(outcome.task), status_code=200 if outcome.stopped else 202)

    @api.get("/v1/tasks", tags=["topics"], response_model=TaskList, responses=errors(*V1))
    def tasks(topic: str | None = Query(None)) -> dict[str, Any]:
        """The recent tasks (the last 20 of each topic), newest first."""
        if topic is not None:
            validate_topic_name(topic)
        found = [t for t in daemon.registry.tasks() if topic is None or t.topic == topic]
        return tasks_json(found)

    return api
