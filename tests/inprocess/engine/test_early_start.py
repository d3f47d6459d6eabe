"""An incremental run's reading tasks are launched while the run is planned (``engine.early_start``).

Real broker, real Spark job, real ledger. The planning is held at the broker metadata boundary
(``HeldPlanning``: the real broker's answers, given only once the test has seen what it waits for), so that
what runs while a run is planned is seen through Spark's own status tracker, not through timings. Where a
log start must move (the test broker cannot move one), the answer is given there too (``Answers``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from compactord.engine import early_start
from compactord.task import TaskState
from tests.support.brokers import Answers
from tests.support.service import compact, succeeded, view
from tests.support.timeouts import TASK_TIMEOUT_S

_SEEN_WITHIN_S = 30.0  # how long a held planning waits for what it is held for


@pytest.fixture(autouse=True)
def _through_spark_jobs(spark_jobs: None) -> None:
    """These tests are of the Spark job's work: no run's task is read in the driver."""


def _job_statuses(spark_context: Any, group: str) -> list[str]:
    """The statuses of job group ``group``'s jobs (Spark's status tracker: RUNNING, SUCCEEDED, FAILED)."""
    tracker = spark_context.statusTracker()
    return [str(info.status) for info in map(tracker.getJobInfo, tracker.getJobIdsForGroup(group)) if info]


def _job_running(spark_context: Any, service: Any) -> Callable[[], bool]:
    """Whether the service's task has a job running now: what a held planning waits for."""
    return lambda: service.task is not None and "RUNNING" in _job_statuses(spark_context, service.task.task_id)


def _within(check: Callable[[], bool], seconds: float = _SEEN_WITHIN_S) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


@dataclass
class HeldPlanning(Answers):
    """``Answers``, with each ask for the log's offsets held (while ``until`` is set) until ``until()`` holds or
    ``_SEEN_WITHIN_S`` passed; ``seen`` records which, and ``then`` runs before the answer."""

    until: Callable[[], bool] | None = None
    then: Callable[[], None] | None = None
    seen: list[bool] = field(default_factory=list)

    def offsets(self, topic: str) -> Any:
        if self.until is not None:
            self.seen.append(_within(self.until))
            if self.then is not None:
                self.then()
        return super().offsets(topic)


@pytest.fixture
def held(make_factory: Any) -> Any:
    """``held(**settings) -> (factory, planning)``: a factory whose planning the test holds (``HeldPlanning``)."""

    def make(**overrides: Any) -> tuple[Any, HeldPlanning]:
        made: list[HeldPlanning] = []
        factory = make_factory(metadata=lambda real: made.append(HeldPlanning(real)) or made[0], **overrides)
        return factory, made[0]

    return make


def _records(start: int, count: int, keys: int, partitions: int) -> list[tuple[Any, ...]]:
    """``count`` records numbered from ``start``: key ``k<i % keys>`` in partition ``i % partitions``; every
    seventh a tombstone."""
    return [(f"k{i % keys}", None if i % 7 == 3 else f"v{i}", (i % keys) % partitions)
            for i in range(start, start + count)]


def _compacted(kafka: Any, held: Any, records: list[tuple[Any, ...]], partitions: int = 2) -> tuple[Any, Any, int]:
    """A topic of ``records``, compacted once: (its service, its held planning, the ledger's id)."""
    topic = kafka.topic(partitions=partitions)
    factory, planning = held()
    service = factory.new_topic_compaction_service(topic)
    kafka.produce(topic, records)
    return service, planning, compact(service).ledger_id


def _model(records: list[tuple[Any, ...]]) -> dict[bytes, bytes]:
    last: dict[str, Any] = {}
    for key, value, _p in records:
        last[key] = value
    return {k.encode(): v.encode() for k, v in last.items() if v is not None}


def test_the_reading_tasks_run_while_the_run_is_planned(kafka: Any, held: Any, spark_manager: Any) -> None:
    """The ledger's horizon gives every partition's start: the run's job is running (Spark's status tracker says
    so) before the broker has answered the run's planning, and its tasks write what the plan then says."""
    topic = kafka.topic(partitions=4)
    factory, planning = held()
    service = factory.new_topic_compaction_service(topic)
    first = _records(0, 400, 60, 4)
    kafka.produce(topic, first)
    assert not compact(service).stats.early_tasks  # a first run has no horizon to start from
    tail = _records(400, 300, 90, 4)
    kafka.produce(topic, tail)

    sc = spark_manager.spark.sparkContext
    planning.until = _job_running(sc, service)
    ctx = compact(service)

    assert planning.seen == [True], "no job of the run ran while the run was planned"
    assert ctx.stats.early_tasks and not ctx.stats.full_rebuild
    assert ctx.stats.tail_records == 300
    assert view(service, 4) == _model(first + tail)


