"""Compaction semantics against a real broker and a real local Spark session (publishing order)."""

from __future__ import annotations

from typing import Any

import pytest

from compactord.errors import CompactionAlreadyRunning, NotCompacted, TopicNotFound
from compactord.model import Position
from compactord.task import TaskState
from tests.support.probes import Hold
from tests.support.service import compact, entries, last_value_model, view
from tests.support.timeouts import TASK_TIMEOUT_S


def test_last_value_per_key_offsets_kept_and_in_order(kafka, make_factory):
    topic = kafka.topic(partitions=1)
    records = [("c", "c1"), ("a", "a1"), ("b", "b1"), ("a", "a2"), ("c", "c2"), ("d", "d1"), ("b", "b2")]
    kafka.produce(topic, records)
    service = make_factory().new_topic_compaction_service(topic)
    ctx = compact(service)
    got = entries(service)
    assert [(e.offset, e.key, e.value) for e in got] == [
        (3, b"a", b"a2"), (4, b"c", b"c2"), (5, b"d", b"d1"), (6, b"b", b"b2"),
    ]
    assert service.get_last_compacted_position() == {0: 6}
    manifest = service.ledger_info()
    assert manifest.records_read == 7 and manifest.records_kept == 4 and manifest.removed == 3
    assert ctx.progress.records_read == 7
    assert ctx.ledger_id == manifest.ledger_id
    assert service.read_last_compacted_entry(0).key == b"b"


def test_a_null_value_deletes_an_empty_value_is_kept_and_empty_key_is_a_key(kafka, make_factory):
    topic = kafka.topic()
    records = [("a", "1"), ("b", "1"), ("", "empty-key"), ("a", None), ("b", b""), ("c", "1"), ("a", "back")]
    kafka.produce(topic, records)
    service = make_factory().new_topic_compaction_service(topic)
    compact(service)
    assert view(service) == {b"": b"empty-key", b"b": b"", b"c": b"1", b"a": b"back"}
    assert view(service) == last_value_model(records)


def test_pulsar_s_rule_an_empty_value_deletes_too(kafka, make_factory):
    topic = kafka.topic()
    records = [("a", "1"), ("b", "1"), ("a", None), ("b", b""), ("c", "1")]
    kafka.produce(topic, records)
    service = make_factory(compaction_empty_value_is_tombstone=True).new_topic_compaction_service(topic)
    compact(service)
    assert view(service) == {b"c": b"1"} == last_value_model(records, empty_deletes=True)


def test_all_keys_deleted_gives_an_empty_ledger(kafka, make_factory):
    topic = kafka.topic(partitions=2)
    kafka.produce(topic, [("a", "1", 0), ("b", "1", 1), ("a", None, 0), ("b", None, 1)])
    service = make_factory().new_topic_compaction_service(topic)
    compact(service)
    assert entries(service, 0) == [] and entries(service, 1) == []
    assert service.read_last_compacted_entry(0) is None
    assert service.get_last_compacted_position() == {0: 1, 1: 1}


def test_empty_topic_writes_an_empty_ledger_and_lists_every_partition(kafka, make_factory):
    topic = kafka.topic(partitions=3)
    service = make_factory().new_topic_compaction_service(topic)
    compact(service)
    assert service.get_last_compacted_position() == {0: -1, 1: -1, 2: -1}
    assert service.ledger_info().records_kept == 0
    assert entries(service, 2) == []


@pytest.mark.parametrize("retain", [False, True])
def test_null_keys_dropped_or_kept_in_place(kafka, make_factory, retain):
    topic = kafka.topic()
    kafka.produce(topic, [(None, "n0"), ("a", "1"), (None, b""), ("a", "2"), (None, "n3")])
    service = make_factory(topic_compaction_retain_null_key=retain).new_topic_compaction_service(topic)
    compact(service)
    got = [(e.offset, e.key, e.value) for e in entries(service)]
    if retain:  # kept in place, and a null-key record with an empty value is not a tombstone
        assert got == [(0, None, b"n0"), (2, None, b""), (3, b"a", b"2"), (4, None, b"n3")]
    else:
        assert got == [(3, b"a", b"2")]


