"""Liveness, readiness, Prometheus metrics, and the API's own docs (Swagger UI served from the package).

The probes and /metrics are ``async def``: they run on the event loop, not in the thread pool that
requests waiting on the broker can fill, and they read only what the daemon keeps in memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from compactord.api.models import Error, Health, Readiness, Unready
from compactord.api.views import error_response, readiness_json
from compactord.errors import NotReady, RouteNotFound, Unhealthy

if TYPE_CHECKING:
    from compactord.daemon.core import Daemon

__all__ = ["router"]


STATIC = Path(__file__).resolve().parent.parent / "static" / "swagger-ui"
ASSETS_URL = "/static/swagger-ui"
# The files /docs loads, by name: nothing else under STATIC is served (no path from a request is opened).
_ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css", "favicon-32x32.png": "image/png"}


def router(daemon: Daemon) -> APIRouter:
    api = APIRouter()

    @api.get("/openapi.json", include_in_schema=False)
    def openapi(request: Request) -> JSONResponse:
        return JSONResponse(request.app.openapi())  # generated once, from the routes and their models

    @api.get("/docs", include_in_schema=False)
    def docs() -> Response:
        # Swagger UI from the package: /docs works where the daemon runs, without internet.
        return get_swagger_ui_html(
            openapi_url="/openapi.json", title="compactord API", swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css", swagger_favicon_url=f"{ASSETS_URL}/favicon-32x32.png",
            swagger_ui_parameters={"validatorUrl": None})  # no badge from the online validator

    @api.get(ASSETS_URL + "/{name}", include_in_schema=False)
    def asset(name: str) -> Response:
        media_type = _ASSETS.get(name)
        if media_type is None:
            return error_response(RouteNotFound(f"no asset {name}; the docs' assets are: {', '.join(_ASSETS)}"))
        return FileResponse(STATIC / name, media_type=media_type, headers={"Cache-Control": "max-age=86400"})

    async def healthz() -> JSONResponse:
        """Liveness: the process serves and its Spark session is up (once started)."""
        problem = daemon.health.liveness_problem()
        if problem:
            raise Unhealthy(problem)
        return JSONResponse({"status": "ok"})

    async def readyz() -> JSONResponse:
        """Readiness: 200 while ledger reads can be served, with ``status`` "ready" (compactions can run:
        the broker answers, Spark is warm) or "degraded" (they cannot: ``problems`` says why); 503 only
        when reads cannot be served either (the ledger root or its store is down), with the same fields."""
        readiness = daemon.health.readiness()
        if not readiness.reads:
            refused = NotReady("; ".join(readiness.problems))
            return JSONResponse({"error": refused.code, "message": refused.message, **readiness_json(readiness)},
                                status_code=refused.status)
        return JSONResponse(readiness_json(readiness))

    probes = (("/healthz", healthz, Health, Error, "unhealthy"),
              ("/readyz", readyz, Readiness, Unready, "ledger reads cannot be served"))
    for path, probe, body, refused, why in probes:
        api.add_api_route(path, probe, methods=["GET"], tags=["health"], response_model=body,
                          responses={503: {"model": refused, "description": why}})
        # HEAD too (load balancers), as a route of its own outside the schema: one operation id per route.
        api.add_api_route(path, probe, methods=["HEAD"], include_in_schema=False)

    @api.get("/metrics", tags=["health"])
    async def metrics() -> Response:
        return Response(daemon.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return api
