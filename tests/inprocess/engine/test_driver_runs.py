"""A small run's reading task read in the driver (``compactionDriverRunMaxRecords``) against the same run
through a Spark job: the same ledger, row for row; a cancel or a failure in it keeps the previous ledger."""

from __future__ import annotations

import threading
from typing import Any

import pyarrow.parquet as pq
import pytest

from compactord.daemon.scheduler import TaskRegistry
from compactord.engine import kafka_source, run
from compactord.task import TaskState
from tests.support.service import compact, succeeded
from tests.support.timeouts import TASK_TIMEOUT_S

# Updated, deleted (a null value), emptied and new keys, null-key records, over 3 partitions; event times in a header.
FIRST = [(f"k{i}", f"v{i}", i % 3, None, [("et", b"%d" % (1000 + i))]) for i in range(30)] + \
    [(None, f"n{i}", i % 3, None, [("et", b"1000")]) for i in range(3)] + \
    [("k3", None, 0, None, [("et", b"2000")]), ("k4", None, 1, None, [("et", b"2000")]),
     ("k5", "", 2, None, [("et", b"2000")])]
SECOND = [("k0", "late", 0, None, [("et", b"500")]), ("k3", "too-late", 0, None, [("et", b"1500")]),
          ("k6", "newer", 0, None, [("et", b"9000")]), ("k7", None, 1, None, [("et", b"9000")]),
          ("new", "n", 1, None, [("et", b"9000")]), (None, "n-late", 0, None, [("et", b"1000")])]


def _rows(service: Any) -> list[dict[str, Any]]:
    manifest = service.ledger_info()
    path = service.factory.store.ledger_path(service.topic, manifest.ledger_id)
    rows = [row for f in sorted(manifest.files, key=lambda f: f["name"]) for row in pq.read_table(path / f["name"]).to_pylist()]
    # A marker's time is its run's start: the two services' runs start apart.
    return [{**r, "marker_at": "set" if r["marker"] else r["marker_at"]} for r in rows]


class Counted:
    """The real ``run_writing_tasks_in_driver``, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, spec: dict[str, Any]) -> None:
        self.calls += 1
        kafka_source.run_writing_tasks_in_driver(spec)


@pytest.mark.parametrize("strategy,retention", [("publishing-order", 0), ("event-time", 0),
                                                ("publishing-order", 86_400_000), ("event-time", 86_400_000),
                                                ("first-value", 86_400_000)])
def test_a_small_run_in_the_driver_writes_the_ledger_a_spark_job_writes(kafka, make_factory, monkeypatch,
                                                                       strategy, retention):
    """A full run, then an incremental one, of each strategy (tombstones kept for a while, or removed at once):
    the driver's ledger is the Spark job's, row for row. A strategy whose winners are chosen by a grouping job
    (first-value) runs in Spark whatever its size."""
    topic = kafka.topic(partitions=3)
    settings = {"compaction_strategy": strategy, "compaction_event_time_source": "header:et",
                "topic_compaction_retain_null_key": True, "compaction_tombstone_retention_ms": retention}
    kafka.produce(topic, FIRST)
    in_driver = make_factory(**settings).new_topic_compaction_service(topic)
    in_spark = make_factory(root=in_driver.factory.store.root.parent / "spark", **settings) \
        .new_topic_compaction_service(topic)
    counted = Counted()
    monkeypatch.setattr(run, "run_writing_tasks_in_driver", counted)

    def both() -> None:
        ctx = compact(in_driver)
        assert ctx.stats.in_driver is (strategy != "first-value")  # the task's stats say where it read
        with monkeypatch.context() as m:
            m.setattr(run.CompactionRun, "_driver_max", lambda _self: -1)  # every run is large: a Spark job
            assert not compact(in_spark).stats.in_driver

    both()
    first = _rows(in_driver)
    assert first == _rows(in_spark)
    kafka.produce(topic, SECOND)
    both()
    assert not in_driver.ledger_info().full_rebuild
    second = _rows(in_driver)
    assert second == _rows(in_spark)
    assert in_driver.get_last_compacted_position() == in_spark.get_last_compacted_position()
    assert second != first
    assert counted.calls == (0 if strategy == "first-value" else 2)


@pytest.mark.parametrize("fault", ["cancel", "failure"])
def test_a_cancelled_or_failed_run_in_the_driver_keeps_the_previous_ledger(kafka, make_factory, monkeypatch,
                                                                         fault):
    """A cancel that reaches the driver's reading task over the run's channel, or a failure after it wrote its
    part file: the task ends so, the previous ledger and horizon stay, and the new ledger's files are gone."""
    topic = kafka.topic(partitions=2)
    kafka.produce(topic, [(f"k{i % 20}", f"v{i}", i % 2) for i in range(200)])
    service = make_factory().new_topic_compaction_service(topic)
    compact(service)
    before, horizon = service.ledger_info(), service.get_last_compacted_position()
    rows = _rows(service)
    kafka.produce(topic, [(f"k{i % 20}", f"w{i}", i % 2) for i in range(50)])
    reached = []

    def faulty(spec: dict[str, Any]) -> None:
        reached.append(spec["write_to"])
        if fault == "cancel":
            service.task.cancel("cancelled by the test")  # the channel tells the reading task
        kafka_source.run_writing_tasks_in_driver(spec)
        raise OSError("the disk failed after the part files were written")

    monkeypatch.setattr(run, "run_writing_tasks_in_driver", faulty)
    ctx = service.compact()
    assert ctx.result(TASK_TIMEOUT_S) is (TaskState.CANCELLED if fault == "cancel" else TaskState.FAILED)
    assert ctx.worker_done.wait(TASK_TIMEOUT_S)
    assert reached, "the run did not read in the driver"
    assert service.ledger_info().ledger_id == before.ledger_id
    assert service.get_last_compacted_position() == horizon and _rows(service) == rows
    kept = service.factory.store.ledger_path(topic, before.ledger_id)
    assert [p for p in kept.parent.iterdir() if p.is_dir() and p != kept] == [], "the new ledger's files are left"

    monkeypatch.undo()  # the next run, in the driver again, takes the new records
    succeeded(service.compact())
    assert service.get_last_compacted_position() != horizon


