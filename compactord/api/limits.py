"""Bounds on what clients can make the HTTP server hold: requests in flight, the size of a request's
body and the time to receive it, the bytes of large answers not yet taken by their clients
(``RequestLimitsMiddleware``), and the requests that wait on the broker
(``broker_slots``), and the requests that need a store known to be down (``refused_while``). Each refusal is the
API's JSON error (``{"error", "message"}``), not uvicorn's
plain text.

The middleware is ASGI, outside FastAPI's routing: it runs on the event loop, before any thread of the
pool is taken, and counts every request that the guard in front of it (``api/auth.py``: the Host, the
token) let through, also those that end in an error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import anyio
import anyio.lowlevel

from compactord.api.views import error_response
from compactord.errors import (
    BrokerUnavailable,
    CompactordError,
    RequestTimeout,
    RequestTooLarge,
    ServerBusy,
    StorageUnavailable,
)

__all__ = ["ABORT_KEY", "BROKER_SLOTS", "CHUNK_BYTES", "PROBE_PATHS", "READ_SLOTS", "RequestLimitsMiddleware",
           "broker_slots", "read_slots", "refused_while"]

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]

# Not counted against httpMaxConnections: a probe or a scrape must get its answer when the API is busy.
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
# How long a request past httpMaxConnections waits for one in flight to end before it is refused.
QUEUE_WAIT_S = 1.0
# Requests that call the broker at once (GET /v1/topics, a trigger, ...): a hung broker holds this many
# threads of the pool (40 by default), leaving the rest to ledger reads.
BROKER_SLOTS = 16
# Ledger pages read and rendered at once (each holds at most httpReadMaxBytes of entries and a thread of
# the pool). More would not serve faster (turning rows into JSON holds the GIL) but would hold more
# memory, and would make the event loop, which answers the probes, wait behind more threads for the GIL.
# Others wait their turn, off the pool, for up to ``READ_SLOT_WAIT_S``.
READ_SLOTS = 3
READ_SLOT_WAIT_S = 30.0
# An answer larger than this is counted against httpResponseBufferBytes and handed to the connection in
# pieces of this size, each waiting for the client to take the one before (the server's flow control), so
# a client that does not read holds its answer here, counted, rather than in an unbounded write buffer.
CHUNK_BYTES = 64 * 1024
# The scope key under which the HTTP protocol (``compactord/server.py``) puts a callable that drops the
# connection: a client that takes nothing of its answer for the send timeout is cut off.
ABORT_KEY = "compactord.abort"


class RequestLimitsMiddleware:
    """At most ``max_in_flight`` requests at once (probes apart); a request past it waits up to
    ``QUEUE_WAIT_S`` for one to end, with at most ``max_in_flight`` others waiting, before it is
    answered 503 server_busy: a burst a little over the bound is served, not refused."""

    def __init__(self, app: ASGIApp, *, max_in_flight: int, max_body_bytes: int, body_timeout_s: float,
                 max_response_bytes: int = 256 * 1024 * 1024,
                 report_response_bytes: Callable[[int], None] = lambda held: None) -> None:
        self.app = app
        self.max_in_flight = max_in_flight
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.max_response_bytes = max_response_bytes
        self.report_response_bytes = report_response_bytes  # the gauge compactord_http_response_buffer_bytes
        self.response_bytes = 0  # of large answers not yet taken by their clients; only touched on the loop
        self.waiting = 0  # only touched on the event loop: no lock
        self._slots: anyio.Semaphore | None = None  # made on the event loop, at the first request

    @property
    def in_flight(self) -> int:
        return 0 if self._slots is None else self.max_in_flight - self._slots.value

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        if self._slots is None:
            self._slots = anyio.Semaphore(self.max_in_flight)
        if not await self._wait_for_slot(self._slots):
            await _refuse(scope, receive, send, ServerBusy(
                f"the API serves httpMaxConnections={self.max_in_flight} requests at once already; retry later"),
                retry_after=1)
            return
        held = [0]
        try:
            await self._limited(scope, receive, self._budgeted(scope, send, held))
        finally:
            if held[0]:
                self.response_bytes -= held[0]
                self.report_response_bytes(self.response_bytes)
            self._slots.release()

    def _budgeted(self, scope: MutableMapping[str, Any], send: Send, held: list[int]) -> Send:
        """``send``, counting an answer over ``CHUNK_BYTES`` against httpResponseBufferBytes until the request
        ends (``held[0]``: its bytes, given back by the caller): one that does not fit is answered 503
        server_busy instead (its rendered body dropped at once), and one that fits goes out in pieces,
        each within the send timeout or the connection is dropped."""
        refused = False

        async def budgeted(message: Message) -> None:
            nonlocal refused
            if refused:
                return
            if message["type"] == "http.response.start":
                length = _content_length(message)
                if length is not None and length > CHUNK_BYTES:
                    if self.response_bytes + length > self.max_response_bytes:
                        refused = True
                        await _refuse(scope, _no_body, send, ServerBusy(
                            f"answers of {self.response_bytes} bytes wait for their clients to take them; this one "
                            f"({length} bytes) would pass httpResponseBufferBytes={self.max_response_bytes}; "
                            "retry later"), retry_after=1)
                        return
                    self.response_bytes += length
                    held[0] = length
                    self.report_response_bytes(self.response_bytes)
            elif message["type"] == "http.response.body" and held[0]:
                await self._send_in_pieces(scope, send, message)
                return
            await send(message)

        return budgeted

    async def _send_in_pieces(self, scope: MutableMapping[str, Any], send: Send, message: Message) -> None:
        body: bytes = message.get("body", b"")
        more = bool(message.get("more_body", False))
        view = memoryview(body)
        for start in range(0, max(len(body), 1), CHUNK_BYTES):
            end = start + CHUNK_BYTES
            piece = {"type": "http.response.body", "body": bytes(view[start:end]),
                     "more_body": more or end < len(body)}
            with anyio.move_on_after(self.body_timeout_s) as waited:
                await send(piece)
            if waited.cancelled_caught:  # the client took nothing for the send timeout: cut it off
                abort = scope.get(ABORT_KEY)
                if abort is not None:
                    abort()
                    await anyio.lowlevel.checkpoint()  # the server sees the connection lost before the request ends
                return

    async def _wait_for_slot(self, slots: anyio.Semaphore) -> bool:
        try:
            slots.acquire_nowait()
            return True
        except anyio.WouldBlock:
            pass
        if self.waiting >= self.max_in_flight:
            return False
        self.waiting += 1
        try:
            with anyio.move_on_after(QUEUE_WAIT_S):
                await slots.acquire()
                return True
            return False
        finally:
            self.waiting -= 1

    async def _limited(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        too_large = RequestTooLarge(
            f"the request body is larger than httpMaxRequestBytes={self.max_body_bytes} bytes")
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await _refuse(scope, receive, send, too_large)
            return
        if declared == 0 or (declared is None and not _chunked(scope)):
            await self.app(scope, receive, send)
            return
        # Read the whole body here (it is bounded), then hand it to the app in one message.
        chunks: list[bytes] = []
        size = 0
        with anyio.move_on_after(self.body_timeout_s) as waited:
            while True:
                message = await receive()
                if message["type"] != "http.request":  # the client went away
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_body_bytes:
                    await _refuse(scope, receive, send, too_large)
                    return
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        if waited.cancelled_caught:
            await _refuse(scope, receive, send, RequestTimeout(
                f"the request body did not arrive within httpRequestBodyTimeoutSeconds={self.body_timeout_s:g}"))
            return
        await self.app(scope, _replay(b"".join(chunks), receive), send)


def _header(scope: MutableMapping[str, Any], name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value)
    return None


async def _no_body() -> Message:
    return {"type": "http.disconnect"}


def _content_length(scope: MutableMapping[str, Any]) -> int | None:
    raw = _header(scope, b"content-length")
    try:
        return None if raw is None else int(raw)
    except ValueError:
        return None  # the HTTP parser has refused it already


def _chunked(scope: MutableMapping[str, Any]) -> bool:
    return b"chunked" in (_header(scope, b"transfer-encoding") or b"").lower()


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` once, then whatever the connection says (a disconnect)."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _refuse(scope: MutableMapping[str, Any], receive: Receive, send: Send, error: CompactordError,
                  retry_after: int | None = None) -> None:
    response = error_response(error)
    response.headers["Connection"] = "close"  # the request's body may be unread: no next request on it
    if retry_after is not None:
        response.headers["Retry-After"] = str(retry_after)
    await response(scope, receive, send)


def broker_slots(size: int, wait_s: float, broker_problem: Callable[[], str | None]
                 ) -> Callable[[], AsyncIterator[None]]:
    """A FastAPI dependency for the routes that call the broker: at most ``size`` of them at once, so that
    a hung broker holds ``size`` threads of the pool and no more. It runs on the event loop, before the
    route takes a thread: a request that finds the broker known to be down, or no slot free within
    ``wait_s``, is answered 503 broker_unavailable at once."""
    slots: anyio.Semaphore | None = None  # made on the event loop, at the first request

    async def broker_slot() -> AsyncIterator[None]:
        nonlocal slots
        problem = broker_problem()
        if problem:
            raise BrokerUnavailable(problem)
        if slots is None:
            slots = anyio.Semaphore(size)
        if not await _acquire_within(slots, wait_s):
            raise BrokerUnavailable(
                f"{size} requests to the broker are under way already and none ended within {wait_s:g}s")
        try:
            yield
        finally:
            slots.release()

    return broker_slot


def refused_while(problem: Callable[[], str | None], **error: bool) -> Callable[[], Awaitable[None]]:
    """A FastAPI dependency that answers 503 storage_unavailable at once, on the event loop, while ``problem``
    names one, rather than waiting out the store's read budget in a thread of the pool or starting a run that
    could not switch. For the routes that need the ledger root's store (the ledger reads, the run history, a
    trigger) ``problem`` is ``Health.store_problem``; for a trigger it is also ``Health.lease_problem`` (fixed
    phrases and numbers), refused with ``public=True, lease=True``: no failure of the store, since the lease's
    renewals log theirs."""

    async def refuse_on_problem() -> None:
        found = problem()
        if found:
            raise StorageUnavailable(found, **error)

    return refuse_on_problem


async def _acquire_within(slots: anyio.Semaphore, wait_s: float) -> bool:
    """Take a slot of ``slots``, waiting at most ``wait_s``; False if none came free in time."""
    with anyio.move_on_after(wait_s):
        await slots.acquire()
        return True
    return False


def read_slots(size: int = READ_SLOTS, wait_s: float = READ_SLOT_WAIT_S) -> Callable[[], AsyncIterator[None]]:
    """A FastAPI dependency for the ledger reads: at most ``size`` of them read and render at once; the
    others wait on the event loop (holding no thread) in arrival order, and one that waits ``wait_s``
    in vain is answered 503 server_busy. Their number is bounded by httpMaxConnections."""
    slots: anyio.Semaphore | None = None  # made on the event loop, at the first request

    async def read_slot() -> AsyncIterator[None]:
        nonlocal slots
        if slots is None:
            slots = anyio.Semaphore(size)
        if not await _acquire_within(slots, wait_s):
            raise ServerBusy(f"{size} ledger reads are under way and others wait already; none began within "
                             f"{wait_s:g}s; retry later")
        try:
            yield
        finally:
            slots.release()

    return read_slot
