"""A ledger's Parquet part files: their row-group sizing (one rule for Spark's writer and for reading
tasks that write their partition's file themselves), and writing one from Arrow.

Small row groups keep the read API's pruning fine-grained: a page of 1,000 entries decodes one or two
groups of at most ``ROW_GROUP_ROWS`` rows (values that compress well make the byte bound reach far more).
Files are named so that they sort as their rows do: the ledger is sorted by (partition, offset) across
its files, which the read API's bisection assumes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from compactord.ledger.files import TMP_SUFFIX

__all__ = ["ROW_GROUP_BYTES", "ROW_GROUP_ROWS", "is_partial_part", "part_name", "write_part"]

ROW_GROUP_BYTES = 8 * 1024 * 1024
ROW_GROUP_ROWS = 8192
_PARTIAL = ".part-"
# Dictionary pages only for the columns that repeat: on keys and values that rarely do, building a dictionary
# and falling back cost time and bytes (250,000 distinct keys: 0.18 s and 5.8 MB with it, 0.10 s and 5.4 MB).
_DICTIONARY = ["partition", "marker"]
# Offsets and times grow row by row: delta-encoded they take ~1-2 bytes a row instead of 8, which Snappy does
# not find (250,000 distinct keys with 100-byte values: 4.4 MB instead of 7.5, written in 30.7 ms instead of
# 36.5). Every Parquet reader of the last years decodes them (Spark's vectorized reader since 3.3).
_ENCODINGS = dict.fromkeys(("offset", "timestamp", "event_time", "marker_at"), "DELTA_BINARY_PACKED")
# Statistics only where they are read (``row_groups``: a group's partitions and offsets); a key's or a
# value's min and max cost a comparison per row and ~6% of the write.
_STATISTICS = ["partition", "offset"]


def part_name(partition: int) -> str:
    """The file of a Kafka partition's rows, written by the task that read the partition."""
    return f"part-{partition:010d}.snappy.parquet"


def is_partial_part(name: str) -> bool:
    """A part file a task attempt was still writing when it died (``write_part``'s temporary file)."""
    return name.startswith(_PARTIAL) and name.endswith(TMP_SUFFIX)


def write_part(tables: pa.Table | Iterable[pa.Table], directory: Path, name: str) -> None:
    """Write ``tables`` (one table, or tables one after another: their rows in (partition, offset) order) as
    the part file ``name`` of the ledger being written in ``directory``, nothing for no rows. Tables given one
    after another are taken and written one at a time, so that a caller that makes each as it is asked for
    holds one at a time. A hidden temporary file is written and renamed, so that a failed or retried task
    attempt never leaves a partial part under a part's name; the ledger is checksummed and fsynced when the
    run seals it (``manifests.finalize``)."""
    tmp = Path(directory) / f".{name}.{os.getpid()}{TMP_SUFFIX}"
    writer: pq.ParquetWriter | None = None
    try:
        for table in [tables] if isinstance(tables, pa.Table) else tables:
            if not table.num_rows:
                continue
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema, compression="snappy", use_dictionary=_DICTIONARY,
                                          column_encoding=_ENCODINGS, write_statistics=_STATISTICS)
            rows = max(1, min(ROW_GROUP_ROWS, ROW_GROUP_BYTES * table.num_rows // max(1, table.nbytes)))
            writer.write_table(table, row_group_size=rows)
        if writer is None:
            return
        writer.close()
        os.replace(tmp, Path(directory) / name)
    except BaseException:
        if writer is not None:
            # Closing writes the footer, which fails again on a full disk: the first error is the one raised.
            with contextlib.suppress(OSError, pa.ArrowException):
                writer.close()
        tmp.unlink(missing_ok=True)
        raise
