"""The row groups of ledger files, read from their footers: the bounds their statistics give, which
partitions' rows each may hold, and a partition's rows from the few that can hold them (what a run's
planning and its reading tasks use; ``reader.LedgerReader`` bisects the same bounds)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from compactord.ledger import footer_cache
from compactord.ledger.footer_cache import Footer
from compactord.model import RECORD_SCHEMA
from compactord.storage import ObjectStore, open_local

__all__ = ["FileFacts", "FileSlice", "RowGroup", "at_or_after", "file_footer", "in_offset_order", "kept",
           "ledger_row_groups", "locate", "max_partition_rows", "of_partition", "open_file", "partition_groups",
           "partition_rows", "row_groups_of"]

_INF = math.inf


# A ledger file's size and CRC-32C, as its manifest lists them (None: not known, e.g. a test's own file).
FileFacts = tuple[int | None, int | None]


class FileSlice(NamedTuple):
    """The row groups of one ledger file a reading task reads (``partition_groups``), with the file's facts."""

    name: str
    indexes: Sequence[int]
    size: int | None = None
    crc32c: int | None = None


@dataclass(frozen=True, slots=True)
class RowGroup:
    """One row group of a ledger file, with the bounds its statistics give (infinite if absent)."""

    file: Path
    file_index: int
    index: int
    num_rows: int
    partition_min: float
    partition_max: float
    offset_min: float
    offset_max: float

    def may_hold(self, partition: int, start: int = 0) -> bool:
        """Whether the group can hold a row of ``partition`` with an offset >= ``start``."""
        if not self.partition_min <= partition <= self.partition_max or self.num_rows == 0:
            return False
        # The offset bounds mix partitions when the group spans several: only trust them otherwise.
        return self.partition_min != self.partition_max or self.offset_max >= start


def ledger_row_groups(files: Sequence[str | Path], store: ObjectStore | None = None,
                      facts: Mapping[str, FileFacts] | None = None) -> list[RowGroup]:
    """Every row group of the ledger files ``files`` (keys of ``store``; no store: local paths), with its
    bounds, from the footers alone (the driver reads them once per run: ``max_partition_rows``,
    ``partition_groups``). ``facts``: each file's size and CRC-32C as the ledger's manifest lists them
    (``file_footer``)."""
    groups: list[RowGroup] = []
    for i, name in enumerate(files):
        size, crc = (facts or {}).get(str(name), (None, None))
        groups += row_groups_of(Path(name), i, file_footer(*locate(store, str(name)), size, crc).metadata)
    return groups


def file_footer(objects: ObjectStore, key: str, size: int | None = None, crc: int | None = None) -> Footer:
    """The footer of the ledger file ``key`` of ``objects`` (``locate``). Given the ``size`` and CRC-32C its
    manifest lists, it comes from this process's footer cache (``footer_cache.SHARED``, keyed as
    ``LedgerReader`` keys it, so a run and the reads share their footers) and its read costs no HEAD; without
    them it is read and not kept."""
    if size is None:
        return footer_cache.load_footer(objects, key)
    return footer_cache.SHARED.get((objects.describe(), key, size, crc),
                                   lambda: footer_cache.load_footer(objects, key, size))


def locate(store: ObjectStore | None, ref: str) -> tuple[ObjectStore, str]:
    """The store and key of the file ``ref``: a key of ``store``, or (no store: the warm-up's and tests' files)
    a local path, the object named by its last name in a local store rooted at its folder."""
    if store is not None:
        return store, ref
    path = Path(ref)
    return open_local(path.parent), path.name


def open_file(store: ObjectStore | None, name: str) -> pa.NativeFile:
    """A random-access reader of a ledger file: the object ``name`` of ``store``, or (no store) a local path."""
    return pa.OSFile(name, "r") if store is None else store.open_input(name)


def max_partition_rows(groups: Sequence[RowGroup]) -> int:
    """At most how many rows of any one partition the row groups ``groups`` hold, from their statistics: a
    group that spans partitions counts for each, one without statistics for all. (What a reading task
    that merges a partition's ledger rows may have to hold.)"""
    per: dict[int, int] = {}
    everywhere = 0
    for g in groups:
        if math.isinf(g.partition_min) or math.isinf(g.partition_max):
            everywhere += g.num_rows
            continue
        for p in range(int(g.partition_min), int(g.partition_max) + 1):
            per[p] = per.get(p, 0) + g.num_rows
    return max(per.values(), default=0) + everywhere


