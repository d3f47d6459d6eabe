"""The API's models (``compactord/api/models.py``): they name every key the views build and nothing more,
the task's state is the real ``TaskState``, and the OpenAPI document generated from them describes each
route's errors as the error tree has them. The bodies of a running daemon are checked against the same
models in ``tests/daemon/test_api_models.py``."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from compactord.api import models
from compactord.api.app import create_app
from compactord.api.schema import error_classes
from compactord.api.views import entry_json, horizon_json, page_json, task_status, tasks_json
from compactord.daemon.health import Readiness
from compactord.errors import CompactionAlreadyRunning, TaskNotCancellable
from compactord.model import TOPIC_PATTERN, Entry, LedgerManifest, StrategySettings
from compactord.task import CompactionTaskCtx, TaskState

from .test_app import _RefusingRegistry, stand_in


def _get(app: Any, path: str) -> httpx.Response:
    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await client.get(path)

    return asyncio.run(get())


def _document() -> dict[str, Any]:
    document: dict[str, Any] = _get(create_app(stand_in(None)), "/openapi.json").json()
    return document


def test_a_task_in_every_state_is_its_model_and_state_is_the_real_enum() -> None:
    state = models.Task.model_fields["state"].annotation
    assert [s.value for s in state.__args__[0]] == [s.value for s in TaskState]  # type: ignore[union-attr]
    for state in TaskState:
        ctx = CompactionTaskCtx("orders")
        ctx._state = state  # every state, without the transitions that lead to it
        body = task_status(ctx)
        assert models.Task.model_validate(body).state is state
    models.TaskList.model_validate(tasks_json([CompactionTaskCtx("a"), CompactionTaskCtx("b")]))


def test_a_key_the_model_lacks_or_a_wrong_value_fails() -> None:
    body = task_status(CompactionTaskCtx("orders"))
    with pytest.raises(ValidationError, match="surprise"):
        models.Task.model_validate({**body, "surprise": 1})
    with pytest.raises(ValidationError, match="state"):
        models.Task.model_validate({**body, "state": "Sleeping"})
    with pytest.raises(ValidationError, match="status"):
        models.Task.model_validate({**body, "status": "DONE"})
    missing = dict(body)
    del missing["warnings"]
    with pytest.raises(ValidationError, match="warnings"):
        models.Task.model_validate(missing)


def test_the_read_bodies_are_their_models() -> None:
    manifest = LedgerManifest(7, "t", {0: 9, 1: -1}, StrategySettings(), [], topic_id="id", log_start={0: 2})
    entries = [Entry(0, 3, b"k", b"v", 1_700_000_000_000, (("h", b"\x00"),)), Entry(0, 4, None, None, 5)]
    for markers in (False, True):
        page = page_json("t", manifest, entries, "base64", markers, next_start=5)
        assert models.Page.model_validate(page).model_dump(exclude_unset=True) == page
    assert models.Entry.model_validate(entry_json(entries[0], "utf8")).key == "k"
    assert models.Horizon.model_validate(horizon_json("t", manifest)).rules.key_ttl_ms == 0


def test_a_number_keeps_its_kind() -> None:
    # The answer a dict gets through its model is the dict: a whole number stays whole.
    values = {"thresholdBytes": None, "thresholdMessages": None, "maxLagSeconds": None, "minDirtyRatio": 1,
              "strategy": None, "keyTtlMs": None, "maxReadBytesPerSecond": None}
    assert models.PolicyValues.model_validate(values).model_dump_json().count('"minDirtyRatio":1,') == 1


def test_the_document_is_generated_from_the_models() -> None:
    document = _document()
    schemas = document["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas
    assert schemas["TaskState"]["enum"] == [s.value for s in TaskState]
    task = schemas["Task"]
    assert set(task["properties"]) == set(task["required"]) == set(task_status(CompactionTaskCtx("t")))
    assert task["properties"]["status"]["enum"] == ["NOT_RUN", "RUNNING", "SUCCESS", "ERROR"]
    assert task["additionalProperties"] is False
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            params = [p for p in operation.get("parameters", []) if (p["name"], p["in"]) == ("topic", "path")]
            assert ("{topic}" in path) == bool(params), (method, path)
            assert all(p["schema"]["pattern"] == TOPIC_PATTERN for p in params)
            ok = operation["responses"].get("200") or operation["responses"]["202"]
            if path != "/metrics":
                assert ok["content"]["application/json"]["schema"]["$ref"].startswith("#/components/schemas/")


def test_each_route_documents_its_errors_from_the_error_tree() -> None:
    document = _document()
    put = document["paths"]["/v1/topics/{topic}/compaction"]["put"]["responses"]
    ref = lambda status: put[status]["content"]["application/json"]["schema"]["$ref"]  # noqa: E731
    assert (ref("202"), ref("409"), ref("404"), ref("422"), ref("503")) == tuple(
        f"#/components/schemas/{name}" for name in ("Task", "Conflict", "Error", "Error", "Error"))
    for status in ("404", "409", "422", "503"):
        codes = {cls.code for cls in error_classes() if str(cls.status) == status}
        assert codes and all(code in put[status]["description"] for code in codes), (status, codes)
    for path, operations in document["paths"].items():
        for operation in operations.values():
            if path.startswith("/v1"):
                assert {"401", "403", "404", "422", "503"} <= set(operation["responses"]), path
    reads = document["paths"]["/v1/topics/{topic}/compacted"]["get"]["responses"]
    assert {"ledger_retired", "topic_recreated"} <= set(reads["410"]["description"].split(", "))


@pytest.mark.parametrize("error", [CompactionAlreadyRunning("t"), TaskNotCancellable("switching")])
def test_a_conflict_is_its_model(error: Exception) -> None:
    response = _get(create_app(stand_in(_RefusingRegistry(error))), "/v1/tasks")
    assert response.status_code == 409
    models.Conflict.model_validate(response.json())


def test_readiness_answers_are_their_models() -> None:
    for reads, model, status in ((True, models.Readiness, 200), (False, models.Unready, 503)):
        daemon = stand_in(None)
        daemon.health.readiness = lambda reads=reads: Readiness(reads, compactions=False, problems=["no broker"])
        response = _get(create_app(daemon), "/readyz")
        assert response.status_code == status, response.text
        model.model_validate(response.json())
    healthy = stand_in(None)
    healthy.health.liveness_problem = lambda: None
    models.Health.model_validate(_get(create_app(healthy), "/healthz").json())
    assert isinstance(healthy, SimpleNamespace)
