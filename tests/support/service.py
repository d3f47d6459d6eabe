"""A compaction service in the test process (the in-process tiers, and the local-mode reference of
the cluster test): run a compaction to its end, read the compacted view, list ledgers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compactord.model import Entry, Position
from compactord.task import CompactionTaskCtx, TaskState
from tests.support.timeouts import TASK_TIMEOUT_S

__all__ = ["compact", "entries", "last_value_model", "ledger_dirs", "pinned", "succeeded", "view"]


def succeeded(ctx: CompactionTaskCtx) -> CompactionTaskCtx:
    """Wait for the task to end and insist that it succeeded and its worker has stopped."""
    state = ctx.result(TASK_TIMEOUT_S)
    assert state is TaskState.SUCCEED, f"task ended {state.value}: {ctx.error}"
    assert ctx.worker_done.wait(TASK_TIMEOUT_S)
    return ctx


def compact(service: Any, **kwargs: Any) -> CompactionTaskCtx:
    """Run a compaction of ``service`` to its end and insist that it succeeded."""
    return succeeded(service.compact(**kwargs))


def entries(service: Any, partition: int = 0) -> list[Entry]:
    """Every live entry of a partition, read page by page through the read API."""
    out: list[Entry] = []
    start = 0
    while True:
        page = service.read_compacted_entries(Position(partition, start), 7)
        out.extend(page)
        if len(page) < 7:
            return out
        start = page[-1].offset + 1


def pinned(service: Any, partition: int, ledger_id: int) -> list[Entry]:
    """Every live entry of a partition of ledger ``ledger_id`` (a read pinned to it, a retired one too)."""
    out: list[Entry] = []
    start = 0
    while page := service.read_compacted_page(Position(partition, start), 5, ledger_id=ledger_id).entries:
        out.extend(page)
        start = page[-1].offset + 1
    return out


def view(service: Any, partitions: int = 1) -> dict[bytes | None, bytes | None]:
    """key -> value of the compacted view (keys must be unique across partitions)."""
    result: dict[bytes | None, bytes | None] = {}
    for p in range(partitions):
        for e in entries(service, p):
            assert e.key not in result or e.key is None, f"key {e.key!r} twice"
            result[e.key] = e.value
    return result


def last_value_model(records: list[tuple[Any, ...]], empty_deletes: bool = False) -> dict[bytes, bytes]:
    """Reference: the last value per key. Kafka's rule: a null value deletes, an empty one is a value
    (``empty_deletes``: Pulsar's rule, ``compactionEmptyValueIsTombstone``)."""
    model: dict[bytes, bytes] = {}
    for key, value, *_ in records:
        key = key.encode() if isinstance(key, str) else key
        value = value.encode() if isinstance(value, str) else value
        if key is None:
            continue
        if value is None or (empty_deletes and value == b""):
            model.pop(key, None)
        else:
            model[key] = value
    return model


def ledger_dirs(root: Path, topic: str) -> list[str]:
    """The topic's ledger folders under the ledger root ``root``, by name."""
    topic_dir = root / topic
    if not topic_dir.is_dir():
        return []
    return sorted(p.name for p in topic_dir.iterdir() if p.name.startswith("ledger-"))