def test_incremental_run_reads_only_ledger_plus_tail(kafka, make_factory):
    topic = kafka.topic(partitions=2)
    first = [(f"k{i % 10}", f"v{i}", i % 2) for i in range(200)]
    kafka.produce(topic, first)
    factory = make_factory()
    service = factory.new_topic_compaction_service(topic)
    ctx1 = compact(service)
    assert ctx1.stats.records_read == 200
    kept = service.ledger_info().records_kept
    assert kept == 10
    second = [(f"k{i % 13}", f"w{i}", (i % 13) % 2) for i in range(30)]
    kafka.produce(topic, second)
    ctx2 = compact(service)
    assert ctx2.stats.full_rebuild is False
    assert ctx2.stats.ledger_rows_read == kept
    assert ctx2.stats.tail_records == 30
    assert ctx2.stats.records_read == kept + 30 == ctx2.progress.records_read
    assert view(service, 2) == last_value_model(first + second)
    per_partition = [sum(1 for r in first + second if r[2] == p) for p in (0, 1)]
    assert service.get_last_compacted_position() == {0: per_partition[0] - 1, 1: per_partition[1] - 1}
    # the old ledger is gone once the new one is current
    ledgers = sorted(p.name for p in factory.store.topic_dir(topic).iterdir() if p.name.startswith("ledger-"))
    assert ledgers == [f"ledger-{ctx2.ledger_id}"]


def test_nothing_new_succeeds_without_writing_a_ledger(kafka, make_factory):
    topic = kafka.topic()
    kafka.produce(topic, [("a", "1"), ("b", "2")])
    service = make_factory().new_topic_compaction_service(topic)
    first = compact(service)
    again = compact(service)
    assert again.stats.skipped is True
    assert again.ledger_id is None
    assert service.ledger_info().ledger_id == first.ledger_id


def test_rebuild_ignores_the_ledger_and_rereads_the_topic(kafka, make_factory):
    topic = kafka.topic()
    kafka.produce(topic, [("a", "1"), ("a", "2"), ("b", "3")])
    service = make_factory().new_topic_compaction_service(topic)
    compact(service)
    ctx = compact(service, rebuild=True)
    assert ctx.stats.full_rebuild is True and ctx.stats.records_read == 3
    assert view(service) == {b"a": b"2", b"b": b"3"}


def test_strategy_change_forces_a_full_rebuild(kafka, make_factory, tmp_path):
    topic = kafka.topic()
    kafka.produce(topic, [("a", "1"), ("a", "2")])
    root = tmp_path / "shared-root"
    first = make_factory(root=root)
    compact(first.new_topic_compaction_service(topic))
    first.close()
    kafka.produce(topic, [("a", "3")])
    second = make_factory(root=root, compaction_strategy="first-value")
    ctx = compact(second.new_topic_compaction_service(topic))
    assert ctx.stats.full_rebuild is True and ctx.stats.records_read == 3
    assert view(second.new_topic_compaction_service(topic)) == {b"a": b"1"}


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_topics(kafka, make_factory, codec, reader_client):
    topic = kafka.topic()
    records = [(f"k{i % 5}", f"value-{i}" * 10 if i % 7 else None) for i in range(100)]
    kafka.produce(topic, records, compression=codec)
    service = make_factory(compaction_reader_client=reader_client).new_topic_compaction_service(topic)
    compact(service)
    assert view(service) == last_value_model(records)


def test_headers_and_timestamps_survive(kafka, make_factory):
    topic = kafka.topic()
    kafka.produce(topic, [("a", "1", 0, 1_700_000_000_000, [("h1", b"x"), ("h2", b"\x00\xff")])])
    service = make_factory().new_topic_compaction_service(topic)
    compact(service)
    (entry,) = entries(service)
    assert entry.timestamp == 1_700_000_000_000
    assert entry.headers == (("h1", b"x"), ("h2", b"\x00\xff"))


