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
                writer = pq.ParquetWriter(tmp, table.schema, compression="snappy", use_dictionary=_DICTIONARY)
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
