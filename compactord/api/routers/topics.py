"""The topic listing and each topic's policies (per-topic overrides of the thresholds and the strategy)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Body, Query

from compactord.api.models import Policies, TopicList
from compactord.api.schema import V1, TopicName, errors
from compactord.api.views import policies_json, topics_json
from compactord.daemon.listing import DEFAULT_LIMIT, MAX_LIMIT, STATES, check_query
from compactord.daemon.policies import TopicPolicies
from compactord.errors import BrokerUnavailable
from compactord.model import validate_topic_name

if TYPE_CHECKING:
    from compactord.daemon.core import Daemon

__all__ = ["router"]


def router(daemon: Daemon, broker_slot: Any, store_answers: Any) -> APIRouter:
    """``broker_slot``: the dependency that bounds the requests calling the broker; ``store_answers``: the one
    that answers 503 storage_unavailable at once while the store is known to be down (``limits.py``)."""
    api = APIRouter()

    def answer(topic: str) -> dict[str, Any]:
        return policies_json(topic, daemon.policies.get(topic), daemon.settings)

    @api.get("/v1/topics/{topic}/policies", tags=["policies"], dependencies=[store_answers],
             response_model=Policies, responses=errors(*V1))
    def get_policies(topic: TopicName) -> dict[str, Any]:
        """Per-topic overrides of the thresholds and the strategy, and what is in force."""
        validate_topic_name(topic)
        daemon.topics.require_known_topic(topic)  # 404 topic_not_found, as for every other topic route
        return answer(topic)

    @api.put("/v1/topics/{topic}/policies", tags=["policies"], dependencies=[store_answers],  # no broker
             response_model=Policies, responses=errors(*V1))
    def put_policies(topic: TopicName, body: dict[str, Any] = Body(
            ..., examples=[{"thresholdBytes": 1048576}])) -> dict[str, Any]:
        """Replace the topic's overrides (fields: thresholdBytes, thresholdMessages, maxLagSeconds,
        minDirtyRatio, strategy, maxReadBytesPerSecond, keyTtlMs, iceberg; null or absent = the broker-wide setting). Each
        number has a range (docs/http-api.md, Policies), 422 outside it. ``strategy`` is a built-in
        name, compactionStrategy or one of compactionStrategyPlugins (422 otherwise: nothing is imported)."""
        validate_topic_name(topic)
        policies = TopicPolicies.from_json(body, daemon.policies.allowed_strategies)
        daemon.topics.require_known_topic(topic)  # 404 topic_not_found: no folder for a name that exists nowhere
        daemon.require_owner(topic)
        daemon.topics.set_policies(topic, policies)
        return answer(topic)

    @api.delete("/v1/topics/{topic}/policies", tags=["policies"], dependencies=[store_answers],
                response_model=Policies, responses=errors(*V1))
    def delete_policies(topic: TopicName) -> dict[str, Any]:
        """Drop the topic's overrides: the broker-wide settings are in force again."""
        validate_topic_name(topic)
        daemon.topics.require_known_topic(topic)
        daemon.require_owner(topic)
        daemon.topics.set_policies(topic, None)
        return answer(topic)

    # exclude_unset: a topic that cannot be read answers only its name, on_broker and the error.
    @api.get("/v1/topics", tags=["topics"], response_model=TopicList, response_model_exclude_unset=True,
             responses=errors(*V1))
    def topics(limit: int = Query(DEFAULT_LIMIT, description=f"topics per page, 1 to {MAX_LIMIT}"),
               after: str | None = Query(None, description="the next_after of the previous page"),
               state: str | None = Query(None, description=f"only topics in this state: {', '.join(STATES)}"),
               prefix: str | None = Query(None, description="only topics whose name starts with this")) -> dict[str, Any]:
        """A page of the known topics, in name order, with their backlog, last compaction and current task: from
        what the daemon keeps (the monitor's last pass, the tasks), never asking the broker or the store. While
        the broker is known down: 503 broker_unavailable."""
        check_query(limit, state)  # 422 before anything else
        problem = daemon.health.broker_problem()
        if problem:
            raise BrokerUnavailable(problem)
        return topics_json(daemon, limit, after, state, prefix)

    return api
