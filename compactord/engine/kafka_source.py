"""The raw reader: a PySpark Python data source over Kafka offset ranges (format ``compactord_kafka``).

The Spark Kafka connector jar is not available (no Maven), so Kafka is read inside Spark's Python
workers, with librdkafka (confluent-kafka, ``kafka_fetch/``).
The driver fixes every range's end before the job (``kafka/admin.py``); records produced during the run
are left for the next one.

- One reading task per (Kafka partition, offset range); where a run groups its rows in Spark anyway, large
  partitions are split so that every core works (``plan_ranges``); a run whose reads are final reads each
  partition in one task. A small job's ranges are packed into one task per core
  (``read_tasks``, ``pack_ranges``), read one after the other: each Spark task costs a fixed start.
- Each range is read by a ``range_task.RangeReadTask`` (read_committed, the end reached by position, a
  key's losers dropped in the task, final reads, progress and cancel over the run's channel); the next
  range's reader is opened while one reads.
- Rows leave as Arrow record batches (``RECORD_SCHEMA``). Where the tasks write their partitions' part
  files themselves and hand no row over, they run as plain Python tasks instead (``run_writing_tasks``).
"""

from __future__ import annotations

import functools
import heapq
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from compactord.engine.channel.task import close_current
from compactord.engine.kafka_fetch import RangeReader
from compactord.engine.range_task import RangeReadTask
from compactord.model import RECORD_DDL

__all__ = ["FORMAT", "KafkaRangeDataSource", "OffsetRange", "RangeReadTask", "pack_ranges", "plan_ranges",
           "read_tasks", "run_task_groups", "run_writing_tasks", "run_writing_tasks_in_driver", "task_groups_rdd",
           "write_ranges"]

FORMAT = "compactord_kafka"
# Records a Spark task reads, at the least, before a job's ranges get a task each (``read_tasks``): a
# task's fixed costs (its launch, a consumer's connection and first fetch) were ~0.1 s a wave here, against
# ~0.3 s of reading 250,000 records.
READ_TASK_RECORDS = 1_000_000


