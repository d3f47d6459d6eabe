"""What a task's error says to the read token: what failed, in the error tree's terms, never the store's
endpoint, bucket and keys or an exception's own text (those stay in the log and for the admin token).
The guard marks a request of the read token (``api.views.READER``), also in the thread that renders it."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from compactord.api.auth import ApiGuard
from compactord.api.views import READER, task_status
from compactord.errors import StorageUnavailable, TopicRecreated
from compactord.task import CompactionTaskCtx, TaskState

INTERNALS = "s3://ledgers/trial at http://127.0.0.1:8333: PUT 'trial/t/ledger-3/part-0.parquet' failed (SlowDown)"


def failed(error: BaseException | str) -> CompactionTaskCtx:
    ctx = CompactionTaskCtx("t")
    ctx.transition(TaskState.FAILED, error=error)
    return ctx


def as_reader(ctx: CompactionTaskCtx) -> dict[str, Any]:
    answering = READER.set(True)
    try:
        return task_status(ctx)
    finally:
        READER.reset(answering)


def test_the_read_token_sees_what_failed_not_the_store_s_details() -> None:
    ctx = failed(StorageUnavailable(INTERNALS))
    assert task_status(ctx)["last_error"] == INTERNALS  # the admin token: whole
    told = as_reader(ctx)["last_error"]
    assert "store does not answer" in told and "8333" not in told and "ledgers" not in told, told
    raw = as_reader(failed(OverflowError(f"int too large: {INTERNALS}")))["last_error"]
    assert "8333" not in raw and "OverflowError" not in raw, raw


def test_an_error_about_the_request_s_topic_is_told_as_it_is() -> None:
    ctx = failed(TopicRecreated("t", "its topic id changed"))
    assert as_reader(ctx)["last_error"] == task_status(ctx)["last_error"]


def test_the_guard_marks_the_read_token_s_requests_also_in_the_render_thread() -> None:
    async def who(request: Request) -> JSONResponse:
        return JSONResponse({"reader": await run_in_threadpool(READER.get)})

    app = ApiGuard(Starlette(routes=[Route("/v1/tasks", who)]), token=b"admin", read_token=b"read",
                   loopback=True, allowed_hosts=())

    async def ask(token: str) -> bool:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            answer = await client.get("/v1/tasks", headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 200, answer.text
        return bool(answer.json()["reader"])

    assert asyncio.run(ask("read")) is True
    assert asyncio.run(ask("admin")) is False
    assert READER.get() is False
