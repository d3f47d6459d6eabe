"""A disk that fails under a running compaction: the task fails, the previous ledger and horizon stay
current, nothing of the new ledger is left behind, and the task's slot is free for the next one
(real broker, real Spark; the full disk is a real, small tmpfs)."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compactord.daemon.scheduler import TaskRegistry
from compactord.errors import InsufficientDiskSpace
from compactord.ledger.store import CURRENT
from compactord.task import TaskState
from tests.support.disks import tmpfs
from tests.support.service import compact, ledger_dirs, view
from tests.support.timeouts import TASK_TIMEOUT_S
from tests.support.waiting import wait_for

TMPFS_SIZE = "2m"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, mounted for the test and unmounted after it."""
    with tmpfs(tmp_path / "small-disk", TMPFS_SIZE) as mount_point:
        yield mount_point


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def snapshot(service: Any) -> tuple[Any, ...]:
    return service.ledger_info().ledger_id, service.ledger_info().horizon, view(service)


def test_a_full_disk_while_writing_fails_the_task_keeps_the_ledger_and_frees_the_slot(
    kafka: Any, make_factory: Any, small_disk: Path
) -> None:
    topic, other = kafka.topic(), kafka.topic()
    kafka.produce(topic, [("a", "1"), ("b", "2")])
    kafka.produce(other, [("x", "1")])
    factory = make_factory(root=small_disk / "ledgers")
    registry = TaskRegistry(factory, 1, 60.0, release_after_s=TASK_TIMEOUT_S)
    service = factory.new_topic_compaction_service(topic)
    compact(service)
    before = snapshot(service)
    # ~4 MiB that does not compress (distinct keys, random values): the new ledger cannot fit in 2 MiB
    kafka.produce(topic, [(f"big-{i}", os.urandom(16 * 1024).hex()) for i in range(128)])

    ctx = registry.trigger(topic)
    assert ctx.result(TASK_TIMEOUT_S) is TaskState.FAILED, ctx.error
    assert ctx.worker_done.wait(TASK_TIMEOUT_S)
    assert ctx.error_type == InsufficientDiskSpace.code, ctx.error  # 507, not a generic Spark failure
    assert snapshot(service) == before
    assert ledger_dirs(factory.store.root, topic) == [f"ledger-{before[0]}"]  # the partial one is gone
    factory.store.verify(topic, before[0])

    wait_for(lambda: registry.running_count() == 0, TASK_TIMEOUT_S, "the failed task's slot to be freed")
    # the failed writer's file is deleted; the space must come back, not stay held by an open handle
    wait_for(lambda: free_bytes(small_disk) > 1024 * 1024, TASK_TIMEOUT_S, "the failed ledger's space to be freed")
    nxt = registry.trigger(other)  # the one slot serves the next task
    assert nxt.result(TASK_TIMEOUT_S) is TaskState.SUCCEED, nxt.error
    registry.shutdown(timeout=30)


def test_an_io_error_while_switching_fails_the_task_and_keeps_the_ledger(
    kafka: Any, make_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import compactord.storage.local as local_store

    topic = kafka.topic()
    kafka.produce(topic, [("a", "1"), ("b", "2")])
    factory = make_factory()
    registry = TaskRegistry(factory, 1, 60.0, release_after_s=TASK_TIMEOUT_S)
    service = factory.new_topic_compaction_service(topic)
    compact(service)
    before = snapshot(service)
    kafka.produce(topic, [("a", "3")])

    real = local_store.write_durable

    def failing(path: Path, data: bytes) -> None:  # the pointer's new version, written beside it
        if CURRENT in path.name:
            raise OSError(errno.EIO, "Input/output error", str(path))
        real(path, data)

    monkeypatch.setattr(local_store, "write_durable", failing)
    ctx = registry.trigger(topic)
    assert ctx.result(TASK_TIMEOUT_S) is TaskState.FAILED
    assert ctx.worker_done.wait(TASK_TIMEOUT_S)
    assert "Input/output error" in (ctx.error or "")
    assert snapshot(service) == before
    assert ledger_dirs(factory.store.root, topic) == [f"ledger-{before[0]}"]
    wait_for(lambda: registry.running_count() == 0, TASK_TIMEOUT_S, "the failed task's slot to be freed")

    monkeypatch.undo()
    assert registry.trigger(topic).result(TASK_TIMEOUT_S) is TaskState.SUCCEED
    assert view(service) == {b"a": b"3", b"b": b"2"}
    registry.shutdown(timeout=30)
