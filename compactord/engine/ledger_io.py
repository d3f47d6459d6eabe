"""The grouping job's ledger bytes, read and written by Spark's Python workers (pyarrow), never by the JVM.

The JVM's Hadoop file system reaches only what it has a connector for (no object store here: no s3a jars),
so a ledger file goes through Python wherever it is: the reading tasks' own parts already did
(``ledger.parts.write_part``, ``ledger.row_groups.partition_rows``); this module does the same for the
job that groups its rows in Spark.

- ``ledger_rows``: the previous ledger's rows as a DataFrame of ``RECORD_SCHEMA``, each task reading a run of
  row groups (the files' order, about equal rows) with pyarrow and handing Arrow batches to Spark
  (``mapInArrow`` over one id per task). Row groups that hold only rows below their partition's log start
  are not read; the job's SQL drops the other rows below it, as it did for the JVM's Parquet scan.
- ``write_sorted``: a DataFrame sorted by (partition, offset) across its Spark partitions written into a
  ledger folder, each task writing its partition's rows as one part file (``write_part``: a temporary
  file, then put in the store, and the seal ``manifests.finalize`` takes) named by the task's partition
  index, so that the files' names sort as their rows do. Rows are cut into row groups of at most ``ROW_GROUP_ROWS``
  rows and ``ROW_GROUP_BYTES`` bytes, as the reading tasks' parts are.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from compactord.engine.worker_store import locate, new_output, spec_store
from compactord.ledger.parts import ROW_GROUP_BYTES, ROW_GROUP_ROWS, write_part
from compactord.ledger.row_groups import FileFacts, RowGroup, ledger_row_groups, open_file
from compactord.model import RECORD_DDL, RECORD_SCHEMA

__all__ = ["LEDGER_READ_TASK_ROWS", "as_records", "grouped_part_name", "ledger_read_tasks", "ledger_rows",
           "map_in_arrow", "row_group_tables", "write_sorted"]

# Ledger rows per reading task at the most, once every core has one: ~65 MB of 130-byte rows, as a task of
# the JVM's Parquet scan took (``spark.sql.files.maxPartitionBytes``, 128 MB of file, ~2:1 compressed).
LEDGER_READ_TASK_ROWS = 500_000
# Rows per Arrow batch a reading task hands to Spark (the JVM converts each batch to rows as it comes): a row
# group's. A ledger of 1,000,000 rows was read in 0.50 s this way, 0.58 s in batches of 65,536 rows and 0.83 s
# in batches of 262,144 (medians, local[2]); the JVM's Parquet scan took 0.37-0.39 s.
_READ_BATCH_ROWS = ROW_GROUP_ROWS

ReadTask = list[tuple[str, list[int]]]  # the row groups one task reads: (file, indexes), in the files' order


def grouped_part_name(index: int) -> str:
    """The part file of the ``index``-th Spark partition of a sorted job: names sort as the indexes do."""
    return f"part-{index:010d}-grouped.snappy.parquet"


def ledger_read_tasks(groups: Sequence[RowGroup], log_start: Mapping[int, int], cores: int) -> list[ReadTask]:
    """The row groups ``groups`` (in the files' order) cut into runs of about equal rows: at least one per
    core when there are groups enough, and none over ``LEDGER_READ_TASK_ROWS`` rows unless a group is.
    A group that holds one partition's rows only, all below its log start, is left out."""
    live = [g for g in groups if g.num_rows and not _below_log_start(g, log_start)]
    if not live:
        return []
    total = sum(g.num_rows for g in live)
    count = min(len(live), max(cores, -(-total // LEDGER_READ_TASK_ROWS)))
    share = -(-total // count)
    tasks: list[ReadTask] = []
    task: ReadTask = []
    rows = 0
    for g in live:
        if rows >= share and len(tasks) < count - 1:
            tasks.append(task)
            task, rows = [], 0
        path = str(g.file)
        if task and task[-1][0] == path:
            task[-1][1].append(g.index)
        else:
            task.append((path, [g.index]))
        rows += g.num_rows
    tasks.append(task)
    return tasks


def _below_log_start(g: RowGroup, log_start: Mapping[int, int]) -> bool:
    # The offset bounds mix partitions when a group spans several: only trusted otherwise (``RowGroup.may_hold``).
    if g.partition_min != g.partition_max:
        return False
    partition = int(g.partition_min)
    return not g.may_hold(partition, log_start.get(partition, 0))


def ledger_rows(spark: Any, files: Sequence[str], log_start: Mapping[int, int], cores: int,
                access: Mapping[str, Any] | None = None, facts: Mapping[str, FileFacts] | None = None) -> Any | None:
    """The rows of the ledger files ``files`` (markers included) as a DataFrame of ``RECORD_DDL``, read by
    Python tasks; None when no row group may hold a row at or above its partition's log start. ``access``:
    the ledger root whose keys ``files`` are, and the run's channel (``worker_store.spec_store``; no store:
    local paths); ``facts``: the files' sizes and checksums (``row_groups.file_footer``)."""
    access = dict(access or {})
    tasks = ledger_read_tasks(ledger_row_groups(files, spec_store(access), facts), log_start, cores)
    if not tasks:
        return None
    ids = spark.range(0, len(tasks), 1, len(tasks))
    return map_in_arrow(ids, functools.partial(_read_tasks, tasks, access), RECORD_DDL)


def _read_tasks(tasks: Sequence[ReadTask], access: Mapping[str, Any],
                ids: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    store = spec_store(access)
    for batch in ids:
        for task_id in batch.column(0).to_pylist():
            for name, indexes in tasks[task_id]:
                with open_file(store, name) as f, pq.ParquetFile(f) as pf:
                    for rows in pf.iter_batches(_READ_BATCH_ROWS, row_groups=indexes, use_threads=False):
                        yield as_records(rows)


def map_in_arrow(df: Any, func: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]], schema: str) -> Any:
    """``df.mapInArrow(func, schema)`` without pandas. PySpark builds that UDF through ``pandas_udf``, which
    insists on pandas although neither side of a map over Arrow batches uses it (the Python worker's
    ``SQL_MAP_ARROW_ITER_UDF`` path is pyarrow alone); pandas is no dependency of compactord's."""
    from pyspark.sql import DataFrame
    from pyspark.sql.udf import _create_udf
    from pyspark.util import PythonEvalType

    udf = _create_udf(func, schema, PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
    column = udf(*[df[name] for name in df.columns])
    return DataFrame(df._jdf.mapInArrow(column._jc, False, None), df.sparkSession)


def as_records(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with ``RECORD_SCHEMA``'s columns and types exactly (a ledger file written by another writer,
    or Spark's Arrow batches, may name a list's item or flag nullability otherwise)."""
    if batch.schema.equals(RECORD_SCHEMA):
        return batch
    return batch.select(RECORD_SCHEMA.names).cast(RECORD_SCHEMA)


def write_sorted(ordered: Any, output_path: str, access: Mapping[str, Any] | None = None) -> None:
    """Write ``ordered`` (sorted by (partition, offset) within and across its Spark partitions) into the new
    ledger folder ``output_path`` (a key prefix of the root ``access`` names, or a local path), one part file
    per non-empty Spark partition, from Spark's Python workers."""
    access = dict(access or {})
    new_output(access.get("store"), output_path)  # one that holds something already is an error
    # The JVM's count of the tasks' (empty) output runs the job without serving results to this process.
    map_in_arrow(ordered, functools.partial(_write_partition, output_path, access), "written bigint").count()


def _write_partition(output_path: str, access: Mapping[str, Any],
                     batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    context = TaskContext.get()
    index = context.partitionId() if context is not None else 0
    store, key = locate(spec_store(access), f"{output_path}/{grouped_part_name(index)}")
    write_part(row_group_tables(batches), store, key)
    return iter(())


def row_group_tables(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.Table]:
    """``batches``' rows (``RECORD_SCHEMA``'s columns) in tables of at most ``ROW_GROUP_ROWS`` rows and about
    ``ROW_GROUP_BYTES`` bytes, each of which ``write_part`` writes as one row group: Spark hands its rows
    over in batches of its own size (``spark.sql.execution.arrow.maxRecordsPerBatch``), which would
    otherwise each end in a short row group."""
    pending: list[pa.RecordBatch] = []
    rows = size = 0  # size: the pending slices' bytes, as ``write_part`` measures its tables
    for batch in batches:
        batch = as_records(batch)
        row_bytes = max(1, batch.nbytes) / max(1, batch.num_rows)
        start = 0
        while start < batch.num_rows:
            fits = max(1, int((ROW_GROUP_BYTES - size) / row_bytes))
            take = min(batch.num_rows - start, ROW_GROUP_ROWS - rows, fits)
            piece = batch.slice(start, take)
            while take > 1 and size + piece.nbytes > ROW_GROUP_BYTES:  # the estimate was over: fewer rows
                take = max(1, min(take - 1, take * (ROW_GROUP_BYTES - size) // piece.nbytes))
                piece = batch.slice(start, take)
            if pending and size + piece.nbytes > ROW_GROUP_BYTES:  # not one more row fits
                yield pa.Table.from_batches(pending, schema=RECORD_SCHEMA)
                pending, rows, size = [], 0, 0
                continue
            pending.append(piece)
            rows, size, start = rows + take, size + piece.nbytes, start + take
            if rows >= ROW_GROUP_ROWS or size >= ROW_GROUP_BYTES:
                yield pa.Table.from_batches(pending, schema=RECORD_SCHEMA)
                pending, rows, size = [], 0, 0
    if pending:
        yield pa.Table.from_batches(pending, schema=RECORD_SCHEMA)
