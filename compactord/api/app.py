"""The HTTP API (FastAPI). JSON everywhere; every error is ``{"error": code, "message": text}``.

Routes are plain ``def`` functions: FastAPI runs them in its thread pool, so a slow broker or a
cancel that waits never blocks the event loop.
"""

from __future__ import annotations

import base64
import hmac
import logging
from typing import TYPE_CHECKING, Any, Literal

from fastapi import Body, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from compactord import __version__
from compactord.daemon.policies import TopicPolicies
from compactord.daemon.registry import task_status
from compactord.errors import (
    AuthenticationRequired,
    CompactordError,
    EntryNotFound,
    InvalidArgument,
    NotCompacted,
    PermissionDenied,
)
from compactord.model import Entry, Position, validate_topic_name

if TYPE_CHECKING:
    from compactord.daemon.core import Daemon

__all__ = ["create_app", "entry_json"]

log = logging.getLogger(__name__)
_PROTECTED = ("/v1", "/docs", "/openapi.json")
Encoding = Literal["base64", "utf8"]


def _error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": code, "message": message, **extra}, status_code=status)


def _encode(data: bytes | None, encoding: str) -> str | None:
    if data is None:
        return None
    if encoding == "utf8":
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgument(
                "an entry holds bytes that are not UTF-8; read it with encoding=base64 (the default)"
            ) from None
    return base64.b64encode(data).decode("ascii")


def entry_json(entry: Entry, encoding: str, markers: bool = False) -> dict[str, Any]:
    data = {
        "partition": entry.partition,
        "offset": entry.offset,
        "key": _encode(entry.key, encoding),
        "value": _encode(entry.value, encoding),
        "timestamp": entry.timestamp,
        "headers": [{"key": k, "value": base64.b64encode(v or b"").decode("ascii")} for k, v in entry.headers],
    }
    if markers:  # what the compacted reader needs to apply the event-time strategy
        data.update(event_time=entry.event_time, marker=entry.marker)
    return data


