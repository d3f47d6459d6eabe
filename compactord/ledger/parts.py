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
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from compactord.errors import CompactordError
from compactord.ledger.checksums import file_crc32c
from compactord.storage import ObjectInfo, ObjectStore
from compactord.storage.disk import TMP_SUFFIX

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
    """A part file that a task attempt of an older version was still writing when it died (today's are the
    local store's hidden temporary files, which listings never show)."""
    return name.startswith(_PARTIAL) and name.endswith(TMP_SUFFIX)


def seal_name(name: str) -> str:
    """The hidden file in which the task that wrote part ``name`` describes it (``write_part``)."""
    return f".{name}{_SEAL_SUFFIX}"


def is_seal(name: str) -> bool:
    return name.startswith(".") and name.endswith(_SEAL_SUFFIX)


def write_part(tables: pa.Table | Iterable[pa.Table], store: ObjectStore, key: str) -> None:
    """Write ``tables`` (one table, or tables one after another: their rows in (partition, offset) order) as
    the part file ``key`` of ``store`` (``<topic>/ledger-<id>/<name>``), nothing for no rows. Tables given one
    after another are taken and written one at a time, so that a caller that makes each as it is asked for
    holds one at a time. The file is written on the worker's local disk first (``ObjectStore.scratch_file``: on a
    local root a hidden temporary file beside the part, fsynced and renamed; else a temporary file uploaded, then
    removed), so that a failed or retried task attempt never leaves a partial part under a part's name.

    The task seals its own part: it leaves, beside it, the entry the ledger's manifest lists for it (rows,
    deletion markers, CRC-32C, size, and the version the store gave the part; ``seal_name``), so that sealing
    the ledger (``manifests.finalize``) reads no part the tasks wrote: the driver's pass over every file was
    serial in one process, and grows with the ledger (a ledger of distinct keys is as large as its topic)."""
    folder, _, name = key.rpartition("/")
    tmp = store.scratch_file(key)
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
        size = tmp.stat().st_size
        version = store.put_file(key, tmp)  # a local root's scratch file is moved into place, not copied
    except BaseException:
        if writer is not None:
            # Closing writes the footer, which fails again on a full disk: the first error is the one raised.
            with contextlib.suppress(OSError, pa.ArrowException):
                writer.close()
        raise
    finally:
        tmp.unlink(missing_ok=True)
    seal = {"rows": rows, "markers": markers, "oldest_marker_at": min((t for t in oldest if t is not None), default=None),
            "crc32c": crc, "bytes": size, "version": version}
    with contextlib.suppress(CompactordError, OSError):  # a hint only: without it, sealing the ledger reads the part
        store.put(f"{folder}/{seal_name(name)}" if folder else seal_name(name), json.dumps(seal).encode())


def read_seal(part: ObjectInfo, seal: bytes) -> dict[str, Any] | None:
    """The manifest entry of the part ``part`` as the task that wrote it left it (``write_part``, ``seal`` its
    bytes): None when it describes another object than the one there now (its version or size differ: a task
    attempt wrote the part again)."""
    try:
        entry = json.loads(seal)
        if (entry["version"], entry["bytes"]) != (part.version, part.size):
            return None
        oldest = entry["oldest_marker_at"]
        return {"name": part.key.rpartition("/")[2], "bytes": part.size, "crc32c": int(entry["crc32c"]),
                "rows": int(entry["rows"]), "markers": int(entry["markers"]),
                "oldest_marker_at": None if oldest is None else int(oldest), "version": part.version}
    except (ValueError, KeyError, TypeError):
        return None
