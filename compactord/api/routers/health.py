"""Liveness, readiness, Prometheus metrics, and the API's own docs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from compactord.errors import NotReady, Unhealthy

if TYPE_CHECKING:
    from compactord.daemon.core import Daemon

__all__ = ["router"]


def router(daemon: Daemon) -> APIRouter:
    api = APIRouter()

    @api.get("/openapi.json", include_in_schema=False)
    def openapi(request: Request) -> JSONResponse:
        return JSONResponse(request.app.openapi())

    @api.get("/docs", include_in_schema=False)
    def docs() -> Response:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="compactord API")

    @api.api_route("/healthz", methods=["GET", "HEAD"], tags=["health"])
    def healthz() -> JSONResponse:
        """Liveness: the process serves and its Spark session is up (once started)."""
        problem = daemon.liveness_problem()
        if problem:
            raise Unhealthy(problem)
        return JSONResponse({"status": "ok"})

    @api.api_route("/readyz", methods=["GET", "HEAD"], tags=["health"])
    def readyz() -> JSONResponse:
        """Readiness: the broker answers and the Spark session is up and warmed."""
        problems = daemon.readiness_problems()
        if problems:
            raise NotReady("; ".join(problems))
        return JSONResponse({"status": "ready"})

    @api.get("/metrics", tags=["health"])
    def metrics() -> Response:
        return Response(daemon.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return api
