"""A ledger's Parquet part files: their row-group sizing (one rule for Spark's writer and for reading
tasks that write their partition's file themselves), and writing one from Arrow with its manifest entry
beside it (``write_part``, ``read_seal``).

Small row groups keep the read API's pruning fine-grained: a page of 1,000 entries decodes one or two
groups of at most ``ROW_GROUP_ROWS`` rows (values that compress well make the byte bound reach far more).
Files are named so that they sort as their rows do: the ledger is sorted by (partition, offset) across
its files, which the read API's bisection assumes.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from compactord.ledger.files import TMP_SUFFIX, file_crc32c, fsync_path

__all__ = ["ROW_GROUP_BYTES", "ROW_GROUP_ROWS", "is_partial_part", "is_seal", "part_name", "read_seal", "seal_name",
           "write_part"]

ROW_GROUP_BYTES = 8 * 1024 * 1024
ROW_GROUP_ROWS = 8192
_PARTIAL = ".part-"
_SEAL_SUFFIX = ".seal.json"
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
    """A part file, or the entry beside it (``seal_name``), that a task attempt was still writing when it died
    (``write_part``'s temporary files)."""
    return name.startswith(_PARTIAL) and name.endswith(TMP_SUFFIX)  # a seal's name is its part's, dotted


def seal_name(name: str) -> str:
    """The hidden file in which the task that wrote part ``name`` describes it (``write_part``)."""
    return f".{name}{_SEAL_SUFFIX}"


def is_seal(name: str) -> bool:
    return name.startswith(".") and name.endswith(_SEAL_SUFFIX)


def write_part(tables: pa.Table | Iterable[pa.Table], directory: Path, name: str) -> None:
    """Write ``tables`` (one table, or tables one after another: their rows in (partition, offset) order) as
    the part file ``name`` of the ledger being written in ``directory``, nothing for no rows. Tables given one
    after another are taken and written one at a time, so that a caller that makes each as it is asked for
    holds one at a time. A hidden temporary file is written and renamed, so that a failed or retried task
    attempt never leaves a partial part under a part's name.

    The task seals its own part: it fsyncs the file and leaves, beside it, the entry the ledger's manifest
    lists for it (rows, deletion markers, CRC-32C, size; ``seal_name``), so that sealing the ledger
    (``manifests.finalize``) reads no part the tasks wrote: the driver's pass over every file was serial in
    one process, and grows with the ledger (a ledger of distinct keys is as large as its topic)."""
    directory = Path(directory)
    tmp = directory / f".{name}.{os.getpid()}{TMP_SUFFIX}"
    writer: pq.ParquetWriter | None = None
    rows = markers = 0
    oldest: list[int | None] = []  # each table's oldest marker time
    try:
        for table in [tables] if isinstance(tables, pa.Table) else tables:
            if not table.num_rows:
                continue
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema, compression="snappy", use_dictionary=_DICTIONARY,
                                          column_encoding=_ENCODINGS, write_statistics=_STATISTICS)
            group = max(1, min(ROW_GROUP_ROWS, ROW_GROUP_BYTES * table.num_rows // max(1, table.nbytes)))
            writer.write_table(table, row_group_size=group)
            rows += table.num_rows
            flagged = pc.sum(table["marker"]).as_py() or 0
            if flagged:
                markers += flagged
                oldest.append(pc.min(table["marker_at"]).as_py())
        if writer is None:
            return
        writer.close()
        crc = file_crc32c(tmp)  # read back from the page cache: the file was just written
        fsync_path(tmp)
        written = tmp.stat()  # a rename keeps the inode, the size and the modification time
        os.replace(tmp, directory / name)
    except BaseException:
        if writer is not None:
            # Closing writes the footer, which fails again on a full disk: the first error is the one raised.
            with contextlib.suppress(OSError, pa.ArrowException):
                writer.close()
        tmp.unlink(missing_ok=True)
        raise
    seal = {"rows": rows, "markers": markers, "oldest_marker_at": min((t for t in oldest if t is not None), default=None),
            "crc32c": crc, "bytes": written.st_size, "inode": written.st_ino, "mtime_ns": written.st_mtime_ns}
    seal_tmp = directory / f"{seal_name(name)}.{os.getpid()}{TMP_SUFFIX}"
    try:  # a hint only (not fsynced): without it, sealing the ledger reads the part
        seal_tmp.write_text(json.dumps(seal))
        os.replace(seal_tmp, directory / seal_name(name))
    except OSError:
        seal_tmp.unlink(missing_ok=True)


def read_seal(part: Path) -> dict[str, Any] | None:
    """The manifest entry of ``part`` as the task that wrote it left it (``write_part``): None when there is
    none, or when it describes another file than the one there now (its inode, size or modification time
    differ: a task attempt wrote the part again)."""
    try:
        seal = json.loads((part.parent / seal_name(part.name)).read_bytes())
        now = part.stat()
        if (seal["inode"], seal["bytes"], seal["mtime_ns"]) != (now.st_ino, now.st_size, now.st_mtime_ns):
            return None
        oldest = seal["oldest_marker_at"]
        return {"name": part.name, "bytes": now.st_size, "crc32c": int(seal["crc32c"]), "rows": int(seal["rows"]),
                "markers": int(seal["markers"]), "oldest_marker_at": None if oldest is None else int(oldest)}
    except (OSError, ValueError, KeyError, TypeError):
        return None
