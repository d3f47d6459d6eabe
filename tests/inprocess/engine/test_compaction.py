"""Compaction semantics against a real broker and a real local Spark session (publishing order)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from compactord.engine.kafka_source import OffsetRange
from compactord.errors import CompactionAlreadyRunning, NotCompacted, TopicNotFound
from compactord.ledger.parts import part_name
from compactord.model import Position
from compactord.storage import ObjectInfo
from compactord.task import TaskState
from tests.support.probes import Hold
from tests.support.service import compact, entries, last_value_model, view
from tests.support.timeouts import TASK_TIMEOUT_S

_REPO = Path(__file__).resolve().parents[3]


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


def test_the_reading_tasks_report_their_cpu_and_wall_time(kafka, make_factory):
    """What ``compactord_task_cpu_ratio`` and the history's ``task_cpu_ratio`` show: the reading tasks' CPU
    seconds (their workers' threads) against their wall seconds, summed over the tasks."""
    topic = kafka.topic(partitions=2)
    kafka.produce(topic, [(f"k{i % 50}", f"v{i}", i % 2) for i in range(2000)])
    ctx = compact(make_factory().new_topic_compaction_service(topic))
    assert ctx.stats.task_cpu_seconds > 0 and ctx.stats.task_wall_seconds > 0
    assert ctx.stats.task_cpu_ratio == round(ctx.stats.task_cpu_seconds / ctx.stats.task_wall_seconds, 3)


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
def test_compressed_topics(kafka, make_factory, codec):
    topic = kafka.topic()
    records = [(f"k{i % 5}", f"value-{i}" * 10 if i % 7 else None) for i in range(100)]
    kafka.produce(topic, records, compression=codec)
    service = make_factory().new_topic_compaction_service(topic)
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


def _ledger_rows(service: Any) -> list[dict[str, Any]]:
    """Every row of the current ledger, markers included, in file order."""
    import pyarrow.parquet as pq

    manifest = service.ledger_info()
    path = service.factory.store.ledger_path(service.topic, manifest.ledger_id)
    return [row for f in sorted(manifest.files, key=lambda f: f["name"])
            for row in pq.read_table(path / f["name"]).to_pylist()]


@pytest.mark.parametrize("strategy", ["publishing-order", "event-time"])
def test_an_incremental_run_merges_each_partition_in_its_reading_task(kafka, make_factory, spark_manager,
                                                                     monkeypatch, strategy):
    """An incremental run of whole partitions merges each one's ledger rows into its tail's winners in its
    reading task: no exchange, and row for row (markers and their first ``marker_at`` included) the
    ledger the grouping job writes from the same records. Covered: updated, deleted, new and untouched
    keys, retained null-key records, a partition without new records, and under event time a late record
    older than the key's deletion marker, one older than its value, and one newer."""
    from compactord.engine import job
    from compactord.engine.strategies import ResolvedStrategy

    topic = kafka.topic(partitions=3)
    et = [("et", b"%d" % 1000)]
    first = [(f"k{i}", f"v{i}", i % 3, None, [("et", b"%d" % (1000 + i))]) for i in range(30)]
    first += [(None, f"n{i}", i % 3, None, et) for i in range(3)]
    first += [("k3", None, 0, None, [("et", b"2000")]), ("k4", None, 1, None, [("et", b"2000")])]  # deletions
    second = [("k0", "late", 0, None, [("et", b"500")]),  # older than its value: loses under event time
              ("k3", "too-late", 0, None, [("et", b"1500")]),  # older than its deletion
              ("k6", "newer", 0, None, [("et", b"9000")]),
              ("k7", None, 1, None, [("et", b"9000")]),  # a new deletion
              ("new", "n", 1, None, [("et", b"9000")]), (None, "n-late", 0, None, et)]  # partition 2: nothing
    settings = {"compaction_strategy": strategy, "compaction_event_time_source": "header:et",
                "topic_compaction_retain_null_key": True}
    kafka.produce(topic, first)
    final = make_factory(**settings).new_topic_compaction_service(topic)
    grouping = make_factory(root=final.factory.store.root.parent / "grouping", **settings) \
        .new_topic_compaction_service(topic)

    def run(service: Any, grouped: bool) -> tuple[list[dict[str, Any]], bool]:
        if grouped:
            monkeypatch.setattr(job, "reads_are_final", _never)  # the grouping job, for comparison
        try:
            ctx = compact(service)
        finally:
            monkeypatch.undo()
        return _ledger_rows(service), ctx.stats.full_rebuild

    (before, _), (grouped_before, _) = run(final, False), run(grouping, True)
    kafka.produce(topic, second)
    (merged, merged_full), (grouped, grouped_full) = run(final, False), run(grouping, True)
    assert not merged_full and not grouped_full
    # A file per reading task, written by it: the merge was there.
    assert [f["name"] for f in final.ledger_info().files] == [part_name(p) for p in range(3)]
    assert len(_file_keys(grouping)) == 1

    def marker_times(rows: list[dict[str, Any]], old: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # An old marker keeps the time it first entered a ledger; a new one has its run's start.
        first_at = {r["offset"]: r["marker_at"] for r in old if r["marker"]}
        return [{**r, "marker_at": ("kept" if first_at.get(r["offset"]) == r["marker_at"] else "new")
                 if r["marker"] else r["marker_at"]} for r in rows]

    assert [(r["partition"], r["offset"]) for r in merged] == sorted((r["partition"], r["offset"]) for r in merged)
    assert marker_times(merged, before) == marker_times(grouped, grouped_before)
    values = {r["key"]: r["value"] for r in merged if not r["marker"] and r["key"] is not None}
    if strategy == "event-time":
        assert values[b"k0"] == b"v0" and b"k3" not in values and {r["key"] for r in merged if r["marker"]} == \
            {b"k3", b"k4", b"k7"}
    else:
        # Markers beat no later record: k3's gave way to its value; k4's and k7's stay.
        assert values[b"k0"] == b"late" and values[b"k3"] == b"too-late" and b"k7" not in values
        assert {r["key"] for r in merged if r["marker"]} == {b"k4", b"k7"}
    assert values[b"k6"] == b"newer" and values[b"new"] == b"n" and values[b"k2"] == b"v2"  # k2: partition 2
    assert sorted(r["value"] for r in merged if r["key"] is None) == [b"n-late", b"n0", b"n1", b"n2"]

    # A ledger the reading tasks wrote (pyarrow) is read by Spark as well: the grouping job's next run on it
    # gives what it gives on a ledger of its own writing.
    third = [("k0", "third", 0, None, [("et", b"9500")]), ("k2", None, 2, None, [("et", b"9500")])]
    kafka.produce(topic, third)
    (after_tasks, _), (after_spark, _) = run(final, True), run(grouping, True)
    assert marker_times(after_tasks, merged) == marker_times(after_spark, grouped)
    assert {r["key"]: r["value"] for r in after_tasks if not r["marker"]}[b"k0"] == b"third"

    # The incremental plan is final: no exchange, no aggregation.
    resolved = ResolvedStrategy.resolve(strategy, "header:et", True)
    manifest = final.ledger_info()
    ledger = final.factory.store.ledger_path(topic, manifest.ledger_id)
    spec = job.job_spec(final.factory.settings, resolved, topic=topic, ranges=[OffsetRange(0, 40, 41)],
                        ledger_files=[str(ledger / f["name"]) for f in manifest.files], output_path="unused",
                        log_start={0: 0, 1: 0, 2: 0}, widths=job.JobWidths(2, 1))
    assert spec.final_reads
    plan = job.build_winners(spark_manager.spark, spec, resolved.strategy)._jdf.queryExecution().executedPlan()
    assert "Exchange" not in plan.toString() and "Aggregate" not in plan.toString(), plan.toString()


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
        kwargs.setdefault("log_start", {})
        spec = job.job_spec(factory.settings, strategy, topic=topic, ranges=ranges, output_path=str(tmp_path),
                            widths=job.JobWidths(2, 1), **kwargs)
        return spec.final_reads, spec

    final, spec = plan_of(ledger_files=[])
    assert final
    plan = job.build_winners(spark_manager.spark, spec, strategy.strategy)._jdf.queryExecution().executedPlan()
    assert "Exchange" not in plan.toString() and "Aggregate" not in plan.toString(), plan.toString()
    # A ledger to merge: in the reading tasks when every partition is named (a task for each) and none has
    # more ledger rows than a task should hold; else grouped.
    every = {0: 0, 1: 0, 2: 0}
    assert job.reads_are_final(strategy.strategy, ranges, ["x.parquet"], every, job.FINAL_READ_MAX_LEDGER_ROWS)
    assert not job.reads_are_final(strategy.strategy, ranges, ["x.parquet"], every,
                                   job.FINAL_READ_MAX_LEDGER_ROWS + 1)
    assert not job.reads_are_final(strategy.strategy, ranges, ["x.parquet"], {})
    # A full rebuild's range is bounded further out under publishing-order (its task spills its windows to
    # disk, and holds the keys it has seen); one that retains null-key records holds them, another order
    # holds rows, a merge holds ledger rows: bounded as before.
    huge = [OffsetRange(p, 0, job.FINAL_READ_MAX_RECORDS + 1) for p in range(3)]
    assert job.reads_are_final(strategy.strategy, huge, [], {})
    huger = [OffsetRange(p, 0, job.FINAL_SPILLING_READ_MAX_RECORDS + 1) for p in range(3)]
    assert not job.reads_are_final(strategy.strategy, huger, [], {})
    assert not job.reads_are_final(strategy.strategy, huge, [], {}, retain_null_key=True)
    assert not job.reads_are_final(strategy.strategy, huge, ["x.parquet"], every)
    assert not job.reads_are_final(ResolvedStrategy.resolve("event-time", "timestamp", False).strategy, huge, [], {})
    assert job.reads_are_final(ResolvedStrategy.resolve("event-time", "timestamp", False).strategy, ranges, [], {})

    service = factory.new_topic_compaction_service(topic)
    compact(service)
    files = _file_keys(service)
    assert len(files) == 3  # one per reading task, each a partition, in partition order
    # Written by the reading tasks themselves (``ledger.parts``), not by Spark's writer.
    assert [f["name"] for f in service.ledger_info().files] == [part_name(p) for p in range(3)]
    assert [row for f in files for row in f] == sorted(row for f in files for row in f)
    final_entries = [entries(service, p) for p in range(3)]
    assert view(service, 3) == last_value_model(records)

    monkeypatch.setattr(job, "reads_are_final", _never)  # the grouping job, for comparison
    compact(service, rebuild=True)
    assert [entries(service, p) for p in range(3)] == final_entries


def _never(*_: Any, **__: Any) -> bool:
    """``job.reads_are_final`` for a run that must take the grouping job."""
    return False


def _read_stage_tasks(spark_manager: Any, ctx: Any) -> list[int]:
    """The tasks of each stage of the Spark jobs a compaction task ran (its job group)."""
    tracker = spark_manager.spark.sparkContext.statusTracker()
    return [tracker.getStageInfo(stage).numTasks for job_id in tracker.getJobIdsForGroup(ctx.task_id)
            for stage in tracker.getJobInfo(job_id).stageIds]


def test_a_small_job_reads_its_partitions_in_one_task_per_core(kafka, make_factory, spark_manager, spark_jobs):
    """Five partitions on the session's cores: each core starts one reading task, which reads its partitions
    one after the other and writes each one's part file; an incremental run carries the ledger rows of the
    partitions without new records in the same tasks."""
    cores = spark_manager.cores
    topic = kafka.topic(partitions=5)
    records = [(f"k{i % 60}", f"v{i}" if i % 11 else None, (i % 60) % 5) for i in range(400)]
    kafka.produce(topic, records)
    service = make_factory().new_topic_compaction_service(topic)
    ctx = compact(service)
    assert _read_stage_tasks(spark_manager, ctx) == [min(cores, 5)]
    assert [f["name"] for f in service.ledger_info().files] == [part_name(p) for p in range(5)]
    assert view(service, 5) == last_value_model(records)
    more = [(f"k{i % 60}", f"w{i}", (i % 60) % 5) for i in range(0, 120, 5)]  # partition 0 only
    kafka.produce(topic, more)
    ctx = compact(service)
    assert not ctx.stats.full_rebuild
    assert _read_stage_tasks(spark_manager, ctx) == [min(cores, 5)]
    assert view(service, 5) == last_value_model(records + more)


def _last_query(spark_manager: Any) -> int:
    """The id of the last query Spark SQL ran (-1: none yet). Its status store keeps the last 1,000 only;
    the ids go on growing."""
    status = spark_manager.spark._jsparkSession.sharedState().statusStore()
    kept = int(status.executionsCount())
    return int(status.executionsList(kept - 1, 1).apply(0).executionId()) if kept else -1


def test_reading_tasks_that_write_their_parts_run_as_one_stage_without_a_query(kafka, make_factory, spark_manager,
                                                                               monkeypatch, spark_jobs):
    """Final reads of a compaction hand no row to Spark: their tasks run as one stage of plain Python tasks
    (``kafka_source.run_writing_tasks``), with no query planned through Spark SQL and the data source (that
    planning cost ~0.05 s a run). A run whose winners Spark groups (a partition read by two tasks) still reads
    through the data source, as a query."""
    topic = kafka.topic(partitions=2)
    records = [(f"k{i % 30}", f"v{i}", i % 2) for i in range(200)]
    kafka.produce(topic, records)
    service = make_factory().new_topic_compaction_service(topic)
    queries = _last_query(spark_manager)
    ctx = compact(service)
    assert _last_query(spark_manager) == queries
    assert _read_stage_tasks(spark_manager, ctx) == [min(spark_manager.cores, 2)]
    assert view(service, 2) == last_value_model(records)

    from compactord.engine import job as engine_job

    monkeypatch.setattr(engine_job, "reads_are_final", _never)  # the grouping job
    compact(service, rebuild=True)
    assert _last_query(spark_manager) > queries
    assert view(service, 2) == last_value_model(records)


def test_the_writing_tasks_seal_their_parts_and_the_driver_reads_none(kafka, make_factory, monkeypatch):
    """Each writing task puts its part durably in the store and leaves the part's manifest entry beside it
    (``parts.write_part``): the driver seals the ledger without reading a part (its read of a part fails
    here), the entries are the files' own, none is left in the ledger, and the ledger verifies. The grouping
    job's Python writer seals its parts the same way (``ledger_io.write_sorted``)."""
    from compactord.engine import job as engine_job
    from compactord.ledger import checksums, manifests
    from compactord.ledger.parts import is_seal

    topic = kafka.topic(partitions=2)
    records = [(f"k{i % 25}", None if i % 11 == 3 else f"v{i}", (i % 25) % 2) for i in range(150)]
    kafka.produce(topic, records)
    factory = make_factory()
    service = factory.new_topic_compaction_service(topic)

    def read_by_the_driver(where: str, objects: object, part: ObjectInfo) -> dict[str, object]:
        raise AssertionError(f"the driver read {part.key} to seal the ledger")

    read_part = manifests._read_part
    monkeypatch.setattr(manifests, "_read_part", read_by_the_driver)
    compact(service)
    monkeypatch.setattr(manifests, "_read_part", read_part)
    manifest = service.ledger_info()
    path = factory.store.ledger_path(topic, manifest.ledger_id)
    assert [f["name"] for f in manifest.files] == [part_name(p) for p in range(2)]
    for entry in manifest.files:
        part = path / entry["name"]
        assert entry["crc32c"] == checksums.file_crc32c(part) and entry["bytes"] == part.stat().st_size
    assert sum(f["rows"] for f in manifest.files) == manifest.records_kept + manifest.markers > 0
    assert not [p.name for p in path.iterdir() if is_seal(p.name)]
    factory.store.verify(topic, manifest.ledger_id)
    assert view(service, 2) == last_value_model(records)

    monkeypatch.setattr(engine_job, "reads_are_final", _never)
    monkeypatch.setattr(manifests, "_read_part", read_by_the_driver)
    compact(service, rebuild=True)
    monkeypatch.setattr(manifests, "_read_part", read_part)
    grouped = service.ledger_info()
    assert grouped.ledger_id > manifest.ledger_id
    assert grouped.files and all(f["name"].endswith("-grouped.snappy.parquet") for f in grouped.files)
    assert not [p.name for p in factory.store.ledger_path(topic, grouped.ledger_id).iterdir() if is_seal(p.name)]
    factory.store.verify(topic, grouped.ledger_id)
    assert view(service, 2) == last_value_model(records)


def test_a_full_rebuild_of_partitions_too_large_to_hold_is_read_whole_by_tasks_that_spill(
        kafka, make_factory, spark_manager, monkeypatch, spark_jobs):
    """A full rebuild under publishing-order reads each partition in one task whatever its size (the tasks
    keep their windows on local disk past a memory budget): with every range over
    ``FINAL_READ_MAX_RECORDS`` and a budget of 0 bytes (every window goes to disk, in the executors' local
    directory), the run is one stage of writing tasks, a part file per partition, and the view is exact.
    An incremental run over such a tail is still grouped: it merges ledger rows, which stay in memory."""
    from compactord.engine import job as engine_job
    from compactord.engine import windows

    monkeypatch.setattr(engine_job, "FINAL_READ_MAX_RECORDS", 10)
    monkeypatch.setattr(windows, "MEMORY_BUDGET_BYTES", 0)
    topic = kafka.topic(partitions=2)
    records = [(f"k{i % 70}", None if i % 13 == 4 else f"v{i}", (i % 70) % 2) for i in range(300)]
    kafka.produce(topic, records)
    service = make_factory().new_topic_compaction_service(topic)
    queries = _last_query(spark_manager)
    ctx = compact(service)
    assert _last_query(spark_manager) == queries  # no query: the writing tasks' one stage
    assert _read_stage_tasks(spark_manager, ctx) == [min(spark_manager.cores, 2)]
    assert [f["name"] for f in service.ledger_info().files] == [part_name(p) for p in range(2)]
    assert view(service, 2) == last_value_model(records)
    assert ctx.stats.spilled_bytes > 0  # the tasks' reports, summed (``compactord_spilled_bytes``)
    more = [(f"k{i % 70}", f"w{i}", (i % 70) % 2) for i in range(40)]
    kafka.produce(topic, more)
    ctx = compact(service)
    assert not ctx.stats.full_rebuild and _last_query(spark_manager) > queries  # grouped, through a query
    assert ctx.stats.spilled_bytes == 0
    assert view(service, 2) == last_value_model(records + more)


def test_the_warm_up_also_plans_a_read_through_the_data_source(spark_manager):
    """The warm-up's compactions run their tasks without the data source (they write their own parts); the
    grouping job and previews read through it, so the warm-up also runs the grouping job once (one query,
    its ledger read and written by Python tasks): the first of those is not the one that starts the data
    source's planner workers."""
    queries = _last_query(spark_manager)
    spark_manager.warm_up()
    assert _last_query(spark_manager) == queries + 1


def test_a_local_driver_jvm_leaves_what_a_job_calls_a_few_thousand_times_to_c1(spark_manager):
    """A local master's driver JVM mostly schedules the reading tasks: C2 compiles only what is called far
    more often than by default (``spark_session.LOCAL_DRIVER_JAVA_OPTIONS``)."""
    from compactord.engine.spark_session import LOCAL_DRIVER_JAVA_OPTIONS

    jvm = spark_manager.spark.sparkContext._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert set(LOCAL_DRIVER_JAVA_OPTIONS.split()) <= set(arguments), arguments
    threshold = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")).getVMOption("Tier4InvocationThreshold")
    assert threshold.getValue() == "100000"


def test_the_closure_cleaners_bytecode_reader_is_compiled_by_c2_during_the_warm_up(tmp_path):
    """Every job's closures go through Spark's closure cleaner, which reads their bytecode with ASM
    (``ClassReader.readCode``, a 5 KB method). Under the local driver's raised C2 thresholds C2 compiled it
    in a burst around the 6th to 9th job after a start (100-240 ms of compiler CPU in each of 2-3 runs), on
    the cores the reading tasks share; its thresholds are scaled down so that C2 compiles it while the
    session warms up. A fresh session (its own process: this one's JVM has run many jobs) holds C2 code of
    it after the warm-up; before, only C1's (tier 3) 20 s after it."""
    if shutil.which("jcmd") is None:
        pytest.skip("jcmd (a JDK's) is not installed: the JVM's compiled code cannot be listed")
    child = subprocess.Popen([sys.executable, "-m", "tests.inprocess.engine.jit_child", str(tmp_path)], cwd=_REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = child.communicate(timeout=240)
    finally:
        if child.poll() is None:  # its JVM is in its process group
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert child.returncode == 0, err[-3000:]
    levels = [line.split()[1].split(",") for line in out.splitlines() if line.startswith("LEVELS ")]
    assert levels and "4" in levels[0], (out, err[-3000:])


def test_python_workers_keep_the_heap_memory_a_task_freed(spark_manager):
    """A reading task allocates and frees the same tens of MB again and again; given back to the kernel
    each time, every page was faulted in and zeroed again (~27,000 page faults in a task of 250,000 records,
    ~8,000 with the pad). In a Python worker, 40 MB freed at the top of the C heap stay there (glibc's
    ``keepcost``: what a trim could give back), instead of being trimmed to glibc's default 128 KiB."""

    def kept_after_free(_: Any) -> list[int]:
        import ctypes

        class MallInfo2(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in (
                "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                "keepcost")]

        libc = ctypes.CDLL(None)
        libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
        libc.free.argtypes = (ctypes.c_void_p,)
        libc.mallinfo2.restype = MallInfo2
        blocks = [0] * 400  # sized first: the list's own storage is not put above the blocks
        for i in range(400):
            blocks[i] = libc.malloc(100 * 1024)  # under the mmap threshold: from the heap
        for block in reversed(blocks):
            libc.free(block)
        return [libc.mallinfo2().keepcost]

    sc = spark_manager.spark.sparkContext
    kept = sc.parallelize(range(spark_manager.cores), spark_manager.cores).mapPartitions(kept_after_free).collect()
    assert kept and all(k >= 30 * 1024 * 1024 for k in kept), kept


def test_python_tasks_talk_to_the_jvm_over_a_unix_domain_socket(spark_manager):
    """Over TCP on loopback every Python task waited ~40 ms on its socket to the JVM (an empty job of two
    tasks: 100-140 ms, 56-88 ms over a Unix domain socket): the session's workers use Unix domain sockets."""

    def socket_families(_: Any) -> list[list[str]]:
        """In a Python task: the address families of the worker's sockets (its line to the JVM among them)."""
        import os
        import socket

        families = set()
        for name in os.listdir("/proc/self/fd"):
            try:
                if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                    continue
                with socket.socket(fileno=os.dup(int(name))) as sock:
                    families.add(sock.family.name)
            except OSError:
                continue  # closed meanwhile (the listing's own descriptor)
        return [sorted(families)]

    sc = spark_manager.spark.sparkContext
    # Workers of their own (pooled by environment): a worker that ran a reading task keeps its TCP connection
    # to the run's channel (engine/channel) until its next run, which is not the line to the JVM.
    sc.environment["COMPACTORD_TEST_SOCKETS"] = str(time.monotonic_ns())
    try:
        families = sc.parallelize(range(spark_manager.cores), spark_manager.cores).mapPartitions(
            socket_families).collect()
    finally:
        del sc.environment["COMPACTORD_TEST_SOCKETS"]
    assert families and all("AF_UNIX" in found and "AF_INET" not in found and "AF_INET6" not in found
                            for found in families), families