def create_app(daemon: Daemon) -> FastAPI:
    app = FastAPI(
        title="compactord",
        version=__version__,
        description="Topic compaction daemon for Kafka-protocol brokers",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    settings = daemon.settings
    token = settings.http_auth_token.encode()
    cancel_timeout = float(settings.cancel_timeout_seconds)

    # -- errors and auth ------------------------------------------------------------------------

    @app.exception_handler(CompactordError)
    def compactord_error(request: Request, exc: CompactordError) -> JSONResponse:
        status = exc.status
        extra: dict[str, Any] = {}
        if status == 409:
            task = getattr(exc, "task", None) or daemon.registry.live(request.path_params.get("topic", ""))
            extra["task"] = task_status(task) if task is not None else None
        if status >= 500:
            log.warning("%s %s failed: %s", request.method, request.url.path, exc)
        return _error(status, exc.code, exc.message, **extra)

    @app.exception_handler(RequestValidationError)
    def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors():
            where = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "request"
            parts.append(f"{where}: {err.get('msg')}")
        return _error(422, InvalidArgument.code, "; ".join(parts) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, code, str(exc.detail))

    @app.exception_handler(Exception)
    def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return _error(500, "internal_error", f"{type(exc).__name__}: {exc}")

    @app.middleware("http")
    async def authenticate(request: Request, call_next: Any) -> Any:
        if token and request.url.path.startswith(_PROTECTED):
            header = request.headers.get("authorization", "")
            scheme, _, given = header.partition(" ")
            if scheme.lower() != "bearer" or not given:
                return _error(401, AuthenticationRequired.code,
                              "this endpoint needs the header 'Authorization: Bearer <httpAuthToken>'")
            if not hmac.compare_digest(given.encode(), token):
                return _error(403, PermissionDenied.code, "the bearer token is not the configured httpAuthToken")
        return await call_next(request)

    # -- docs, health, metrics ------------------------------------------------------------------

    @app.get("/openapi.json", include_in_schema=False)
    def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False)
    def docs() -> Response:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="compactord API")

    @app.api_route("/healthz", methods=["GET", "HEAD"], tags=["health"])
    def healthz() -> JSONResponse:
        """Liveness: the process serves and its Spark session is up (once started)."""
        problem = daemon.liveness_problem()
        if problem:
            return _error(503, "unhealthy", problem)
        return JSONResponse({"status": "ok"})

    @app.api_route("/readyz", methods=["GET", "HEAD"], tags=["health"])
    def readyz() -> JSONResponse:
        """Readiness: the broker answers and the Spark session is up and warmed."""
        problems = daemon.readiness_problems()
        if problems:
            return _error(503, "not_ready", "; ".join(problems))
        return JSONResponse({"status": "ready"})

    @app.get("/metrics", tags=["health"])
    def metrics() -> Response:
        return Response(daemon.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # -- compaction -----------------------------------------------------------------------------

    @app.put("/v1/topics/{topic}/compaction", status_code=202, tags=["compaction"])
    def trigger(topic: str, rebuild: bool = Query(False, description="ignore the ledger, re-read the topic")
                ) -> JSONResponse:
        """Trigger a compaction (202 and the task; 409 if one runs; 404 if the broker has no such topic)."""
        validate_topic_name(topic)
        daemon.require_topic(topic)
        daemon.policies.set_unloaded(topic, False)  # a manual trigger brings an unloaded topic back
        ctx = daemon.registry.trigger(topic, rebuild=rebuild)
        return JSONResponse(task_status(ctx), status_code=202)

    @app.get("/v1/topics/{topic}/compaction", tags=["compaction"])
    def status(topic: str) -> dict[str, Any]:
        """Status of the topic's last compaction: NOT_RUN, RUNNING, SUCCESS or ERROR."""
        validate_topic_name(topic)
        return daemon.topic_status(topic)

    @app.delete("/v1/topics/{topic}/compaction", tags=["compaction"])
    def cancel(topic: str) -> JSONResponse:
        """Cancel the running compaction (200 when stopped, 202 while stopping, 409 while switching)."""
        validate_topic_name(topic)
        outcome = daemon.registry.cancel(topic, cancel_timeout)
        return JSONResponse(task_status(outcome.task), status_code=200 if outcome.stopped else 202)

    @app.get("/v1/topics/{topic}/horizon", tags=["ledger"])
    def horizon(topic: str) -> dict[str, Any]:
        """The compaction horizon: per partition, the last offset the current ledger covers."""
        validate_topic_name(topic)
        manifest = daemon.registry.service(topic).ledger_info()
        if manifest is None:
            raise NotCompacted(topic)
        return {
            "topic": topic,
            "ledger_id": manifest.ledger_id,
            "partitions": [{"partition": p, "offset": o} for p, o in sorted(manifest.horizon.items())],
        }

    @app.get("/v1/topics/{topic}/compacted", tags=["ledger"])
    def compacted(
        topic: str,
        partition: int = Query(..., ge=0, le=2**31 - 1),
        start: int = Query(0, ge=0, le=2**63 - 1),
        limit: int = Query(100, ge=1, le=10000),
        encoding: Encoding = Query("base64"),
        include_markers: bool = Query(False, description="also event-time deletion markers, with event times"),
    ) -> dict[str, Any]:
        """Live entries of one partition with offset >= start, in order, from the current ledger."""
        page = _service_of(topic, partition).read_compacted_page(Position(partition, start), limit,
                                                                  include_markers=include_markers)
        manifest, entries = page.ledger, page.entries
        _check_partition(manifest.horizon, partition)
        more = len(entries) == limit and entries[-1].offset < manifest.horizon[partition]
        return {
            "topic": topic,
            "ledger_id": manifest.ledger_id,
            "entries": [entry_json(e, encoding, include_markers) for e in entries],
            "next_start": entries[-1].offset + 1 if more else None,
        }

    @app.get("/v1/topics/{topic}/compacted/last", tags=["ledger"])
    def compacted_last(topic: str, partition: int = Query(..., ge=0, le=2**31 - 1),
                       encoding: Encoding = Query("base64")) -> dict[str, Any]:
        """The last live entry of a partition (404 for an empty partition)."""
        page = _service_of(topic, partition).read_last_compacted_page(partition)
        _check_partition(page.ledger.horizon, partition)
        if not page.entries:
            raise EntryNotFound(f"partition {partition} of topic {topic!r} has no compacted entry")
        return entry_json(page.entries[0], encoding)

    def _service_of(topic: str, partition: int) -> Any:
        """The topic's service, after a cheap check that the partition exists in its current ledger
        (the page's own ledger is checked again: a switch may come in between)."""
        validate_topic_name(topic)
        service = daemon.registry.service(topic)
        manifest = service.ledger_info()
        if manifest is None:
            raise NotCompacted(topic)
        _check_partition(manifest.horizon, partition)
        return service

    # -- topic lifecycle (broker hooks) ---------------------------------------------------------

    @app.post("/v1/topics/{topic}/unload", tags=["lifecycle"])
    def unload(topic: str) -> JSONResponse:
        """The topic moved away: cancel a cancellable task, keep the ledger, skip it in the monitor."""
        validate_topic_name(topic)
        daemon.policies.set_unloaded(topic, True)
        # 0.8, as DELETE /v1/topics/{topic} does: the answer itself must also fit in the timeout.
        outcome = daemon.registry.stop_topic(topic, cancel_timeout * 0.8)
        body = {"topic": topic, "unloaded": True, "task": task_status(outcome.task) if outcome else None}
        return JSONResponse(body, status_code=202 if outcome and not outcome.stopped else 200)

    @app.post("/v1/topics/{topic}/load", tags=["lifecycle"])
    def load(topic: str) -> dict[str, Any]:
        """The topic is back on this broker: the monitor considers it again."""
        validate_topic_name(topic)
        daemon.policies.set_unloaded(topic, False)
        return {"topic": topic, "unloaded": False}

    @app.delete("/v1/topics/{topic}", tags=["lifecycle"])
    def delete_topic(topic: str) -> JSONResponse:
        """The topic was deleted: stop its task, then remove its ledgers, horizon and policies."""
        validate_topic_name(topic)
        done, task = daemon.delete_topic(topic, cancel_timeout)
        body = {"topic": topic, "deleted": done, "task": task_status(task) if task else None}
        return JSONResponse(body, status_code=200 if done else 202)

    # -- policies -------------------------------------------------------------------------------

    def _policies_json(topic: str) -> dict[str, Any]:
        policies = daemon.policies.get(topic)
        return {"topic": topic, "policies": policies.to_json(), "effective": policies.effective(settings)}

    @app.get("/v1/topics/{topic}/policies", tags=["policies"])
    def get_policies(topic: str) -> dict[str, Any]:
        """Per-topic overrides of the thresholds and the strategy, and what is in force."""
        validate_topic_name(topic)
        return _policies_json(topic)

    @app.put("/v1/topics/{topic}/policies", tags=["policies"])
    def put_policies(topic: str, body: dict[str, Any] = Body(..., examples=[{"thresholdBytes": 1048576}])
                     ) -> dict[str, Any]:
        """Replace the topic's overrides (fields: thresholdBytes, thresholdMessages, maxLagSeconds,
        minDirtyRatio, strategy; null or absent = the broker-wide setting)."""
        validate_topic_name(topic)
        daemon.set_policies(topic, TopicPolicies.from_json(body))
        return _policies_json(topic)

    @app.delete("/v1/topics/{topic}/policies", tags=["policies"])
    def delete_policies(topic: str) -> dict[str, Any]:
        validate_topic_name(topic)
        daemon.set_policies(topic, None)
        return _policies_json(topic)

    # -- listings -------------------------------------------------------------------------------

    @app.get("/v1/topics", tags=["topics"])
    def topics() -> dict[str, Any]:
        """Every known topic with its backlog, last compaction and current task."""
        return {"topics": daemon.list_topics()}

    @app.get("/v1/tasks", tags=["topics"])
    def tasks(topic: str | None = Query(None)) -> dict[str, Any]:
        """The recent tasks (the last 20 of each topic), newest first."""
        if topic is not None:
            validate_topic_name(topic)
        found = [t for t in daemon.registry.tasks() if topic is None or t.topic == topic]
        return {"tasks": [task_status(t) for t in reversed(found)]}

    # -- anything else --------------------------------------------------------------------------

    @app.api_route("/{path:path}", methods=["GET", "PUT", "POST", "DELETE", "PATCH", "HEAD"],
                   include_in_schema=False)
    def catch_all(path: str, request: Request) -> JSONResponse:
        # Starlette tries the routes in order and this one matches every method, so a known path
        # asked with another method lands here: answer 405, not "does not fit a topic route".
        allowed = sorted({method for route in app.router.routes if route is not catch_all_route
                          and route.matches(request.scope)[0] is Match.PARTIAL
                          for method in getattr(route, "methods", None) or ()})
        if allowed:
            response = _error(405, "method_not_allowed",
                              f"{request.method} is not allowed on /{path}; allowed: {', '.join(allowed)}")
            response.headers["Allow"] = ", ".join(allowed)
            return response
        if path.startswith("v1/topics/"):
            return _error(422, "invalid_topic_name",
                          f"/{path} does not fit a topic route: a topic name is 1 to 249 characters of "
                          "[a-zA-Z0-9._-] (no '/'), e.g. /v1/topics/<topic>/compaction")
        return _error(404, "not_found", f"no route /{path}; see /docs")

    catch_all_route = app.router.routes[-1]

    return app


def _check_partition(horizon: dict[int, int], partition: int) -> None:
    if partition not in horizon:
        raise InvalidArgument(
            f"partition {partition} is not in the ledger; the topic has partitions 0 to {max(horizon, default=-1)}"
        )


