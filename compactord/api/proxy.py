"""In a cluster, a topic's writes are answered by the member that owns it: this middleware forwards them.

Daemons sharing a ledger root split its topics among themselves (one owner per topic, ``compactord/cluster/``).
Reads are served by every member from the shared store; the requests that change a topic (trigger, cancel, its
policies, unload, load, delete) must be carried out by its owner, whichever member the broker or the CLI asked.
A member that does not own the topic forwards the request as it came (method, path, query, body, the caller's
``Authorization``) to the owner's advertised URL and answers with the owner's answer: clients need not follow a
redirect (curl, urllib and httpx do not follow a 307 on PUT). While the topic has no owner (mid-rebalance) the
answer is 503 ``no_owner`` with ``Retry-After``; an owner that cannot be reached is 503 ``owner_unreachable``.

A forwarded request carries ``X-Compactord-Forwarded``: its receiver answers it itself or, if the topic moved
meanwhile, 503 ``no_owner``; a request is never forwarded twice. The middleware sits inside the guard
(``auth.py``: a request is authenticated before it is forwarded, so a member relays nothing for strangers) and
inside the request bounds (``limits.py``: the body is bounded and a forward holds one of the places).
"""

from __future__ import annotations

import http.client
import logging
import re
import ssl
import urllib.parse
from collections.abc import Callable, MutableMapping
from typing import Any

import anyio
from starlette.types import ASGIApp, Receive, Send

from compactord.api.views import error_response
from compactord.daemon.cluster import Owner
from compactord.errors import CompactordError, NoOwner, OwnerUnreachable

__all__ = ["FORWARDED_HEADER", "FORWARD_MARGIN_S", "OwnerProxy", "owned_topic"]

log = logging.getLogger(__name__)

#: Set on a forwarded request, naming the member that forwarded it.
FORWARDED_HEADER = "x-compactord-forwarded"
#: An owner's answer larger than this is refused (the forwarded routes answer a task or a topic's JSON).
MAX_ANSWER_BYTES = 1024 * 1024
#: A forward waits for the owner's answer this much longer than the owner waits for a task to stop.
FORWARD_MARGIN_S = 10.0
#: Forwards in flight at once; each holds a worker thread while it waits for the owner.
MAX_FORWARDS = 16
#: The headers of the owner's answer that are passed on.
_ANSWER_HEADERS = ("content-type", "retry-after", "allow")

_NAME = r"([a-zA-Z0-9._-]{1,249})"
#: The routes that change a topic: (method, path pattern with the topic as its one group).
_WRITES = [(method, re.compile(pattern)) for method, pattern in (
    ("PUT", rf"/v1/topics/{_NAME}/compaction"), ("DELETE", rf"/v1/topics/{_NAME}/compaction"),
    ("PUT", rf"/v1/topics/{_NAME}/policies"), ("DELETE", rf"/v1/topics/{_NAME}/policies"),
    ("POST", rf"/v1/topics/{_NAME}/unload"), ("POST", rf"/v1/topics/{_NAME}/load"),
    ("DELETE", rf"/v1/topics/{_NAME}"))]


def owned_topic(method: str, path: str) -> str | None:
    """The topic a request changes, if it is one of the routes only a topic's owner answers."""
    for write_method, pattern in _WRITES:
        if method == write_method:
            match = pattern.fullmatch(path)
            if match:
                return match.group(1)
    return None


class OwnerProxy:
    """Forwards the requests that change a topic to its owner (``owner_of(topic)``; see the module's doc).
    ``member``: this member's advertised URL, named in the forwarded requests' header; ``timeout_s``: how long a
    forward waits for the owner's answer; ``ca_file``: the CA that members' HTTPS certificates are checked with
    (None: the system's)."""

    def __init__(self, app: ASGIApp, *, owner_of: Callable[[str], Owner], member: str, timeout_s: float,
                 ca_file: str | None = None) -> None:
        self.app = app
        self.owner_of = owner_of
        self.member = member
        self.timeout_s = timeout_s
        self._tls = ssl.create_default_context(cafile=ca_file)
        self._limiter: anyio.CapacityLimiter | None = None  # made on the event loop, at the first forward

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        topic = owned_topic(scope["method"], scope["path"]) if scope["type"] == "http" else None
        if topic is None:
            await self.app(scope, receive, send)
            return
        owner = self.owner_of(topic)
        if owner.here:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if owner.url is None or FORWARDED_HEADER in headers:
            why = "it moved while the request was forwarded" if owner.url is not None else "the cluster is rebalancing"
            await self._answer_error(scope, receive, send, NoOwner(
                f"topic {topic!r} has no owner in the cluster now ({why}); retry in a second", public=True))
            return
        body = await _read_body(receive)
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(MAX_FORWARDS)
        try:
            status, answer_headers, answer = await anyio.to_thread.run_sync(
                self._forward, owner.url, scope, headers, body, limiter=self._limiter)
        except OwnerUnreachable as exc:
            log.warning("%s", exc)
            await self._answer_error(scope, _no_more_body, send, exc)
            return
        await send({"type": "http.response.start", "status": status,
                    "headers": [(k.encode(), v.encode()) for k, v in answer_headers]
                    + [(b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})

    def _forward(self, owner_url: str, scope: MutableMapping[str, Any], headers: dict[str, str],
                 body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        """The owner's answer to the request: (status, headers passed on, body).

        :raises OwnerUnreachable: the owner did not answer, or answered more than ``MAX_ANSWER_BYTES``."""
        target = urllib.parse.urlsplit(owner_url)
        path = target.path.rstrip("/") + scope["path"]
        if scope.get("query_string"):
            path += "?" + scope["query_string"].decode("latin-1")
        sent: dict[str, str] = {name: headers[name] for name in ("authorization", "content-type") if name in headers}
        sent[FORWARDED_HEADER] = self.member
        if target.scheme == "https":
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                target.netloc, timeout=self.timeout_s, context=self._tls)
        else:
            connection = http.client.HTTPConnection(target.netloc, timeout=self.timeout_s)
        try:
            connection.request(scope["method"], path, body=body, headers=sent)
            response = connection.getresponse()
            answer = response.read(MAX_ANSWER_BYTES + 1)
            if len(answer) > MAX_ANSWER_BYTES:
                raise OwnerUnreachable(
                    f"the owner at {owner_url} answered more than {MAX_ANSWER_BYTES} bytes to {scope['method']} "
                    f"{scope['path']}", owner=owner_url)
            passed = [(name, value) for name, value in response.getheaders() if name.lower() in _ANSWER_HEADERS]
            return response.status, passed, answer
        except (OSError, http.client.HTTPException) as exc:
            raise OwnerUnreachable(
                f"the topic's owner at {owner_url} did not answer {scope['method']} {scope['path']}: "
                f"{exc or type(exc).__name__}; retry in a second (the cluster moves its topics if it is gone)",
                owner=owner_url) from exc
        finally:
            connection.close()

    @staticmethod
    async def _answer_error(scope: MutableMapping[str, Any], receive: Receive, send: Send,
                            error: CompactordError) -> None:
        response = error_response(error)
        response.headers["Retry-After"] = "1"
        await response(scope, receive, send)


async def _read_body(receive: Receive) -> bytes:
    """The whole request body (bounded by the request limits' middleware, outside this one)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _no_more_body() -> MutableMapping[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}
