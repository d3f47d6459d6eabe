"""The grouping job's ledger I/O in Python: which row groups each reading task reads, and how the sorted rows
Spark hands over are cut into row groups (``engine.ledger_io``)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compactord.engine import ledger_io
from compactord.engine.ledger_io import grouped_part_name, ledger_read_tasks, row_group_tables
from compactord.ledger.parts import ROW_GROUP_BYTES, ROW_GROUP_ROWS, read_seal, seal_name, write_part
from compactord.ledger.row_groups import RowGroup, ledger_row_groups
from compactord.model import RECORD_SCHEMA
from compactord.storage import LocalStore


def _batch(rows: int, value_bytes: int, first: int = 0) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"partition": 0, "offset": first + i, "key": b"k%d" % (first + i), "value": b"v" * value_bytes}
         for i in range(rows)], schema=RECORD_SCHEMA)


def _group(file: int, index: int, partition: int, first: int, rows: int = 100) -> RowGroup:
    return RowGroup(Path(f"part-{file}"), file, index, rows, partition, partition, first, first + rows - 1)


@pytest.mark.parametrize(("value_bytes", "batch_rows"), [(100, 10_000), (3_000, 2_000), (20_000, 700)])
def test_the_rows_spark_hands_over_become_whole_row_groups(tmp_path, value_bytes, batch_rows):
    """Spark's batches (10,000 rows by default) are cut at the row-group bounds: every group of the part
    but its last is full by rows or bytes, and none is over them."""
    total = 3 * batch_rows
    batches = [_batch(batch_rows, value_bytes, first) for first in range(0, total, batch_rows)]
    write_part(row_group_tables(iter(batches)), LocalStore(tmp_path), "part-0.parquet")
    meta = pq.read_metadata(tmp_path / "part-0.parquet")
    groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert sum(groups) == total and len(groups) > 1
    row_bytes = batches[0].nbytes / batch_rows
    full = min(ROW_GROUP_ROWS, int(ROW_GROUP_BYTES / row_bytes))
    assert all(full * 0.98 <= rows <= full for rows in groups[:-1]), groups
    assert 0 < groups[-1] <= full
    table = pq.read_table(tmp_path / "part-0.parquet", columns=["offset"])
    assert table["offset"].to_pylist() == list(range(total))
    store = LocalStore(tmp_path)
    assert read_seal(store.head("part-0.parquet"), store.get(seal_name("part-0.parquet")))["rows"] == total


def test_a_row_larger_than_a_group_is_a_group_of_its_own():
    tables = list(row_group_tables([_batch(1, 10), _batch(1, ROW_GROUP_BYTES * 2, 1), _batch(2, 10, 2)]))
    assert [t.num_rows for t in tables] == [1, 1, 2]


def test_the_reading_tasks_split_the_row_groups_evenly_in_file_order(monkeypatch):
    groups = [_group(f, i, 0, (f * 5 + i) * 100) for f in range(4) for i in range(5)]  # 2,000 rows
    tasks = ledger_read_tasks(groups, {}, cores=3)
    assert len(tasks) == 3
    read = [(path, i) for task in tasks for path, indexes in task for i in indexes]
    assert read == [(str(g.file), g.index) for g in groups]  # each group once, in order
    assert max(sum(len(ix) for _, ix in t) for t in tasks) - min(sum(len(ix) for _, ix in t) for t in tasks) <= 1
    monkeypatch.setattr(ledger_io, "LEDGER_READ_TASK_ROWS", 500)
    assert len(ledger_read_tasks(groups, {}, cores=1)) == 4  # past the rows a task takes: more tasks
    assert len(ledger_read_tasks(groups[:2], {}, cores=8)) == 2  # no more tasks than groups


def test_groups_wholly_below_their_log_start_are_not_read():
    groups = [_group(0, 0, 0, 0), _group(0, 1, 0, 100), _group(1, 0, 1, 0),
              RowGroup(Path("part-2"), 2, 0, 100, 0, 1, 0, 50)]  # spans partitions: its offsets say nothing
    tasks = ledger_read_tasks(groups, {0: 150, 1: 100}, cores=1)
    assert tasks == [[("part-0", [1]), ("part-2", [0])]]
    assert ledger_read_tasks(groups[:1], {0: 100}, cores=1) == []


def test_the_grouped_parts_sort_as_their_indexes():
    names = [grouped_part_name(i) for i in (0, 1, 9, 10, 123, 100_000)]
    assert sorted(names) == names and all(n.startswith("part-") and n.endswith(".parquet") for n in names)


def test_a_ledger_written_by_another_writer_reads_as_the_record_schema(tmp_path):
    """Parts written before (Spark's writer: other nullability, another list item name) are cast."""
    other = pa.schema([pa.field(f.name, f.type, nullable=f.name != "offset") for f in RECORD_SCHEMA])
    table = pa.Table.from_batches([_batch(3, 5)]).cast(other)
    pq.write_table(table, tmp_path / "old.parquet")
    [task] = ledger_read_tasks(ledger_row_groups([tmp_path / "old.parquet"]), {}, cores=1)
    batches = list(ledger_io._read_tasks([task], {}, [pa.RecordBatch.from_pydict({"id": pa.array([0], pa.int64())})]))
    assert all(b.schema.equals(RECORD_SCHEMA) for b in batches)
    assert pa.Table.from_batches(batches)["offset"].to_pylist() == [0, 1, 2]
