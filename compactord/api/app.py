"""The HTTP API (FastAPI). JSON everywhere; every error is ``{"error": code, "message": text}``.

This module builds the app: the error handlers, the middleware that checks the Host, the tokens and
the content type (``auth.py``), the bounds on requests (``limits.py``) and one router per resource
(``routers/``); ``views.py`` builds the JSON, typed by ``models.py`` (the OpenAPI document is
generated from the models and the routes; ``schema.py`` adds each route's errors). Routes are plain
``def`` functions: FastAPI runs them in its thread pool, so a slow broker or a cancel that waits never
blocks the event loop. The probes are
``async def`` on the event loop, out of that pool; the routes that call the broker take one of
``BROKER_SLOTS`` first (``limits.broker_slots``), the ledger reads one of ``READ_SLOTS`` (``limits.read_slots``),
and render their JSON in their own thread.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from compactord import __version__
from compactord.api.auth import ApiGuard
from compactord.api.limits import BROKER_SLOTS, RequestLimitsMiddleware, broker_slots, refused_while
from compactord.api.proxy import FORWARD_MARGIN_S, OwnerProxy
from compactord.api.routers import compaction, health, history, hooks, info, preview, reads, topics
from compactord.api.views import error_response, optional_task_status, problem_response
from compactord.config_values import is_loopback
from compactord.errors import (
    BrokerUnavailable,
    CompactordError,
    InvalidArgument,
    MalformedRequest,
    MethodNotAllowed,
    NotReady,
    RouteNotFound,
    StorageUnavailable,
    Unhealthy,
)

if TYPE_CHECKING:
    from compactord.daemon.core import Daemon

__all__ = ["create_app", "handler_cannot_exit"]

log = logging.getLogger(__name__)


def create_app(daemon: Daemon) -> FastAPI:
    app = FastAPI(
        title="compactord",
        version=__version__,
        description="Topic compaction daemon for Kafka-protocol brokers",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    _add_error_handlers(app, daemon)
    settings = daemon.settings
    if daemon.cluster is not None:  # innermost: a request is authenticated and bounded before it is forwarded
        app.add_middleware(OwnerProxy, owner_of=daemon.cluster.owner, member=daemon.member_url,
                           timeout_s=settings.cancel_timeout_seconds + FORWARD_MARGIN_S,
                           ca_file=settings.cluster_tls_ca_file or None)
    app.add_middleware(RequestLimitsMiddleware, max_in_flight=settings.http_max_connections,
                       max_body_bytes=settings.http_max_request_bytes,
                       body_timeout_s=settings.http_request_body_timeout_seconds,
                       max_response_bytes=settings.http_response_buffer_bytes,
                       report_response_bytes=daemon.metrics.http_response_buffer.set)
    # Added last, so outermost: the Host, the token and the content type are checked from the headers
    # before a request takes one of the httpMaxConnections places or any of its body is read, so requests
    # that would be refused (a stranger's chunked upload that never ends) cannot hold the places of the
    # authorised ones.
    app.add_middleware(ApiGuard, token=settings.http_auth_token.encode(),
                       read_token=settings.http_read_token.encode(),
                       loopback=is_loopback(settings.http_bind_address), allowed_hosts=settings.allowed_hosts)
    broker_wait_s = settings.kafka_request_timeout_ms / 1000
    broker_slot = Depends(broker_slots(BROKER_SLOTS, broker_wait_s, daemon.health.broker_problem))
    store_answers = Depends(refused_while(daemon.health.store_problem))
    lease = Depends(refused_while(daemon.health.lease_problem, public=True, lease=True))
    routers = [health.router(daemon), compaction.router(daemon, broker_slot, store_answers, lease),
               reads.router(daemon, store_answers), hooks.router(daemon),
               topics.router(daemon, broker_slot, store_answers),
               history.router(daemon, store_answers), preview.router(daemon, broker_slot), info.router(daemon)]
    for router in [*routers, hooks.catch_all_router(routers)]:  # the catch-all last: it matches every path
        _guard_endpoints(router)
        app.include_router(router)
    return app


class RequestHandlerExit(RuntimeError):
    """A request handler raised a ``BaseException`` that would end the process (``SystemExit``)."""


def handler_cannot_exit(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """``endpoint``, with a ``BaseException`` other than ``KeyboardInterrupt``/``GeneratorExit`` turned into
    an ``Exception`` (answered 500 by the catch-all handler). Routes run in the thread pool, and a
    ``SystemExit`` raised there reaches the event loop (through a middleware's task group) and ends the
    daemon: no request may do that. The probes are ``async def`` (on the event loop): guarded alike."""

    def exit_refused(exc: BaseException) -> RequestHandlerExit:
        return RequestHandlerExit(f"the request handler raised {type(exc).__name__}({exc})")

    if inspect.iscoroutinefunction(endpoint):

        @functools.wraps(endpoint)  # FastAPI reads the parameters through __wrapped__
        async def guarded_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await endpoint(*args, **kwargs)
            except (Exception, KeyboardInterrupt, GeneratorExit):
                raise
            except BaseException as exc:
                raise exit_refused(exc) from exc

        return guarded_async

    @functools.wraps(endpoint)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return endpoint(*args, **kwargs)
        except (Exception, KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as exc:
            raise exit_refused(exc) from exc

    return guarded


def _guard_endpoints(router: APIRouter) -> None:
    # Before include_router: the app's routes are built from these (their endpoint, or the dependant
    # that calls it at each request, depending on the FastAPI version): wrap both.
    for route in router.routes:
        if isinstance(route, APIRoute):
            guarded = handler_cannot_exit(route.endpoint)
            route.endpoint = guarded
            route.dependant.call = guarded


def _add_error_handlers(app: FastAPI, daemon: Daemon) -> None:
    @app.exception_handler(CompactordError)
    def compactord_error(request: Request, exc: CompactordError) -> JSONResponse:
        extra: dict[str, Any] = {}
        if exc.carries_task:  # the task in the way; a fenced switch or a locked root has none to show
            task = getattr(exc, "task", None) or daemon.registry.live(request.path_params.get("topic", ""))
            extra["task"] = optional_task_status(task)
        # The probes answer NotReady and Unhealthy; a broker or a store known to be down is logged by its
        # probe, once. A store's failure marks it down: the next requests that need it are answered at once.
        store_down = isinstance(exc, StorageUnavailable) and daemon.health.store_problem() is not None
        lease_refused = isinstance(exc, StorageUnavailable) and exc.details.get("lease") is True  # not the store's
        if isinstance(exc, StorageUnavailable) and not store_down and not lease_refused:
            daemon.health.store_failed(exc)
        quiet = isinstance(exc, (NotReady, Unhealthy)) or store_down or lease_refused or (
            isinstance(exc, BrokerUnavailable) and daemon.health.broker_problem() is not None)
        if exc.status >= 500 and not quiet:
            log.warning("%s %s failed: %s", request.method, request.url.path, exc)
        return error_response(exc, **extra)

    @app.exception_handler(RequestValidationError)
    def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors():
            where = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "request"
            parts.append(f"{where}: {err.get('msg')}")
        return problem_response(422, InvalidArgument.code, "; ".join(parts) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Starlette's own refusals: a body that is not JSON (400), a route or method it does not know.
        error = {400: MalformedRequest, 404: RouteNotFound, 405: MethodNotAllowed}.get(exc.status_code)
        if error is None:
            return problem_response(exc.status_code, CompactordError.code, str(exc.detail))
        return error_response(error(str(exc.detail)))

    @app.exception_handler(Exception)
    def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return problem_response(500, "internal_error", f"{type(exc).__name__}: {exc}")
