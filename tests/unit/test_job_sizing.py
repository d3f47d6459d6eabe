"""The shuffle widths of a compaction job, sized from the rows it reads."""

from __future__ import annotations

import pytest

from compactord.engine.job import shuffle_partitions_for
from compactord.engine.kafka_source import OffsetRange, pack_ranges, read_tasks


@pytest.mark.parametrize(
    ("rows", "cores", "expected"),
    [
        (0, 2, (1, 1)),  # an empty topic still gets one partition and one (empty) file
        (99_999, 8, (1, 1)),  # small jobs stay on one partition: each extra one costs a task
        (110_000, 2, (2, 1)),  # an incremental run of the benchmark: both cores aggregate, one file
        (1_000_000, 2, (2, 2)),
        (1_000_000, 64, (10, 2)),  # a cluster: at least 100k rows per aggregation partition
        (5_000_000, 2, (10, 10)),  # 500k rows per partition, whatever the cores
        (5_000_001, 2, (11, 11)),
    ],
)
def test_widths(rows, cores, expected):
    assert shuffle_partitions_for(rows, cores) == expected


def _ranges(*sizes: int) -> list[OffsetRange]:
    return [OffsetRange(p, 0, size) for p, size in enumerate(sizes)]


@pytest.mark.parametrize(
    ("sizes", "cores", "expected"),
    [
        ((250_000,) * 4, 2, 2),  # the benchmark: a task per core, each reads two partitions
        ((25_000,) * 4 + (0,) * 4, 2, 2),  # an incremental run: partitions without new records ride along
        ((100,), 8, 1),  # never more tasks than ranges
        ((2_500_000,) * 4, 2, 4),  # large ranges keep a task each: their start costs little beside them
        ((400_000,) * 10, 2, 4),  # 4,000,000 records: tasks of about READ_TASK_RECORDS
        ((10,) * 64, 16, 16),  # a cluster's cores
    ],
)
def test_a_small_job_reads_in_a_task_per_core(sizes, cores, expected):
    assert read_tasks(_ranges(*sizes), cores) == expected


def test_ranges_are_packed_into_tasks_of_about_equal_records_every_range_once():
    ranges = [(p, 0, size) for p, size in enumerate([500, 100, 400, 300, 200, 0, 0])]
    groups = pack_ranges(ranges, 2)
    assert sorted(r for g in groups for r in g) == sorted(ranges)
    assert [sum(e - s for _, s, e in g) for g in groups] == [800, 700]  # the heaviest first
    assert groups[0][0] == (0, 0, 500)  # each task reads its largest range first
    assert pack_ranges(ranges, 0) == [[r] for r in ranges] == pack_ranges(ranges, 7) == pack_ranges(ranges, 9)
    assert pack_ranges([], 2) == []


def _plan(strategy: str, cores: int, partitions: int = 4, records: int = 250_000):
    from compactord.engine.planning import plan_compaction
    from compactord.engine.strategies import ResolvedStrategy
    from compactord.model import PartitionOffsets

    return plan_compaction(
        "t", offsets={p: PartitionOffsets(p, 0, records) for p in range(partitions)}, previous=None,
        previous_dir=None, strategy=ResolvedStrategy.resolve(strategy, "timestamp", False), rebuild=False,
        reasons=[], cores=cores, ranges_per_core=2)


@pytest.mark.parametrize("cores", [2, 4, 8, 64])
def test_final_reads_keep_each_partition_whole_whatever_the_slots(cores):
    """An ordered strategy's partitions are read by one task each, however many slots Spark has: a split
    partition would have to be grouped in Spark."""
    plan = _plan("publishing-order", cores)
    assert sorted(r.partition for r in plan.ranges) == [0, 1, 2, 3]
    assert all(r.size == 250_000 for r in plan.ranges)


def test_a_grouping_run_still_splits_partitions_for_the_cores():
    plan = _plan("first-value", cores=4)
    assert len(plan.ranges) == 8
    assert sum(r.size for r in plan.ranges) == 1_000_000


def test_a_partition_past_the_final_read_bound_is_split():
    from compactord.engine.job import FINAL_SPILLING_READ_MAX_RECORDS

    plan = _plan("publishing-order", cores=2, partitions=1, records=FINAL_SPILLING_READ_MAX_RECORDS + 1)
    assert len(plan.ranges) > 1
