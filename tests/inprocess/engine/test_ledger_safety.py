"""The compacted ledger store keeps the served view safe: corruption, orphans, the root's lock, reads
during switches, a full disk and a topic recreated under the ledger (real broker, real Spark)."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from typing import Any

import pytest

from compactord.errors import InsufficientDiskSpace, LedgerCorrupt, LedgerRootLocked
from compactord.ledger.store import LedgerStore
from compactord.model import Position
from compactord.task import TaskState
from tests.support.probes import Hold
from tests.support.service import compact, last_value_model, ledger_dirs, view
from tests.support.timeouts import TASK_TIMEOUT_S


def snapshot(service: Any) -> tuple[Any, ...]:
    return service.ledger_info().ledger_id, service.get_last_compacted_position(), view(service)


# -- a corrupt current ledger -----------------------------------------------------------------------


def damage_ledger(store: Any, topic: str, ledger_id: int, damage: str) -> None:
    """Flip a byte of the ledger's first part, or delete it, through the root's store (a folder or a bucket)."""
    manifest = store.load_manifest(topic, ledger_id)
    key = f"{store.ledger_key(topic, ledger_id)}/{manifest.files[0]['name']}"
    if damage == "flip-a-byte":
        data = bytearray(store.objects.get(key))
        data[len(data) // 2] ^= 0xFF
        store.objects.put(key, bytes(data))
    else:
        store.objects.delete(key)


def not_served_then_rebuilt(service: Any, corrupt_id: int, records: list[tuple[str, str]], caplog: Any) -> Any:
    """A service whose current ledger ``corrupt_id`` is corrupt: its reads fail loudly (500 ledger_corrupt, an
    ERROR line), and its next run rebuilds the view of ``records`` in full; return that run's task."""
    with caplog.at_level(logging.WARNING, logger="compactord"):
        with pytest.raises(LedgerCorrupt, match=f"ledger {corrupt_id} of topic") as caught:
            service.read_compacted_entries(Position(0, 0), 10)
        assert caught.value.code == "ledger_corrupt" and caught.value.status == 500
        with pytest.raises(LedgerCorrupt):
            service.read_last_compacted_entry(0)
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR and "not served" in r.getMessage()]
        assert errors, "the corrupt ledger was not reported loudly"

        ctx = compact(service)
    assert ctx.stats.full_rebuild is True
    assert ctx.stats.records_read == len(records)
    assert any("full rebuild" in r.getMessage() and "corrupt" in r.getMessage() for r in caplog.records)
    assert service.ledger_info().ledger_id == ctx.ledger_id != corrupt_id
    assert view(service) == last_value_model(records)
    return ctx


@pytest.mark.parametrize("damage", ["flip-a-byte", "delete-the-file"])
def test_corrupt_ledger_is_not_served_and_the_next_run_rebuilds_it(kafka, make_factory, caplog, damage):
    topic = kafka.topic()
    records = [(f"k{i % 8}", f"v{i}") for i in range(50)]
    kafka.produce(topic, records)
    factory = make_factory()
    corrupt_id = compact(factory.new_topic_compaction_service(topic)).ledger_id
    damage_ledger(factory.store, topic, corrupt_id, damage)

    # The next start (a new service on the same root) verifies the ledger before serving it.
    service = make_factory(store=factory.store).new_topic_compaction_service(topic)
    ctx = not_served_then_rebuilt(service, corrupt_id, records, caplog)
    # the rebuilt ledger replaced the corrupt one, which is gone
    assert ledger_dirs(factory.store.root, topic) == [f"ledger-{ctx.ledger_id}"]


@pytest.mark.parametrize("damage", ["flip-a-byte", "delete-the-file"])
def test_ledger_damaged_after_it_was_loaded_is_rebuilt_not_built_upon(kafka, make_factory, caplog, damage):
    """The running daemon already serves the ledger when its files go bad: the next run checks them
    again before it reads the ledger as the base of an incremental run, and rebuilds instead."""
    topic = kafka.topic()
    first = [(f"k{i % 8}", f"v{i}") for i in range(50)]
    kafka.produce(topic, first)
    factory = make_factory()
    service = factory.new_topic_compaction_service(topic)
    corrupt_id = compact(service).ledger_id
    assert view(service) == last_value_model(first)  # loaded and served
    damage_ledger(factory.store, topic, corrupt_id, damage)
    second = [("k1", "new"), ("z", "new")]
    kafka.produce(topic, second)

    with caplog.at_level(logging.WARNING, logger="compactord"):
        ctx = service.compact()
        assert ctx.result(TASK_TIMEOUT_S) is TaskState.SUCCEED, ctx.error
    assert ctx.stats.full_rebuild is True
    assert ctx.stats.records_read == len(first) + len(second)
    assert any(r.levelno >= logging.ERROR and "not served" in r.getMessage() for r in caplog.records)
    assert view(service) == last_value_model(first + second)
    assert ledger_dirs(factory.store.root, topic) == [f"ledger-{ctx.ledger_id}"]


# -- orphans and the root's lock --------------------------------------------------------------------


