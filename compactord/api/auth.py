"""Who may ask what: one ASGI middleware in front of the app (``ApiGuard``).

In this order, each refusal answered with the API's JSON error body:

1. **Host** (DNS rebinding): bound to loopback, only ``localhost``, ``127.0.0.1`` and ``[::1]`` (any
   port); otherwise the ``httpAllowedHosts`` names (empty: any). ``/healthz``, ``/readyz`` and ``/metrics``
   also take any IP literal (probes and scrapers come with pod addresses), but no other name: a
   DNS-rebinding page must not read the topic names and backlogs of ``/metrics``. 400 ``host_not_allowed``.
2. **Tokens** on ``/v1``, ``/docs`` and ``/openapi.json`` when ``httpAuthToken`` is set: it allows
   everything; ``httpReadToken`` allows only ``READ_ENDPOINTS``. 401 ``unauthorized`` without a bearer
   token or with one that is neither (who asks is not known), 403 ``permission_denied`` with the read token on
   an endpoint it does not allow (saying which token the endpoint needs). A request of the read token is
   answered with ``views.READER`` set: a task's error then says what failed in our terms, not the
   store's endpoint, bucket, keys or an exception's text (those stay in the log and for the admin token).
3. **Content type** (cross-site requests): a ``POST`` without ``Authorization`` must say
   ``Content-Type: application/json``, which a browser cannot send cross-site without a CORS preflight.
   415 ``unsupported_media_type``. ``POST`` is the only state-changing method a web page can send
   cross-site without a preflight; ``PUT``, ``DELETE`` and ``PATCH`` always need one, and this API never
   grants one (no ``Access-Control-Allow-*`` header, whatever the ``OPTIONS`` request), so they are
   accepted whatever their ``Content-Type`` (``curl -X PUT .../compaction`` as typed).

The guard is the outermost middleware: it decides from the headers alone, before the request takes one of
the ``httpMaxConnections`` places or any of its body is read (``api/limits.py``), so requests it refuses
hold nothing the authorised ones need.

Everything is decided on the ASGI scope's ``path``, never on ``request.url`` (built from the Host header:
a Starlette bug of that shape bypassed auth before 1.0.1).
"""

from __future__ import annotations

import hmac
import ipaddress
import re

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from compactord.api.views import READER, error_response
from compactord.errors import (
    AuthenticationRequired,
    CompactordError,
    HostNotAllowed,
    PermissionDenied,
    UnsupportedMediaType,
)

__all__ = [
    "HOST_EXEMPT_PATHS",
    "LOOPBACK_HOSTS",
    "PROTECTED_PREFIXES",
    "READ_ENDPOINTS",
    "ApiGuard",
    "check_bearer_token",
    "check_content_type",
    "check_host",
    "check_probe_host",
    "is_read_endpoint",
]

PROTECTED_PREFIXES = ("/v1", "/docs", "/openapi.json")
HOST_EXEMPT_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
#: What ``httpReadToken`` allows: GET (and HEAD) of these paths, nothing else.
READ_ENDPOINTS = re.compile(r"/v1/(topics|tasks|info)|/v1/topics/[^/]+/(compaction|horizon|history|compacted|compacted/last)")
_READ_METHODS = frozenset({"GET", "HEAD"})
# The one state-changing method a browser sends cross-site without a CORS preflight (a "simple request").
_SIMPLE_STATE_CHANGING = frozenset({"POST"})


def is_read_endpoint(method: str, path: str) -> bool:
    return method in _READ_METHODS and READ_ENDPOINTS.fullmatch(path) is not None


def _host_name(host: str) -> str | None:
    """The name of a Host header value without its port, lower case; None if it is malformed."""
    host = host.strip().lower()
    if host.startswith("["):
        name, bracket, rest = host[1:].partition("]")
        return name if bracket and (not rest or re.fullmatch(r":[0-9]{1,5}", rest)) else None
    if host.count(":") > 1:  # a bare IPv6 address
        return host
    name, colon, port = host.partition(":")
    return name if name and (not colon or re.fullmatch(r"[0-9]{1,5}", port)) else None