def test_read_api_paging_and_errors(kafka, make_factory):
    topic = kafka.topic()
    kafka.produce(topic, [(f"k{i}", f"v{i}") for i in range(25)])
    service = make_factory().new_topic_compaction_service(topic)
    with pytest.raises(NotCompacted):
        service.read_compacted_entries(Position(0, 0), 10)
    assert service.get_last_compacted_position() is None and service.ledger_info() is None
    compact(service)
    page = service.read_compacted_entries(Position(0, 10), 5)
    assert [e.offset for e in page] == [10, 11, 12, 13, 14]
    assert service.read_compacted_entries(Position(0, 25), 5) == []
    assert service.read_compacted_entries(Position(7, 0), 5) == []


def test_unknown_topic_fails_the_task_with_topic_not_found(make_factory):
    service = make_factory().new_topic_compaction_service("no-such-topic-here")
    ctx = service.compact()
    assert ctx.result(TASK_TIMEOUT_S) is TaskState.FAILED
    assert ctx.error_type == TopicNotFound.code
    assert "no-such-topic-here" in ctx.error
    assert service.ledger_info() is None


def test_second_compact_while_running_is_refused(kafka, make_factory):
    topic = kafka.topic()
    kafka.produce(topic, [("a", "1")])
    hold = Hold("creating_raw_reader")
    service = make_factory(probe=hold).new_topic_compaction_service(topic)
    ctx = service.compact()
    try:
        assert hold.reached.wait(TASK_TIMEOUT_S)
        with pytest.raises(CompactionAlreadyRunning) as info:
            service.compact()
        assert info.value.task is ctx
    finally:
        ctx.cancel()
        ctx.worker_done.wait(TASK_TIMEOUT_S)


def test_failed_compaction_leaves_the_previous_ledger_and_horizon(kafka, make_factory, broker):
    topic = kafka.topic()
    kafka.produce(topic, [("a", "1"), ("b", "2")])
    service = make_factory().new_topic_compaction_service(topic)
    compact(service)
    before = (service.ledger_info().ledger_id, service.get_last_compacted_position(), view(service))
    kafka.produce(topic, [("a", "3")])
    # A strategy that raises inside Spark makes the job fail after the ledger dir was allocated.
    broken = make_factory(
        store=service.factory.store, compaction_strategy="tests.inprocess.engine.strategies:Exploding"
    )
    broken_service = broken.new_topic_compaction_service(topic)
    ctx = broken_service.compact()
    assert ctx.result(TASK_TIMEOUT_S) is TaskState.FAILED
    assert ctx.worker_done.wait(TASK_TIMEOUT_S)
    assert "explod" in ctx.error.lower()
    after = (service.ledger_info().ledger_id, service.get_last_compacted_position(), view(service))
    assert after == before
    dirs = [p.name for p in service.factory.store.topic_dir(topic).iterdir() if p.name.startswith("ledger-")]
    assert dirs == [f"ledger-{before[0]}"]


# -- the job's shuffle widths ------------------------------------------------------------------------


def _file_keys(service: Any) -> list[list[tuple[int, int]]]:
    """The (partition, offset) rows of each ledger file, files in name order."""
    import pyarrow.parquet as pq

    manifest = service.ledger_info()
    path = service.factory.store.ledger_path(service.topic, manifest.ledger_id)
    out = []
    for f in sorted(manifest.files, key=lambda f: f["name"]):
        table = pq.read_table(path / f["name"], columns=["partition", "offset"])
        out.append(list(zip(table["partition"].to_pylist(), table["offset"].to_pylist(), strict=True)))
    return out


