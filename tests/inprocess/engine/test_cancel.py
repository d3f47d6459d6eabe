"""Cancelling a compaction in each state (PIP-387), on the real broker and the shared warm Spark session.

States that last milliseconds are held open with the test-only pause points
(a ``Hold`` probe, ``tests/support/probes.py``); the cancel of a running Spark job uses a topic big enough that
the job takes seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from compactord.errors import IllegalStateTransition, TaskNotCancellable
from compactord.model import Position
from compactord.task import CompactionTaskCtx, TaskState
from tests.support.channel import LOOPBACK, control_files, run_channel
from tests.support.probes import Hold
from tests.support.service import compact, last_value_model, ledger_dirs, succeeded, view
from tests.support.timeouts import TASK_TIMEOUT_S
from tests.support.waiting import wait_for

# A warm session must stop a cancelled task within this bound (the figure).
CANCEL_BOUND_S = 5.0
WORKER_DONE_BOUND_S = 60.0

BIG_RECORDS = 60_000
BIG_KEYS = 2_000
BIG_VALUE = 1_000


@pytest.fixture(autouse=True)
def _through_spark_jobs(spark_jobs: None) -> None:
    """These tests are of the Spark job's work: no run's task is read in the driver."""


def snapshot(service: Any, partitions: int = 1) -> tuple[Any, ...]:
    info = service.ledger_info()
    ledger_id = info.ledger_id if info else None
    return ledger_id, service.get_last_compacted_position(), big_view(service, partitions)


def big_view(service: Any, partitions: int) -> dict[bytes, bytes]:
    """key -> value of the compacted view, each partition read in one call."""
    result: dict[bytes, bytes] = {}
    for p in range(partitions):
        for e in service.read_compacted_entries(Position(p, 0), 10**7):
            result[e.key] = e.value
    return result


def assert_cleaned_up(store: Any, topic: str, ctx: CompactionTaskCtx, expected_dirs: list[str]) -> None:
    assert ledger_dirs(store.root, topic) == expected_dirs
    assert not control_files(Path(store.root))


# -- Pending --------------------------------------------------------------------------------------


def test_cancel_pending_task_never_starts_and_a_later_compact_works(kafka, make_factory):
    topic = kafka.topic()
    records = [("a", "1"), ("b", "2"), ("a", "3")]
    kafka.produce(topic, records)
    factory = make_factory()
    service = factory.new_topic_compaction_service(topic)
    ctx = service.compact(start=False)
    assert ctx.state is TaskState.PENDING
    ctx.cancel()
    assert ctx.state is TaskState.CANCELLED and ctx.done
    assert ctx.worker_done.is_set()
    assert ctx.error_type == "compaction_cancelled"
    with pytest.raises(IllegalStateTransition):
        ctx.start()  # a cancelled task never runs
    assert not factory.store.topic_dir(topic).exists()
    assert service.ledger_info() is None
    later = compact(service)
    assert later is not ctx
    assert view(service) == last_value_model(records)


# -- Pending (started), Creating_Raw_Reader, Running before the Spark job -------------------------


@pytest.mark.parametrize(
    ("point", "state"),
    [
        ("pending", TaskState.PENDING),
        ("creating_raw_reader", TaskState.CREATING_RAW_READER),
        ("running", TaskState.RUNNING),
    ],
)
def test_cancel_at_a_pause_point_keeps_the_previous_ledger(kafka, make_factory, point, state):
    topic = kafka.topic(partitions=2)
    first = [(f"k{i % 6}", f"v{i}", i % 2) for i in range(40)]
    kafka.produce(topic, first)
    base = make_factory()
    service = base.new_topic_compaction_service(topic)
    compact(service)
    before = snapshot(service, 2)
    kafka.produce(topic, [(f"k{i % 9}", f"w{i}", i % 2) for i in range(20)])

    hold = Hold(point)
    paused = make_factory(store=base.store, probe=hold).new_topic_compaction_service(topic)
    ctx = paused.compact()
    assert hold.reached.wait(30), f"the task did not reach {point!r}"
    assert ctx.state is state
    started = time.monotonic()
    ctx.cancel()
    assert ctx.state is TaskState.CANCELLED
    assert ctx.worker_done.wait(CANCEL_BOUND_S), "the worker did not stop within the bound"
    latency = time.monotonic() - started
    print(f"\ncancel at pause point {point!r}: worker done {latency:.3f}s after cancel()")
    assert ctx.result(0) is TaskState.CANCELLED
    assert snapshot(service, 2) == before == snapshot(paused, 2)
    assert_cleaned_up(base.store, topic, ctx, [f"ledger-{before[0]}"])


# -- Running, during the Spark job ----------------------------------------------------------------


@pytest.fixture(scope="module")
def big_topic(kafka) -> tuple[str, dict[bytes, bytes]]:
    """A topic whose compaction takes seconds on the warm session: ~60 MB over 2 partitions."""
    from kafka import KafkaProducer

    topic = kafka.topic(partitions=2, prefix="big")
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=20, batch_size=1 << 20,
                             max_request_size=8 << 20)
    pad = b"x" * (BIG_VALUE - 12)
    expected: dict[bytes, bytes] = {}
    try:
        for i in range(BIG_RECORDS):
            key = f"k{i % BIG_KEYS}".encode()
            value = f"{i:010d}:".encode() + pad
            # a key always goes to the same partition, so keys are unique across partitions
            producer.send(topic, key=key, value=value, partition=(i % BIG_KEYS) % 2)
            expected[key] = value
        producer.flush()
    finally:
        producer.close()
    return topic, expected


def spark_jobs(spark_manager: Any, group: str) -> tuple[list[int], list[int]]:
    """(job ids of the group, the active ones among them) from the Spark status tracker."""
    sc = spark_manager.spark.sparkContext
    ids = list(sc.statusTracker().getJobIdsForGroup(group))
    active = set(sc.statusTracker().getActiveJobsIds())
    return ids, [i for i in ids if i in active]


def test_cancel_during_the_spark_job_and_before_its_submission(big_topic, make_factory, spark_manager,
                                                                caplog):
    caplog.set_level(logging.WARNING, logger="compactord")
    topic, expected = big_topic
    factory = make_factory()
    service = factory.new_topic_compaction_service(topic)

    # 1. A cancel while the Spark job runs on the warm session. The librdkafka reader reads this topic
    # in well under a second, so this run's reading is held to ~3 s by the read throttle: the cancel
    # lands mid-read on any machine.
    factory.set_topic_limits(topic, max_read_bytes_per_second=BIG_RECORDS * BIG_VALUE // 3)
    ctx = service.compact()
    # The job really runs: readers have reported records and Spark shows an active job of the group.
    wait_for(lambda: ctx.progress.records_read > 0 and spark_jobs(spark_manager, ctx.task_id)[1], 120,
             "the Spark job to get going", interval=0.05)
    read_at_cancel = ctx.progress.records_read
    assert ctx.state is TaskState.RUNNING
    started = time.monotonic()
    ctx.cancel()
    cancel_returned = time.monotonic() - started
    assert ctx.state is TaskState.CANCELLED
    assert cancel_returned < CANCEL_BOUND_S
    wait_for(lambda: not spark_jobs(spark_manager, ctx.task_id)[1], CANCEL_BOUND_S,
             "Spark to stop the jobs of the cancelled group", interval=0.01)
    jobs_stopped = time.monotonic() - started
    assert ctx.worker_done.wait(WORKER_DONE_BOUND_S)
    worker_done = time.monotonic() - started
    print(f"\ncancel during the Spark job (warm, {read_at_cancel} of {ctx.progress.records_total} "
          "records read): "
          f"cancel() returned in {cancel_returned:.3f}s, Spark jobs stopped {jobs_stopped:.3f}s, "
          f"worker done {worker_done:.3f}s after cancel()")
    assert worker_done < CANCEL_BOUND_S
    assert read_at_cancel < BIG_RECORDS, "the job had already read everything: the topic is too small"
    assert_cleaned_up(factory.store, topic, ctx, [])
    time.sleep(1.0)  # Spark tasks killed late must not bring the directory back
    assert_cleaned_up(factory.store, topic, ctx, [])
    assert service.ledger_info() is None

    # 2. The same session runs the next compaction normally (unthrottled).
    factory.set_topic_limits(topic)
    started = time.monotonic()
    done = compact(service)
    print(f"full compaction of the same topic afterwards: {time.monotonic() - started:.1f}s")
    assert done.stats.records_read == BIG_RECORDS
    before = snapshot(service, 2)
    assert before[2] == expected

    # 3. A cancel between entering spark.run and Spark submitting the job (cancelJobGroup alone would
    # miss it) still stops the work: the JVM's future-jobs cancel and the cancel pushed to the readers.
    ctx = service.compact(rebuild=True)  # reads the whole topic again: a long job if nothing stops it
    # The ledger's folder is made just before the task enters spark.run: cancel at once.
    wait_for(lambda: len(ledger_dirs(factory.store.root, topic)) > 1 or ctx.done, 60, "the new ledger's folder",
             interval=0.001)
    started = time.monotonic()
    jobs_at_cancel = spark_jobs(spark_manager, ctx.task_id)[0]
    ctx.cancel()
    assert ctx.state is TaskState.CANCELLED
    assert ctx.worker_done.wait(WORKER_DONE_BOUND_S), "the cancelled work never stopped"
    worker_done = time.monotonic() - started
    later = spark_jobs(spark_manager, ctx.task_id)[0]
    print(f"cancel inside spark.run before submission (jobs of the group at cancel: {jobs_at_cancel}, "
          f"later: {later}): worker done {worker_done:.3f}s after cancel()")
    assert snapshot(service, 2) == before
    assert_cleaned_up(factory.store, topic, ctx, [f"ledger-{before[0]}"])
    # Both JVM calls (cancelJobGroup, cancelJobGroupAndFutureJobs) worked each time.
    assert not [r for r in caplog.records if "cancelling Spark job group" in r.getMessage()]


# -- Ending_with_switch_ledger ----------------------------------------------------------------------


@pytest.mark.parametrize("point", ["switch", "switched"])
def test_cancel_is_refused_while_switching_ledgers(kafka, make_factory, point):
    topic = kafka.topic()
    first = [("a", "1"), ("b", "1")]
    kafka.produce(topic, first)
    base = make_factory()
    service = base.new_topic_compaction_service(topic)
    old_id = compact(service).ledger_id
    second = [("a", "2"), ("c", "1")]
    kafka.produce(topic, second)

    hold = Hold(point)
    paused = make_factory(store=base.store, probe=hold).new_topic_compaction_service(topic)
    ctx = paused.compact()
    assert hold.reached.wait(60), f"the task did not reach {point!r}"
    assert ctx.state is TaskState.ENDING_WITH_SWITCH_LEDGER
    if point == "switched":  # the pointer is replaced, the old ledger not yet deleted
        assert base.store.current_ledger_id(topic) != old_id
    else:
        assert base.store.current_ledger_id(topic) == old_id
    with pytest.raises(TaskNotCancellable, match="Ending_with_switch_ledger"):
        ctx.cancel()
    assert not ctx.cancelled
    hold.release()
    succeeded(ctx)
    assert ctx.ledger_id is not None and ctx.ledger_id != old_id
    assert service.ledger_info().ledger_id == ctx.ledger_id
    assert view(service) == view(paused) == last_value_model(first + second)
    assert ledger_dirs(base.store.root, topic) == [f"ledger-{ctx.ledger_id}"]


# -- ended tasks ------------------------------------------------------------------------------------


def test_cancel_of_an_ended_task_is_refused(kafka, make_factory):
    topic = kafka.topic()
    kafka.produce(topic, [("a", "1")])
    factory = make_factory()
    service = factory.new_topic_compaction_service(topic)
    succeeded = compact(service)
    with pytest.raises(TaskNotCancellable, match="Succeed"):
        succeeded.cancel()
    assert succeeded.state is TaskState.SUCCEED

    cancelled = service.compact(start=False)
    cancelled.cancel()
    with pytest.raises(TaskNotCancellable, match="Cancelled"):
        cancelled.cancel()

    failed = factory.new_topic_compaction_service("no-such-topic-for-cancel").compact()
    assert failed.result(TASK_TIMEOUT_S) is TaskState.FAILED
    with pytest.raises(TaskNotCancellable, match="Failed"):
        failed.cancel()


def test_a_reader_of_a_cancelled_task_stops_before_it_fetches(kafka):
    """A range read that Spark starts after the cancel (pushed before the task connected) reads nothing."""
    from compactord.engine.kafka_source import RangeReadTask

    topic = kafka.topic()
    kafka.produce(topic, [(f"k{i}", f"v{i}") for i in range(50)])
    with run_channel() as channel:
        spec = {"client": {"bootstrap_servers": [kafka.bootstrap]}, "topic": topic, "strategy": "publishing-order",
                "event_time_source": "timestamp", "retain_null_key": False, "batch_records": 1000,
                "channel": channel.endpoint(LOOPBACK)}
        assert sum(b.num_rows for b in RangeReadTask(spec, 0, 0, 50).run()) == 50  # not cancelled: reads
        assert channel.progress().records == 50
        channel.cancel()
        task = RangeReadTask(spec, 0, 0, 50)
        with pytest.raises(RuntimeError, match="cancelled"):
            next(iter(task.run()))
        assert task.records == 0


def test_a_reader_that_loses_its_channel_stops_reading_and_fails(kafka):
    """The run's channel closes while a (throttled, so slow) range is read: the task stops at its next check
    and fails its attempt, rather than reading on for a driver that is gone."""
    from compactord.engine.channel import ChannelLost
    from compactord.engine.kafka_source import RangeReadTask

    topic = kafka.topic()
    kafka.produce(topic, [(f"k{i}", "v" * 1000) for i in range(2000)])  # ~2 MB: ~10 s at the rate below
    with run_channel() as channel:
        spec = {"client": {"bootstrap_servers": [kafka.bootstrap]}, "topic": topic, "strategy": "publishing-order",
                "event_time_source": "timestamp", "retain_null_key": False, "batch_records": 100,
                "channel": channel.endpoint(LOOPBACK),
                "read_bytes_per_second": 200_000}
        task = RangeReadTask(spec, 0, 0, 2000)
        failed: list[BaseException] = []

        def read() -> None:
            try:
                for _ in task.run():
                    pass
            except BaseException as exc:  # noqa: BLE001 (what ended the read is the test's subject)
                failed.append(exc)

        reading = threading.Thread(target=read)
        reading.start()
        wait_for(lambda: channel.progress().records, 60, "the task to report", interval=0.01)
        channel.close()
        reading.join(60)
    assert not reading.is_alive(), "the task read on without its driver"
    assert len(failed) == 1 and isinstance(failed[0], ChannelLost), failed
    assert task.records < 2000
