"""Liveness, readiness, Prometheus metrics, and the API's own docs.

The probes and /metrics are ``async def``: they run on the event loop, not in the thread pool that
requests waiting on the broker can fill, and they read only what the daemon keeps in memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from compactord.api.views import readiness_json
from compactord.errors import NotReady, Unhealthy
from compactord.model import MAX_TOPIC_LENGTH, TOPIC_PATTERN

if TYPE_CHECKING:
    from compactord.daemon.core import Daemon

__all__ = ["router"]


def with_topic_pattern(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with Kafka's topic-name rule on every ``{topic}`` path parameter (the handlers check it
    themselves, with the ``invalid_topic_name`` error; the schema says it, so that clients and fuzzers
    know the real pattern)."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []) if isinstance(operation, dict) else []:
                if parameter.get("in") == "path" and parameter.get("name") == "topic":
                    parameter.setdefault("schema", {}).update(pattern=TOPIC_PATTERN, maxLength=MAX_TOPIC_LENGTH)
    return schema


def router(daemon: Daemon) -> APIRouter:
    api = APIRouter()

    @api.get("/openapi.json", include_in_schema=False)
    def openapi(request: Request) -> JSONResponse:
        return JSONResponse(with_topic_pattern(request.app.openapi()))

    @api.get("/docs", include_in_schema=False)
    def docs() -> Response:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="compactord API")

    @api.api_route("/healthz", methods=["GET", "HEAD"], tags=["health"])
    async def healthz() -> JSONResponse:
        """Liveness: the process serves and its Spark session is up (once started)."""
        problem = daemon.liveness_problem()
        if problem:
            raise Unhealthy(problem)
        return JSONResponse({"status": "ok"})

    @api.api_route("/readyz", methods=["GET", "HEAD"], tags=["health"])
    async def readyz() -> JSONResponse:
        """Readiness: 200 while ledger reads can be served, with ``status`` "ready" (compactions can run:
        the broker answers, Spark is warm) or "degraded" (they cannot: ``problems`` says why); 503 only
        when reads cannot be served either."""
        readiness = daemon.readiness()
        if not readiness.reads:
            raise NotReady("; ".join(readiness.problems))
        return JSONResponse(readiness_json(readiness))

    @api.get("/metrics", tags=["health"])
    async def metrics() -> Response:
        return Response(daemon.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return api