def test_a_ledger_of_several_files_is_sorted_across_them(kafka, make_factory, monkeypatch):
    """Sized down so that 1,200 records need several shuffle partitions and output files: the range
    sort must leave the files in (partition, offset) order, as the read API's bisection assumes."""
    from compactord.engine import job

    monkeypatch.setattr(job, "ROWS_PER_SHUFFLE_PARTITION", 150)
    monkeypatch.setattr(job, "MIN_ROWS_PER_SHUFFLE_PARTITION", 100)
    assert job.shuffle_partitions_for(1200, 2) == (8, 8)
    topic = kafka.topic(partitions=3)
    records = [(f"k{i % 500}", f"v{i}" if i % 13 else None, (i % 500) % 3) for i in range(1200)]
    kafka.produce(topic, records)
    service = make_factory().new_topic_compaction_service(topic)
    compact(service)
    files = _file_keys(service)
    assert len(files) > 1, files
    rows = [row for f in files for row in f]
    assert rows == sorted(rows) and len(set(rows)) == len(rows)
    assert view(service, 3) == last_value_model(records)
    # An incremental run (ledger files + tail) keeps the order too.
    more = [(f"k{i % 700}", f"w{i}", (i % 700) % 3) for i in range(600)]
    kafka.produce(topic, more)
    compact(service)
    rows = [row for f in _file_keys(service) for row in f]
    assert rows == sorted(rows)
    assert view(service, 3) == last_value_model(records + more)
    for p in range(3):
        assert service.read_last_compacted_entry(p) == entries(service, p)[-1]


def test_a_configured_shuffle_width_is_used_as_set(kafka, make_factory):
    topic = kafka.topic(partitions=2)
    records = [(f"k{i % 40}", f"v{i}", (i % 40) % 2) for i in range(300)]
    kafka.produce(topic, records)
    factory = make_factory(spark_conf={"spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "3"})
    service = factory.new_topic_compaction_service(topic)
    compact(service)
    assert view(service, 2) == last_value_model(records)
    rows = [row for f in _file_keys(service) for row in f]
    assert rows == sorted(rows)


def test_a_full_rebuild_of_whole_partitions_neither_shuffles_nor_groups(kafka, make_factory, spark_manager,
                                                                        monkeypatch, tmp_path):
    """Each partition read by one task (``reads_are_final``): the plan has no exchange, and the ledger is
    the one the grouping job writes, row for row, in sorted files."""
    from compactord.engine import job
    from compactord.engine.kafka_source import OffsetRange
    from compactord.engine.strategies import ResolvedStrategy

    topic = kafka.topic(partitions=3)
    records = [(f"k{i % 50}", f"v{i}" if i % 7 else None, (i % 50) % 3) for i in range(600)]
    records += [(f"only-{i}", f"u{i}", i % 3) for i in range(30)]  # keys with one record
    kafka.produce(topic, records)
    factory = make_factory()
    strategy = ResolvedStrategy.resolve("publishing-order", "timestamp", False)
    ranges = [OffsetRange(p, 0, 210) for p in range(3)]

    def plan_of(**kwargs: Any) -> tuple[bool, Any]:
        spec = job.job_spec(factory.settings, strategy, topic=topic, ranges=ranges, output_path=str(tmp_path),
                            log_start={}, progress_dir="", widths=job.JobWidths(2, 1), **kwargs)
        return spec.final_reads, spec

    final, spec = plan_of(ledger_files=[])
    assert final
    plan = job.build_winners(spark_manager.spark, spec, strategy.strategy)._jdf.queryExecution().executedPlan()
    assert "Exchange" not in plan.toString() and "Aggregate" not in plan.toString(), plan.toString()
    assert not plan_of(ledger_files=["x.parquet"])[0]  # a ledger to merge: the job groups

    service = factory.new_topic_compaction_service(topic)
    compact(service)
    files = _file_keys(service)
    assert len(files) == 3  # one per reading task, each a partition, in partition order
    assert [row for f in files for row in f] == sorted(row for f in files for row in f)
    final_entries = [entries(service, p) for p in range(3)]
    assert view(service, 3) == last_value_model(records)

    monkeypatch.setattr(job, "FINAL_READ_MAX_RECORDS", 0)  # the grouping job, for comparison
    compact(service, rebuild=True)
    assert [entries(service, p) for p in range(3)] == final_entries