def check_host(host: str | None, loopback: bool, allowed: tuple[str, ...]) -> None:
    """:raises HostNotAllowed: ``host`` (the Host header) is not a name this daemon answers to."""
    given = (host or "").strip().lower()
    name = _host_name(given) if given else None
    if loopback:
        ok = name in LOOPBACK_HOSTS
        wanted = "localhost, 127.0.0.1 or [::1] (the API is bound to loopback)"
    else:
        ok = name is not None and (not allowed or name in allowed or given in allowed)
        wanted = f"one of httpAllowedHosts ({', '.join(allowed)})"
    if not ok:
        raise HostNotAllowed(f"the Host header {host!r} is not allowed here; use {wanted}")


def check_probe_host(host: str | None, loopback: bool, allowed: tuple[str, ...]) -> None:
    """:raises HostNotAllowed: ``host`` is neither an IP literal nor a name ``check_host`` allows."""
    name = _host_name((host or "").strip().lower()) if host else None
    try:
        ipaddress.ip_address(name or "")
        return
    except ValueError:
        check_host(host, loopback, allowed)


def check_bearer_token(authorization: str, token: bytes, read_token: bytes, method: str, path: str) -> bool:
    """Whether the request is the read token's (False: the admin token's). :raises AuthenticationRequired:
    no bearer token given, or one that is neither token. :raises PermissionDenied: the read token on an
    endpoint that is not a read."""
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise AuthenticationRequired("this endpoint needs the header 'Authorization: Bearer <httpAuthToken>'")
    if hmac.compare_digest(given.encode(), token):
        return False
    if read_token and hmac.compare_digest(given.encode(), read_token):
        if is_read_endpoint(method, path):
            return True
        raise PermissionDenied(f"{method} {path} needs httpAuthToken (the admin token); httpReadToken allows "
                               "only GET of /v1/topics, /v1/tasks, /v1/info and a topic's compaction, horizon, "
                               "history and compacted entries")
    raise AuthenticationRequired("the bearer token is neither the configured httpAuthToken nor httpReadToken; "
                                 "send 'Authorization: Bearer <httpAuthToken>'")


def check_content_type(method: str, headers: Headers) -> None:
    """:raises UnsupportedMediaType: a ``POST`` without ``Authorization`` that does not say
    ``Content-Type: application/json``."""
    if method not in _SIMPLE_STATE_CHANGING or "authorization" in headers:
        return
    media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        raise UnsupportedMediaType(
            f"{method} requests without an Authorization header must carry 'Content-Type: application/json' "
            f"(got {media_type or 'none'}); this keeps web pages from driving the API cross-site")


def _has_body(headers: Headers) -> bool:
    return headers.get("content-length", "0").strip() not in ("", "0") or "transfer-encoding" in headers


class ApiGuard:
    """Pure ASGI (not ``BaseHTTPMiddleware``: no task group between the server and the routes)."""

    def __init__(self, app: ASGIApp, *, token: bytes, read_token: bytes, loopback: bool,
                 allowed_hosts: tuple[str, ...]) -> None:
        self.app = app
        self.token = token
        self.read_token = read_token
        self.loopback = loopback
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            try:
                reader = self.check(scope["method"], scope["path"], headers)
            except CompactordError as exc:
                response = error_response(exc)
                if _has_body(headers):  # left unread: no next request on this connection
                    response.headers["Connection"] = "close"
                await response(scope, receive, send)
                return
            answering = READER.set(reader)
            try:
                await self.app(scope, receive, send)
            finally:
                READER.reset(answering)
            return
        await self.app(scope, receive, send)

    def check(self, method: str, path: str, headers: Headers) -> bool:
        """Whether the request is the read token's. :raises CompactordError: it is refused."""
        if path in HOST_EXEMPT_PATHS:
            check_probe_host(headers.get("host"), self.loopback, self.allowed_hosts)
        else:
            check_host(headers.get("host"), self.loopback, self.allowed_hosts)
        reader = False
        if self.token and path.startswith(PROTECTED_PREFIXES):
            reader = check_bearer_token(headers.get("authorization", ""), self.token, self.read_token, method,
                                        path)
        check_content_type(method, headers)
        return reader