def test_orphans_are_removed_when_the_root_is_opened_and_the_topic_first_used(kafka, make_factory, tmp_path):
    topic = kafka.topic()
    records = [("a", "1"), ("b", "2"), ("a", "3")]
    kafka.produce(topic, records)
    root = tmp_path / "root"
    first = make_factory(root=root)
    current = compact(first.new_topic_compaction_service(topic)).ledger_id
    first.close()  # the daemon stops (or dies): the lock is free

    topic_dir = root / topic
    (topic_dir / "ledger-99").mkdir()
    (topic_dir / "ledger-99" / "part-00000.parquet").write_bytes(b"half written")
    (topic_dir / "CURRENT.tmp").write_text("ledger-99\n")
    (topic_dir / f"ledger-{current}" / "manifest.json.tmp").write_text("{")
    (root / "@compactord" / "ledger-seq.tmp").write_text("7")
    stale_progress = root / "@compactord" / "progress" / "dead-task"
    stale_progress.mkdir(parents=True)
    (stale_progress / "0-0.json").write_text("{}")

    second = make_factory(root=root)  # a new factory opens its own store: the next start
    # the root's own leftovers go when it is opened
    assert not (root / "@compactord" / "ledger-seq.tmp").exists()
    assert not stale_progress.exists()
    # a topic's, when it is first used (or the paced recovery pass reaches it): before anything of it is read
    service = second.new_topic_compaction_service(topic)
    assert service.ledger_info().ledger_id == current
    assert sorted(os.listdir(topic_dir)) == ["CURRENT", f"ledger-{current}"]
    assert "manifest.json.tmp" not in os.listdir(topic_dir / f"ledger-{current}")
    assert view(service) == last_value_model(records)
    kafka.produce(topic, [("c", "4")])
    assert compact(service).ledger_id > current


def test_a_second_store_on_an_open_root_is_refused(make_factory, tmp_path):
    root = tmp_path / "locked"
    factory = make_factory(root=root)
    with pytest.raises(LedgerRootLocked, match=f"pid {os.getpid()}"):
        LedgerStore(root).open()
    with pytest.raises(LedgerRootLocked):
        make_factory(root=root)  # a second daemon on the same root does not start
    factory.close()
    with LedgerStore(root) as again:  # free once the holder has closed it
        assert again.is_open


# -- two writers of one topic ----------------------------------------------------------------------


def test_a_run_whose_switch_lost_is_fenced_and_changes_nothing(kafka, make_factory):
    topic = kafka.topic()
    kafka.produce(topic, [("a", "1"), ("b", "2")])
    hold = Hold("written")  # the first writer's ledger is sealed; its switch waits
    slow = make_factory(probe=hold, compaction_retired_ledger_grace_seconds=600)
    # A second writer of the same root and topic.
    fast = make_factory(store=slow.store, compaction_retired_ledger_grace_seconds=600)
    first = compact(fast.new_topic_compaction_service(topic)).ledger_id
    kafka.produce(topic, [("a", "3")])
    ctx = slow.new_topic_compaction_service(topic).compact()
    try:
        assert hold.reached.wait(TASK_TIMEOUT_S)
        kafka.produce(topic, [("c", "5")])
        winner = compact(fast.new_topic_compaction_service(topic))
        assert winner.ledger_id > first
    finally:
        hold.release()
        ctx.worker_done.wait(TASK_TIMEOUT_S)
    assert ctx.state is TaskState.FAILED and ctx.error_type == "fenced", ctx.error
    store = slow.store
    assert store.current_ledger_id(topic) == winner.ledger_id  # the view is the winner's
    assert [r.id for r in store.pointer(topic).retired] == [first]
    assert ledger_dirs(store.root, topic) == sorted([f"ledger-{first}", f"ledger-{winner.ledger_id}"])
    assert view(fast.new_topic_compaction_service(topic)) == {b"a": b"3", b"b": b"2", b"c": b"5"}


# -- reads while ledgers switch ---------------------------------------------------------------------


def test_reads_during_switches_see_the_old_or_the_new_ledger_whole(kafka, make_factory):
    topic = kafka.topic()
    rounds = [[(f"k{i}", f"r{r}-{i}" if (i + r) % 7 else None) for i in range(40)] for r in range(5)]
    views = [last_value_model([rec for batch in rounds[: r + 1] for rec in batch]) for r in range(5)]
    assert len({tuple(sorted(v.items())) for v in views}) == 5

    kafka.produce(topic, rounds[0])
    factory = make_factory()
    service = factory.new_topic_compaction_service(topic)
    compact(service)
    stop = threading.Event()
    seen: list[int] = []
    problems: list[str] = []

    def read_loop() -> None:
        while not stop.is_set():
            try:
                got = {e.key: e.value for e in service.read_compacted_entries(Position(0, 0), 10_000)}
                last = service.read_last_compacted_entry(0)
            except Exception as exc:  # noqa: BLE001 - any exception is a failure of the test
                problems.append(f"{type(exc).__name__}: {exc}")
                continue
            if got not in views:
                problems.append(f"a read saw neither ledger: {sorted(got.items())[:5]}...")
                continue
            seen.append(views.index(got))
            if last is None or not any(v.get(last.key) == last.value for v in views):
                problems.append(f"last entry {last} is of no ledger")

    readers = [threading.Thread(target=read_loop, daemon=True) for _ in range(3)]
    for t in readers:
        t.start()
    try:
        for batch in rounds[1:]:
            kafka.produce(topic, batch)
            compact(service)
            time.sleep(0.2)
    finally:
        stop.set()
        for t in readers:
            t.join(30)
    assert not problems, problems[:5]
    assert len(set(seen)) >= 3, f"the readers saw too few ledgers: {sorted(set(seen))}"
    assert seen and max(seen) == 4
    assert view(service) == views[-1]
    assert len(ledger_dirs(factory.store.root, topic)) == 1


