"""The shuffle widths of a compaction job, sized from the rows it reads."""

from __future__ import annotations

import pytest

from compactord.engine.job import shuffle_partitions_for


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
