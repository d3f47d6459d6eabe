"""What an incremental run's reading task holds in Arrow (see #40): a partition's ledger rows read from a part file
the real writer wrote (``row_groups.partition_rows``), its tail merged in (``merge.merge_into_ledger``), and what
the task gives back once its part is written (``range_task.RangeReadTask``).

Peaks are of Arrow's allocations, counted by a proxy of the default pool that is the default during the call:
bytes, not time, and with a margin over what the rows themselves take."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pytest

from compactord.engine.deletions import DeletionRules
from compactord.engine.merge import columns_to_batch, merge_into_ledger
from compactord.engine.range_task import RangeReadTask
from compactord.engine.strategies import FirstValue, plan_for
from compactord.engine.strategies.publishing_order import reduce_last_offset
from compactord.ledger.parts import part_name, write_part
from compactord.ledger.row_groups import FileSlice, ledger_row_groups, partition_groups, partition_rows
from compactord.model import RECORD_SCHEMA
from compactord.storage import LocalStore

T = TypeVar("T")

ROWS = 120_000  # 15 row groups of the writer's 8,192 rows
VALUE = b"v" * 100
# A proxy pool frees what it allocated: each one outlives every buffer it gave (a handful of small objects).
_POOLS: list[pa.MemoryPool] = []


def peak_of(call: Callable[[], T]) -> tuple[T, int]:
    """``call()``'s result and the peak of Arrow's bytes allocated during it."""
    real = pa.default_memory_pool()
    proxy = pa.proxy_memory_pool(real)
    _POOLS.append(proxy)
    pa.set_memory_pool(proxy)
    try:
        result = call()
    finally:
        pa.set_memory_pool(real)
    return result, proxy.max_memory()


def rows_of(offsets: range, keys: Callable[[int], bytes | None], value: bytes | None = VALUE) -> pa.Table:
    """Rows of partition 0 at ``offsets``, the key of each from its offset."""
    stamps = list(offsets)
    batch = columns_to_batch(0, stamps, stamps, [keys(o) for o in offsets], [value] * len(offsets),
                             [None] * len(offsets), stamps)
    return pa.Table.from_batches([batch], RECORD_SCHEMA)


@pytest.fixture
def ledger(tmp_path: Path) -> list[FileSlice]:
    """Partition 0's row groups in a part file of ``ROWS`` rows (keys ``k<offset>``) by the real writer."""
    write_part(rows_of(range(ROWS), lambda o: b"k%d" % o), LocalStore(tmp_path), part_name(0))
    return partition_groups(ledger_row_groups([tmp_path / part_name(0)]), 0)


def test_a_partition_s_ordered_rows_are_read_without_a_copy_of_them(ledger: list[FileSlice]) -> None:
    """Each row group read is the partition's rows as they are: neither a filter that keeps every row nor a sort
    of rows already in offset order copies them, and no group stays held past its use."""
    rows, peak = peak_of(lambda: partition_rows(ledger, 0, 0))
    assert rows["offset"].to_pylist() == list(range(ROWS))
    assert peak < 1.3 * rows.nbytes, f"peak {peak:,} B for {rows.nbytes:,} B of rows"

    later, peak = peak_of(lambda: partition_rows(ledger, 0, ROWS - 20_000))  # a log start inside a row group
    assert later["offset"].to_pylist() == list(range(ROWS - 20_000, ROWS))
    assert peak < 1.3 * later.nbytes + 2 * rows.nbytes / len(ledger[0].indexes)  # and one group filtered


def test_a_tail_merged_into_ordered_ledger_rows_copies_them_once_at_most(ledger: list[FileSlice]) -> None:
    """The tail's rows follow the ledger's: none of them contested, the merge is the two joined, without a copy;
    some contested, the ledger's other rows are copied once (a sort of what is in order copied them twice
    more)."""
    rows = partition_rows(ledger, 0, 0)
    new = rows_of(range(ROWS, ROWS + 1_000), lambda o: b"new%d" % o)
    merged, peak = peak_of(lambda: merge_into_ledger(new, rows, reduce_last_offset))
    assert merged.num_rows == ROWS + 1_000 and merged["offset"].to_pylist() == list(range(ROWS + 1_000))
    assert peak < 0.05 * rows.nbytes, f"peak {peak:,} B for {rows.nbytes:,} B of ledger rows"

    updates = rows_of(range(ROWS, ROWS + 1_000), lambda o: b"k%d" % ((o - ROWS) * 97), b"u")
    merged, peak = peak_of(lambda: merge_into_ledger(updates, rows, reduce_last_offset))
    assert merged.num_rows == ROWS and merged["offset"].to_pylist() == sorted(merged["offset"].to_pylist())
    assert peak < 1.2 * rows.nbytes, f"peak {peak:,} B for {rows.nbytes:,} B of ledger rows"


def test_ledger_rows_that_win_stay_in_their_place_and_the_rest_is_copied_once(ledger: list[FileSlice]) -> None:
    """Under a strategy whose ledger rows can win (first-value: a key's first record), the winners that come
    from the ledger are put back among its rows, in offset order, by sorting only their row group; and a tail's
    row that is not its key's first is dropped."""
    rows = partition_rows(ledger, 0, 0)
    reduce = plan_for(FirstValue()).reducer
    contested = [o * 3_001 % ROWS for o in range(500)]
    tail = rows_of(range(ROWS, ROWS + 1_000),
                   lambda o: b"k%d" % contested[o - ROWS] if o - ROWS < 500 else b"new%d" % o, b"t")
    merged, peak = peak_of(lambda: merge_into_ledger(tail, rows, reduce))
    assert peak < 1.3 * rows.nbytes, f"peak {peak:,} B for {rows.nbytes:,} B of ledger rows"
    # Every ledger row as it was, in its place, then each new key's row.
    assert merged.equals(pa.concat_tables([rows, tail.slice(500)]))
    gaps = pa.concat_tables([rows.slice(0, 0), rows.slice(0, 9_000), rows.slice(0, 0), rows.slice(9_000)])
    assert merge_into_ledger(tail, gaps, reduce).equals(merged)  # chunks without rows between the groups'


def test_a_task_gives_its_memory_back_to_the_system_once_its_part_is_written(ledger: list[FileSlice],
                                                                               tmp_path: Path) -> None:
    """A task that merged a partition's ledger rows and wrote its part leaves the pool holding nothing it freed:
    the process's resident memory is back near where it was, not at the task's peak."""
    spec: dict[str, Any] = {
        "strategy": "publishing-order", "retain_null_key": False, "batch_records": 10_000,
        "event_time_source": "timestamp", "client": {}, "topic": "t", "final": True,
        "ledger_groups": {"0": [tuple(s) for s in ledger]}, "log_start": {"0": 0},
        "write_to": str(tmp_path / "out"), "deletion_rules": DeletionRules(0, 0, False).to_json(),
    }
    (tmp_path / "out").mkdir()
    # A partition without new records: the task merges nothing, applies the rules and writes its part. Once
    # first, so that what a first call sets up for good is not counted.
    assert list(RangeReadTask(spec, 0, 5, 5).run()) == []
    pa.default_memory_pool().release_unused()
    before, held = _rss(), pa.total_allocated_bytes()
    assert list(RangeReadTask(spec, 0, 5, 5).run()) == []
    assert (tmp_path / "out" / part_name(0)).exists() and pa.total_allocated_bytes() == held
    grown = _rss() - before
    assert grown < 8 << 20, f"the process kept {grown:,} B of its task's memory"


def _rss() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