@dataclass(frozen=True, slots=True)
class OffsetRange:
    partition: int
    start: int  # inclusive
    end: int  # exclusive

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def plan_ranges(ranges: Sequence[OffsetRange], cores: int, per_core: int, min_size: int = 20_000, *,
                whole_partitions: bool = False) -> list[OffsetRange]:
    """Split ranges so that there are about ``cores * per_core`` of them, none smaller than ``min_size``.

    ``whole_partitions``: the run's reads can be final (``job.reads_are_final``) if each partition is read by
    one task: no range is split. A split partition's rows must then be grouped in Spark (a shuffle, and the
    ledger written by the JVM), which cost more than the split's parallel reads gained: a full compaction of
    4 partitions took 2.3x one read of the topic with ``local[4]`` on 2 cores (8 ranges, grouped), against
    1.06x with ``local[2]`` (4 ranges, final). Spark's slots are not cores (a cluster's executors may be given
    more than they have, or share them), so how many slots there are must not decide it.
    """
    live = [r for r in ranges if r.size > 0]
    total = sum(r.size for r in live)
    if not live:
        return []
    if whole_partitions:
        return sorted(live, key=lambda r: -r.size)
    target = max(len(live), cores * per_core)
    chunk = max(min_size, -(-total // target))
    out: list[OffsetRange] = []
    for r in live:
        pieces = max(1, round(r.size / chunk))
        step = -(-r.size // pieces)
        out.extend(OffsetRange(r.partition, s, min(s + step, r.end)) for s in range(r.start, r.end, step))
    # Largest first, so that the longest tasks start early.
    return sorted(out, key=lambda r: -r.size)


def read_tasks(ranges: Sequence[OffsetRange], cores: int) -> int:
    """How many Spark tasks read ``ranges`` on ``cores`` cores: one per range, unless the job is small
    (under ``READ_TASK_RECORDS`` a task): then one per core, so that each core starts one task only."""
    total = sum(r.size for r in ranges)
    return min(len(ranges), max(cores, -(-total // READ_TASK_RECORDS)))


Range = tuple[int, int, int]  # (partition, start, end) as the spec carries it


def pack_ranges(ranges: Sequence[Range], tasks: int) -> list[list[Range]]:
    """``ranges`` in ``tasks`` groups of about equal records (the largest range first into the lightest
    group), the heaviest group first; one range a group when ``tasks`` is 0 or at least their number."""
    if tasks <= 0 or tasks >= len(ranges):
        return [[r] for r in ranges]
    groups: list[tuple[int, int, list[Range]]] = [(0, i, []) for i in range(tasks)]
    for r in sorted(ranges, key=lambda r: r[1] - r[2]):
        load, i, group = heapq.heappop(groups)
        group.append(r)
        heapq.heappush(groups, (load + max(0, r[2] - r[1]), i, group))
    return [group for _, _, group in sorted(groups, key=lambda g: (-g[0], g[1])) if group]


class RangePartition(InputPartition):
    """One Spark task: the ranges it reads, one after the other."""

    def __init__(self, index: int, ranges: list[Range]) -> None:
        super().__init__(index)
        self.ranges = ranges


def run_writing_tasks(spark: Any, spec: dict[str, Any]) -> None:
    """Run the reading tasks of ``spec`` when they write their partitions' part files themselves and hand no
    row to Spark (final reads of a compaction): one stage of plain Python tasks, one per group of ranges
    (``pack_ranges``). A job through the data source planned its load, its partitions and a ``noop``
    write through Spark's SQL planner and its Python planner workers first: an empty job took 205 ms
    that way and 151 ms this way (medians of 10, alternating, on 2 cores).

    The job is the JVM's ``count`` of the tasks' (empty) output. PySpark's own actions (``foreachPartition``,
    ``collect``) end in ``collectAndServe``, which serves the results to the driver's Python over a socket of
    their own: an empty job of two tasks took 34.0 ms that way and 29.2 ms this way (medians of 75 each, in
    alternating blocks of 15, warm session)."""
    run_task_groups(spark, [p.ranges for p in KafkaRangeReader(spec).partitions()],
                    functools.partial(_write_groups, spec))


def run_writing_tasks_in_driver(spec: dict[str, Any]) -> None:
    """Run the writing tasks of ``spec`` on the calling thread, in the driver, one range after the other: the
    same ``RangeReadTask`` code as ``run_writing_tasks``' Spark tasks (the same part files, progress, cancel and
    secrets over the run's channel), without a Spark job. For a small run, whose job's fixed cost (its submission,
    a worker's task, the results) outweighs its reading (``compactionDriverRunMaxRecords``)."""
    ranges = [(int(p), int(s), int(e)) for p, s, e in spec["ranges"]]
    try:
        write_ranges({**spec, "in_driver": True}, ranges)
    finally:
        close_current()


def run_task_groups(spark: Any, groups: Sequence[Any], task: Callable[[Iterator[Any]], Iterator[Any]]) -> None:
    """One stage of plain Python tasks: ``task`` is given its group (one of ``groups``) and hands nothing back."""
    if groups:
        task_groups_rdd(spark, groups, task).count()


def task_groups_rdd(spark: Any, groups: Sequence[Any], task: Callable[[Iterator[Any]], Iterator[Any]]) -> Any:
    """The JVM's RDD of ``run_task_groups``' tasks (``groups`` not empty), its job not submitted yet: ``count()``
    runs it."""
    return spark.sparkContext.parallelize(groups, len(groups)).mapPartitions(task)._jrdd


def _write_groups(spec: dict[str, Any], groups: Iterator[list[Range]]) -> Iterator[Any]:
    for ranges in groups:
        write_ranges(spec, ranges)
    return iter(())


def write_ranges(spec: dict[str, Any], ranges: Sequence[Range],
                 opened: dict[tuple[int, int], RangeReader] | None = None) -> None:
    """A writing task's ranges, read one after the other (``KafkaRangeReader.read_ranges``)."""
    for _ in KafkaRangeReader(spec).read_ranges(ranges, opened or {}):
        raise RuntimeError("a writing task handed rows over")  # its spec names no folder to write to


class KafkaRangeDataSource(DataSource):
    """Options: ``spec`` (JSON): client config (no secret: the tasks get those over the run's channel), topic,
    ranges, strategy, event-time source, null-key policy, batch size, the run's channel."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return RECORD_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return KafkaRangeReader(json.loads(self.options["spec"]))


class KafkaRangeReader(DataSourceReader):
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec

    def partitions(self) -> Sequence[RangePartition]:
        ranges = [(int(p), int(s), int(e)) for p, s, e in self.spec["ranges"]]
        return [RangePartition(i, group) for i, group in enumerate(pack_ranges(ranges, self.spec.get("read_tasks", 0)))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            return  # Spark reads one placeholder partition when ``partitions()`` is empty
        yield from self.read_ranges(partition.ranges, {})

    def read_ranges(self, ranges: Sequence[Range], opened: dict[tuple[int, int], RangeReader]
                    ) -> Iterator[pa.RecordBatch]:
        """Read ``ranges`` one after the other. ``opened``: readers already open at (partition, start), each
        taken by the range that starts there (``early_start``); the task closes those no range takes."""
        # The next range's reader is opened while this one reads: librdkafka connects and fetches on its own
        # threads, so that its start (23-88 ms to a first record here) is not waited for between ranges.
        readers: dict[int, RangeReader | None] = {}  # opened, not yet handed to their task
        try:
            tasks = [RangeReadTask(self.spec, p, start, end) for p, start, end in ranges]
            for i, task in enumerate(tasks):
                for j in range(i, min(i + 2, len(tasks))):
                    if j not in readers:
                        ahead = opened.pop((tasks[j].partition, tasks[j].start), None)
                        readers[j] = tasks[j].open_ahead() if ahead is None else tasks[j].take_ahead(ahead)
                yield from task.run(readers.pop(i))
        finally:
            left = [*readers.values(), *opened.values()]
            opened.clear()  # closed here, once
            for reader in left:
                if reader is not None:
                    reader.close()
