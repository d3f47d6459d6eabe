"""The request bounds of the HTTP API as ASGI parts, driven on a real event loop: a request past
httpMaxConnections waits for one in flight to end rather than being refused at once; past the waiting
room, or after the wait, it is 503 server_busy. The ledger reads' slots: the same, with their own bound.
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

import anyio

from compactord.api.limits import QUEUE_WAIT_S, RequestLimitsMiddleware, read_slots
from compactord.errors import ServerBusy


def scope(path: str = "/v1/tasks") -> dict[str, Any]:
    return {"type": "http", "method": "GET", "path": path, "headers": [], "query_string": b""}


async def call(app: Any, path: str = "/v1/tasks") -> tuple[int, dict[str, Any] | None]:
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    await app(scope(path), receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body) if body else None


class Gated:
    """An app whose requests stay in flight until ``release`` is set."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.entered = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.entered += 1
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def middleware(app: Any, max_in_flight: int) -> RequestLimitsMiddleware:
    return RequestLimitsMiddleware(app, max_in_flight=max_in_flight, max_body_bytes=100, body_timeout_s=5)


def test_a_request_past_the_bound_waits_for_a_slot_instead_of_503() -> None:
    async def main() -> list[int]:
        inner = Gated()
        limited = middleware(inner, 1)
        statuses: list[int] = []

        async def one() -> None:
            statuses.append((await call(limited))[0])

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(one)  # past the bound: it waits
            await anyio.wait_all_tasks_blocked()
            assert inner.entered == 1 and limited.waiting == 1
            await anyio.sleep(QUEUE_WAIT_S / 10)
            inner.release.set()  # the first ends well within the wait: the second is served
        return statuses

    assert anyio.run(main) == [200, 200]


def test_past_the_waiting_room_or_the_wait_it_is_503_server_busy() -> None:
    async def main() -> list[tuple[int, Any]]:
        inner = Gated()
        limited = middleware(inner, 1)
        answers: list[tuple[int, Any]] = []

        async def one() -> None:
            answers.append(await call(limited))

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)  # in flight
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(one)  # waits
            await anyio.wait_all_tasks_blocked()
            answers.append(await call(limited))  # the waiting room (as large as the bound) is full: at once
            await anyio.sleep(QUEUE_WAIT_S * 1.5)  # the waiting one gives up
            assert [a[0] for a in answers] == [503, 503]
            inner.release.set()
        return answers

    answers = anyio.run(main)
    assert [a[0] for a in answers] == [503, 503, 200]  # the full room, the wait given up, the first
    assert {a[1]["error"] for a in answers[:2]} == {"server_busy"}  # type: ignore[index]
    assert "httpMaxConnections=1" in answers[0][1]["message"]  # type: ignore[index]


def test_read_slots_bound_the_reads_and_the_wait() -> None:
    async def main() -> list[str]:
        slot = read_slots(size=1, wait_s=0.5)
        events: list[str] = []
        held = anyio.Event()
        release = anyio.Event()

        async def reader(name: str) -> None:
            try:
                async for _ in slot():  # type: ignore[attr-defined]
                    events.append(f"{name} reads")
                    held.set()
                    await release.wait()
            except ServerBusy:
                events.append(f"{name} busy")

        async with anyio.create_task_group() as tg:
            tg.start_soon(reader, "first")
            await held.wait()
            await reader("second")  # no slot within 0.5 s
            tg.start_soon(reader, "third")
            await anyio.wait_all_tasks_blocked()
            release.set()  # the first gives its slot back: the third, waiting, reads
        return events

    assert anyio.run(main) == ["first reads", "second busy", "third reads"]
