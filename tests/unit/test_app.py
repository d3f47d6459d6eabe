"""The API app: no request handler can end the process."""

from __future__ import annotations

import asyncio
import inspect
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from compactord.api.app import create_app, handler_cannot_exit
from compactord.config import Settings
from compactord.daemon.metrics import Metrics
from compactord.errors import CompactionAlreadyRunning, Fenced, LedgerRootLocked


def test_a_handler_that_raises_system_exit_raises_an_exception_instead() -> None:
    def route(topic: str, limit: int = 3) -> dict[str, Any]:
        raise SystemExit(3)

    guarded = handler_cannot_exit(route)
    assert inspect.signature(guarded) == inspect.signature(route)  # FastAPI reads the parameters from it
    with pytest.raises(Exception) as raised:
        guarded("t")
    assert isinstance(raised.value.__cause__, SystemExit)


@pytest.mark.parametrize("kind", [KeyboardInterrupt, GeneratorExit, ValueError])
def test_other_exceptions_pass_unchanged(kind: type[BaseException]) -> None:
    def route() -> None:
        raise kind()

    with pytest.raises(kind):
        handler_cannot_exit(route)()


def stand_in(registry: Any) -> Any:
    """The daemon as the app sees it, with ``registry``; nothing else of it answers but its metrics."""
    health = SimpleNamespace(broker_problem=lambda: None, store_problem=lambda: None, lease_problem=lambda: None)
    return SimpleNamespace(settings=Settings(), registry=registry, metrics=Metrics(), health=health, cluster=None)


def get_tasks(daemon: Any) -> httpx.Response:
    """``GET /v1/tasks`` of the app built for ``daemon``, in this process."""
    app = create_app(daemon)

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await client.get("/v1/tasks")

    return asyncio.run(get())


class _ExitingRegistry:
    def tasks(self) -> list[Any]:
        raise SystemExit(3)


def test_the_app_answers_500_when_a_route_raises_system_exit() -> None:
    # The daemon is a stand-in whose registry raises SystemExit (no I/O of its own is involved).
    response = get_tasks(stand_in(_ExitingRegistry()))
    assert response.status_code == 500, response.text
    # a fixed text: what went wrong (the SystemExit) is in the log, not in the answer
    assert response.json()["error"] == "internal_error" and "SystemExit" not in response.json()["message"]


class _RefusingRegistry:
    """A registry whose listing raises ``error`` (no I/O of its own is involved)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def tasks(self) -> list[Any]:
        raise self.error

    def live(self, topic: str) -> None:
        return None


@pytest.mark.parametrize(("error", "carries"), [
    (Fenced("the topic's pointer changed since the task read it"), False),
    (LedgerRootLocked("another daemon holds the ledger root"), False),
    (CompactionAlreadyRunning("t"), True),
])
def test_only_a_task_in_the_way_is_answered_with_its_task(error: Exception, carries: bool) -> None:
    response = get_tasks(stand_in(_RefusingRegistry(error)))
    assert response.status_code == 409, response.text
    assert ("task" in response.json()) is carries, response.text