# -- a full disk ------------------------------------------------------------------------------------


def test_insufficient_disk_space_fails_the_task_and_keeps_the_ledger(kafka, make_factory, monkeypatch):
    topic = kafka.topic()
    kafka.produce(topic, [("a", "1"), ("b", "2")])
    factory = make_factory()
    service = factory.new_topic_compaction_service(topic)
    compact(service)
    before = snapshot(service)
    kafka.produce(topic, [("a", "3")])

    real = shutil.disk_usage

    def nearly_full(path: Any) -> Any:  # the OS reports a nearly full file system
        usage = real(path)
        return type(usage)(usage.total, usage.total - 10, 10)

    monkeypatch.setattr("compactord.storage.local.shutil.disk_usage", nearly_full)
    ctx = service.compact()
    assert ctx.result(TASK_TIMEOUT_S) is TaskState.FAILED
    assert ctx.worker_done.wait(TASK_TIMEOUT_S)
    assert ctx.error_type == InsufficientDiskSpace.code
    assert "10 bytes free" in ctx.error
    assert snapshot(service) == before
    assert ledger_dirs(factory.store.root, topic) == [f"ledger-{before[0]}"]

    monkeypatch.undo()
    compact(service)
    assert view(service) == {b"a": b"3", b"b": b"2"}


# -- a topic recreated under its ledger -------------------------------------------------------------


def recreate_topic(kafka: Any, topic: str, partitions: int) -> None:
    """Delete the topic and create it again (Tansu 0.6 supports both)."""
    from kafka.admin import NewTopic

    kafka.admin.delete_topics([topic])
    # The engine's clients know the topic; none of them may bring it back by auto-creation (its
    # long-lived consumer did: Tansu auto-creates even when asked not to).
    time.sleep(1.5)
    assert topic not in kafka.admin.list_topics(), "the deleted topic was re-created"
    kafka.admin.create_topics([NewTopic(topic, partitions, 1)])


def test_topic_recreated_with_fewer_records_forces_a_full_rebuild(kafka, make_factory, caplog):
    topic = kafka.topic(partitions=2)
    first = [(f"k{i}", f"old{i}", i % 2) for i in range(20)]
    kafka.produce(topic, first)
    service = make_factory().new_topic_compaction_service(topic)
    compact(service)
    assert service.get_last_compacted_position() == {0: 9, 1: 9}

    recreate_topic(kafka, topic, 2)
    second = [("k0", "new0", 0), ("x", "new1", 0), ("k1", "new2", 1)]
    kafka.produce(topic, second)
    with caplog.at_level(logging.WARNING, logger="compactord"):
        ctx = compact(service)
    assert ctx.stats.full_rebuild is True
    assert ctx.stats.records_read == 3
    rebuild_logs = [r.getMessage() for r in caplog.records if "full rebuild" in r.getMessage()]
    assert rebuild_logs and "recreated" in rebuild_logs[0] and ctx.stats.recreated
    # The offsets restarted: the horizon follows the new log (the one case where it goes down).
    assert service.get_last_compacted_position() == {0: 1, 1: 0}
    assert view(service, 2) == last_value_model(second)


def test_the_current_ledger_is_found_though_a_switch_deleted_the_one_the_pointer_named_when_read(
        kafka, make_factory, monkeypatch):
    # A read asks which ledger is current, then loads its manifest; a switch in between (this daemon's, or the
    # owner's in a cluster) deletes the replaced ledger once no read holds it. The read finds the new one.
    topic = kafka.topic()
    kafka.produce(topic, [("k", "v1")])
    factory = make_factory()
    service = factory.new_topic_compaction_service(topic)
    first = compact(service).ledger_id
    kafka.produce(topic, [("k", "v2")])
    second = compact(service).ledger_id
    assert first != second and len(ledger_dirs(factory.store.root, topic)) == 1  # the first ledger is gone
    store = factory.store
    pointed = iter([first])  # the pointer as read just before the switch
    real = store.current_ledger_id
    monkeypatch.setattr(store, "current_ledger_id", lambda t: next(pointed, None) or real(t))
    monkeypatch.setattr(type(store), "sole_writer", property(lambda self: False))  # no ledger handle kept: read it
    assert service.ledger_info().ledger_id == second