def test_a_run_planned_out_of_its_slot_that_is_not_small_takes_a_slot_for_its_spark_job(kafka, make_factory,
                                                                                     monkeypatch):
    """A small ledger: the registry's run leaves its slot before it is planned; the tail is then too large to read
    in the driver, and the run takes a slot again for its Spark job (the only one: it waits for none) and writes
    every record; the next one, small again, reads in the driver."""
    monkeypatch.setattr(run.CompactionRun, "_driver_max", lambda _self: 100)
    topic = kafka.topic(partitions=2)
    kafka.produce(topic, [(f"k{i % 10}", f"v{i}", i % 2) for i in range(50)])
    factory = make_factory()
    registry = TaskRegistry(factory, 1, 60.0, release_after_s=TASK_TIMEOUT_S)
    first = registry.trigger(topic)
    assert first.result(TASK_TIMEOUT_S) is TaskState.SUCCEED, first.error
    assert first.stats.in_driver
    kafka.produce(topic, [(f"k{i % 10}", f"w{i}", i % 2) for i in range(300)])
    assert first.worker_done.wait(TASK_TIMEOUT_S)
    big = registry.trigger(topic)
    assert big.result(TASK_TIMEOUT_S) is TaskState.SUCCEED, big.error
    assert not big.stats.in_driver and big.stats.tail_records == 300
    service = factory.new_topic_compaction_service(topic)
    assert {r["value"] for r in _rows(service)} == {f"w{i}".encode() for i in range(290, 300)}
    assert big.worker_done.wait(TASK_TIMEOUT_S)
    kafka.produce(topic, [("k0", "x", 0)])
    last = registry.trigger(topic)
    assert last.result(TASK_TIMEOUT_S) is TaskState.SUCCEED and last.stats.in_driver
    assert last.worker_done.wait(TASK_TIMEOUT_S)
    assert registry.running_count() == 0 and registry.pending_count() == 0


def test_a_run_in_the_driver_starts_no_progress_thread(kafka, make_factory, monkeypatch):
    """A small run read in the driver has no thread of its own following its progress: its count is read when
    asked (a status) and once at its end."""
    topic = kafka.topic(partitions=1)
    kafka.produce(topic, [(f"k{i % 20}", f"v{i}") for i in range(100)])
    service = make_factory().new_topic_compaction_service(topic)
    followers: list[str] = []

    def read(spec: dict[str, Any]) -> None:
        followers.extend(t.name for t in threading.enumerate() if "_poll_progress" in t.name)
        kafka_source.run_writing_tasks_in_driver(spec)

    monkeypatch.setattr(run, "run_writing_tasks_in_driver", read)
    ctx = compact(service)
    assert ctx.stats.in_driver and followers == []
    assert ctx.progress.records_read == 100 and ctx.stats.records_kept == 20
