"""Bearer-token authentication: with ``httpAuthToken`` set, ``/v1``, ``/docs`` and
``/openapi.json`` need ``Authorization: Bearer <httpAuthToken>``; health and metrics stay open."""

from __future__ import annotations

import hmac

from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from compactord.api.views import error_response
from compactord.errors import AuthenticationRequired, CompactordError, PermissionDenied

__all__ = ["PROTECTED_PREFIXES", "BearerTokenMiddleware", "check_bearer_token"]

PROTECTED_PREFIXES = ("/v1", "/docs", "/openapi.json")


def check_bearer_token(authorization: str, token: bytes) -> None:
    """:raises AuthenticationRequired: no bearer token given. :raises PermissionDenied: another token."""
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise AuthenticationRequired("this endpoint needs the header 'Authorization: Bearer <httpAuthToken>'")
    if not hmac.compare_digest(given.encode(), token):
        raise PermissionDenied("the bearer token is not the configured httpAuthToken")


class BearerTokenMiddleware(BaseHTTPMiddleware):
    # It answers the error itself: an exception raised in a middleware passes by the app's
    # exception handlers (they sit inside the middleware stack).
    def __init__(self, app: ASGIApp, token: bytes) -> None:
        super().__init__(app)
        self.token = token

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if request.url.path.startswith(PROTECTED_PREFIXES):
            try:
                check_bearer_token(request.headers.get("authorization", ""), self.token)
            except CompactordError as exc:
                return error_response(exc)
        return await call_next(request)