def test_a_run_with_nothing_new_ends_its_early_tasks_unread(kafka: Any, held: Any, spark_manager: Any) -> None:
    records = _records(0, 100, 30, 2)
    service, planning, ledger = _compacted(kafka, held, records)

    sc = spark_manager.spark.sparkContext
    planning.until = _job_running(sc, service)
    ctx = compact(service)

    assert planning.seen == [True]
    assert ctx.stats.skipped and not ctx.stats.early_tasks
    assert service.ledger_info().ledger_id == ledger
    assert _job_statuses(sc, ctx.task_id) == ["SUCCEEDED"]  # the early job, ended before the task did
    assert view(service, 2) == _model(records)


def test_early_tasks_read_from_the_planned_start_when_the_log_start_moved(kafka: Any, held: Any) -> None:
    """Retention moved partition 0's log start past the horizon (the broker's answer, given at the metadata
    boundary: the test broker cannot move one): its reader, opened at the horizon, is replaced by one at the
    log start, and what lies below it leaves the view."""
    topic = kafka.topic(partitions=2)
    factory, planning = held()
    service = factory.new_topic_compaction_service(topic)
    kafka.produce(topic, [("a", "1", 0), ("b", "1", 0), ("c", "1", 1)])
    compact(service)  # horizon: partition 0 at offset 1
    kafka.produce(topic, [("a", "2", 0), ("d", "1", 0), ("e", "1", 0), ("c", "2", 1)])  # p0 offsets 2, 3, 4
    planning.log_start[topic] = {0: 3}  # offsets 0..2 of partition 0 are gone

    ctx = compact(service)

    assert ctx.stats.early_tasks and not ctx.stats.full_rebuild
    assert view(service, 2) == {b"d": b"1", b"e": b"1", b"c": b"2"}


def test_a_rebuild_starts_its_tasks_at_the_log_starts_and_reads_from_where_the_log_now_starts(
    kafka: Any, held: Any
) -> None:
    """A rebuild reads each partition from its log start: the early tasks open their readers at the ones the
    ledger recorded, and where retention has moved one since (the broker's answer, given at the metadata
    boundary), read from the new one."""
    topic = kafka.topic(partitions=2)
    factory, planning = held()
    service = factory.new_topic_compaction_service(topic)
    kafka.produce(topic, [("a", "1", 0), ("b", "1", 0), ("c", "1", 1), ("d", "1", 1)])
    compact(service)
    kafka.produce(topic, [("e", "1", 0), ("c", "2", 1)])
    assert compact(service, rebuild=True).stats.early_tasks
    assert view(service, 2) == {b"a": b"1", b"b": b"1", b"c": b"2", b"d": b"1", b"e": b"1"}

    planning.log_start[topic] = {0: 1}  # partition 0's offset 0 ("a") is gone
    ctx = compact(service, rebuild=True)

    assert ctx.stats.early_tasks and ctx.stats.full_rebuild
    assert view(service, 2) == {b"b": b"1", b"c": b"2", b"d": b"1", b"e": b"1"}


def test_tasks_that_wait_too_long_for_their_plan_end_and_the_run_still_writes(
    kafka: Any, held: Any, spark_manager: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A planning that outlasts the tasks' wait (the broker answers slowly): the tasks end without reading and
    give their cores back, and the run's job is launched once it is planned."""
    monkeypatch.setattr(early_start, "PLAN_WAIT_S", 0.2)
    first = _records(0, 100, 30, 2)
    service, planning, _ = _compacted(kafka, held, first)
    tail = _records(100, 80, 40, 2)
    kafka.produce(service.topic, tail)

    sc = spark_manager.spark.sparkContext
    planning.until = lambda: service.task is not None and _job_statuses(sc, service.task.task_id) == ["SUCCEEDED"]
    ctx = compact(service)

    assert planning.seen == [True], "the early tasks did not end while the planning was held"
    assert not ctx.stats.early_tasks
    assert ctx.stats.tail_records == 80
    assert view(service, 2) == _model(first + tail)


def test_a_cancel_while_the_run_is_planned_stops_its_early_tasks_and_keeps_the_ledger(
    kafka: Any, held: Any, spark_manager: Any
) -> None:
    first = _records(0, 100, 30, 2)
    service, planning, ledger = _compacted(kafka, held, first)
    kafka.produce(service.topic, _records(100, 80, 40, 2))

    sc = spark_manager.spark.sparkContext
    planning.until = _job_running(sc, service)
    planning.then = lambda: service.task.cancel()
    ctx = service.compact()

    assert ctx.result(TASK_TIMEOUT_S) is TaskState.CANCELLED
    assert ctx.worker_done.wait(TASK_TIMEOUT_S)
    assert planning.seen == [True]
    assert "RUNNING" not in _job_statuses(sc, ctx.task_id)
    assert service.ledger_info().ledger_id == ledger
    assert view(service, 2) == _model(first)
    planning.until = planning.then = None
    assert succeeded(service.compact()).stats.early_tasks  # the next run compacts the tail