def partition_groups(groups: Sequence[RowGroup], partition: int, start: int = 0,
                     facts: Mapping[str, FileFacts] | None = None) -> list[FileSlice]:
    """The files that may hold rows of ``partition`` at or above offset ``start``, each with the indexes of
    those row groups and its ``facts`` (size, CRC-32C; ``ledger_row_groups``): what ``partition_rows`` reads."""
    by_file: dict[str, list[int]] = {}
    for g in groups:
        if g.may_hold(partition, start):
            by_file.setdefault(str(g.file), []).append(g.index)
    return [FileSlice(name, indexes, *(facts or {}).get(name, (None, None))) for name, indexes in by_file.items()]


def partition_rows(groups: Sequence[FileSlice], partition: int, start: int = 0,
                   store: ObjectStore | None = None) -> pa.Table:
    """The rows of ``partition`` with an offset >= ``start`` in the given row groups of ledger files
    (``partition_groups``; keys of ``store``, or local paths), in offset order (markers included).

    For a reading task that merges its partition's tail into the previous ledger (the files were
    verified by the run's planning; a file that went bad since fails the task). Only these row groups are
    read, each with one ranged read; a file's footer is read once (with its size known, no HEAD), or not at
    all when this worker read it for an earlier run (``file_footer``).
    """
    # Each row group is cut to its rows here and let go, and the rows are copied only where a group holds
    # others or a sort is needed: the partition's rows are what a task holds (a list of every group, filtered
    # and sorted as a whole, peaks at 3.6 times them; see #40).
    tables = []
    for part in groups:
        objects, key = locate(store, part.name)
        footer = file_footer(objects, key, part.size, part.crc32c)
        for index in part.indexes:
            group = footer_cache.read_row_group(objects, key, footer, index).cast(RECORD_SCHEMA)
            group = kept(group, at_or_after(group, partition, start))
            if group.num_rows:
                tables.append(group)
            del group
    table = pa.concat_tables(tables) if tables else RECORD_SCHEMA.empty_table()
    del tables
    return table if in_offset_order(table) else table.sort_by("offset")


def row_groups_of(file: Path, file_index: int, metadata: pq.FileMetaData) -> Iterator[RowGroup]:
    names = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    p_col, o_col = names.index("partition"), names.index("offset")
    for index in range(metadata.num_row_groups):
        rg = metadata.row_group(index)
        p_min, p_max = _bounds(rg.column(p_col).statistics)
        o_min, o_max = _bounds(rg.column(o_col).statistics)
        yield RowGroup(file, file_index, index, rg.num_rows, p_min, p_max, o_min, o_max)


def _bounds(stats: pq.Statistics | None) -> tuple[float, float]:
    # Without statistics a group may hold anything: it is read rather than skipped.
    if stats is None or not stats.has_min_max:
        return -_INF, _INF
    return stats.min, stats.max


def of_partition(table: pa.Table, partition: int) -> pa.ChunkedArray:
    """The mask of ``table``'s rows of ``partition``."""
    return pc.equal(table["partition"], pa.scalar(partition, pa.int32()))


def kept(table: pa.Table, keep: pa.ChunkedArray | pa.Array) -> pa.Table:
    """``table.filter(keep)``, the same table when every row is kept: a filter copies every column, keys and
    values included, also when it drops nothing (250,000 rows of 100-byte values: 6.3 ms)."""
    if keep.null_count == 0 and pc.all(keep).as_py():
        return table
    return table.filter(keep)


def in_offset_order(table: pa.Table) -> bool:
    """Whether ``table``'s offsets rise from row to row (a sort would copy every row to leave them as they are);
    a bitmap of its rows, no copy of them."""
    offsets = table["offset"]
    if len(offsets) < 2:
        return True
    return bool(pc.all(pc.greater(offsets[1:], offsets[:-1])).as_py())


def at_or_after(table: pa.Table, partition: int, start: int) -> pa.ChunkedArray:
    """The mask of ``table``'s rows of ``partition`` at or above offset ``start``."""
    return pc.and_(of_partition(table, partition), pc.greater_equal(table["offset"], pa.scalar(start, pa.int64())))
