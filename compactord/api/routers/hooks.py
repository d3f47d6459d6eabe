"""The broker's topic-lifecycle hooks (unload, load, delete), and the answer to every other path."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.routing import Match

from compactord.api.models import Lifecycle
from compactord.api.schema import CONFLICT, V1, TopicName, errors
from compactord.api.views import deleted_json, error_response, unloaded_json
from compactord.errors import InvalidTopicName, MethodNotAllowed, RouteNotFound
from compactord.model import validate_topic_name

if TYPE_CHECKING:
    from compactord.daemon.core import Daemon

__all__ = ["catch_all_router", "router"]


def router(daemon: Daemon) -> APIRouter:
    api = APIRouter()
    cancel_timeout = float(daemon.settings.cancel_timeout_seconds)

    # No broker slot: the hook answers within compactionCancelTimeoutSeconds whatever the broker does
    # (a topic held here needs no broker; for another one a broker known to be down answers 503 at once).
    @api.post("/v1/topics/{topic}/unload", tags=["lifecycle"], response_model=Lifecycle,
              responses={202: {"model": Lifecycle, "description": "its task still stopping"}, **errors(*V1)})
    def unload(topic: TopicName) -> JSONResponse:
        """The topic moved away: cancel a cancellable task, keep the ledger, skip it in the monitor."""
        validate_topic_name(topic)
        daemon.topics.require_known_topic(topic)  # 404 topic_not_found: no folder for a name that exists nowhere
        daemon.require_owner(topic)
        daemon.policies.set_unloaded(topic, True)
        # 0.8, as DELETE /v1/topics/{topic} does: the answer itself must also fit in the timeout.
        outcome = daemon.registry.stop_topic(topic, cancel_timeout * 0.8)
        body = unloaded_json(topic, True, outcome.task if outcome else None)
        return JSONResponse(body, status_code=202 if outcome and not outcome.stopped else 200)

    # exclude_unset: a load answers the topic and ``unloaded`` only.
    @api.post("/v1/topics/{topic}/load", tags=["lifecycle"], response_model=Lifecycle,
              response_model_exclude_unset=True, responses=errors(*V1))
    def load(topic: TopicName) -> dict[str, Any]:
        """The topic is back on this broker: the monitor considers it again."""
        validate_topic_name(topic)
        daemon.topics.require_known_topic(topic)
        daemon.require_owner(topic)
        daemon.policies.set_unloaded(topic, False)
        return unloaded_json(topic, False)

    @api.delete("/v1/topics/{topic}", tags=["lifecycle"], response_model=Lifecycle, responses={
        202: {"model": Lifecycle, "description": "its task still stopping"}, **errors(*CONFLICT)})
    def delete_topic(topic: TopicName) -> JSONResponse:
        """The topic was deleted: stop its task, then remove its ledgers, horizon and policies (404 for a
        name that has no state here and that the broker lacks: nothing was deleted)."""
        validate_topic_name(topic)
        daemon.topics.require_known_topic(topic)
        daemon.require_owner(topic)
        done, task = daemon.topics.delete_topic(topic, cancel_timeout)
        return JSONResponse(deleted_json(topic, done, task), status_code=200 if done else 202)

    return api


def catch_all_router(routers: list[APIRouter]) -> APIRouter:
    """Every path and method no route of ``routers`` takes: 405 with the allowed methods for a known
    path, else 422 for what looks like a bad topic name, else 404. Include it last: it matches
    everything."""
    api = APIRouter()
    known = [route for router in routers for route in router.routes]

    @api.api_route("/{path:path}", methods=["GET", "PUT", "POST", "DELETE", "PATCH", "HEAD"],
                   include_in_schema=False)
    def catch_all(path: str, request: Request) -> JSONResponse:
        # Starlette tries the routes in order and this one matches every method, so a known path
        # asked with another method lands here: answer 405, not "does not fit a topic route".
        allowed = sorted({method for route in known if route.matches(request.scope)[0] is Match.PARTIAL
                          for method in getattr(route, "methods", None) or ()})
        if allowed:
            response = error_response(MethodNotAllowed(
                f"{request.method} is not allowed on /{path}; allowed: {', '.join(allowed)}"))
            response.headers["Allow"] = ", ".join(allowed)
            return response
        if path.startswith("v1/topics/"):
            return error_response(InvalidTopicName(
                f"/{path} does not fit a topic route: a topic name is 1 to 249 characters of "
                "[a-zA-Z0-9._-] (no '/'), e.g. /v1/topics/<topic>/compaction"))
        return error_response(RouteNotFound(f"no route /{path}; see /docs"))

    return api
