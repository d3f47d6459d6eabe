"""Reads of a verified ledger with pyarrow (never Spark), and the reference count that keeps a ledger's
files on disk while a reader still uses them.

Ledger files are sorted by (partition, offset) across files. The per-row-group min/max statistics of
the ``partition`` and ``offset`` columns let a read go straight to the few row groups that can hold
the wanted entries, so a read of a ledger of millions of rows takes milliseconds.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from compactord.errors import InvalidArgument, LedgerCorrupt, LedgerRetired, ObjectNotFound, StorageUnavailable
from compactord.ledger import footer_cache
from compactord.ledger.footer_cache import Footer
from compactord.ledger.row_groups import RowGroup, at_or_after, of_partition, row_groups_of
from compactord.model import RECORD_SCHEMA, Entry, LedgerManifest
from compactord.storage import ObjectStore, open_local

__all__ = ["LedgerHandle", "LedgerReader", "LedgerRetired", "LedgerSlice"]

log = logging.getLogger(__name__)

_INF = math.inf


@dataclass(frozen=True, slots=True)
class LedgerSlice:
    """Entries of one partition read in order; ``truncated``: the byte budget stopped the read early."""

    entries: list[Entry]
    truncated: bool = False


# What one ledger's remembered last entries (``LedgerReader.last``) may hold: their keys, values and headers,
# plus an estimate of each entry's own overhead.
_LASTS_MAX_BYTES = 4 * 1024 * 1024
_LAST_OVERHEAD = 256


class LedgerReader:
    """An opened, verified ledger. Safe to share between threads: every read is a ranged read of its own.
    Its files' footers come from ``footer_cache.SHARED``: a ledger opened again reads none of them."""

    def __init__(self, path: Path, manifest: LedgerManifest, objects: ObjectStore | None = None,
                 prefix: str = "") -> None:
        """Read the footers of the files ``manifest`` lists: through ``objects`` under ``prefix`` (the ledger's
        ``<topic>/ledger-<id>/``, as ``LedgerStore.open_reader`` gives them), else in the folder ``path``.

        :raises LedgerCorrupt: a file is missing, not Parquet, or has another row count than listed.
        :raises StorageUnavailable: the store failed to answer (nothing is known of the files then).
        """
        self.path = Path(path)
        self.manifest = manifest
        # Without a store the folder is a local root of its own: every read goes through one code path.
        self._objects: ObjectStore = objects if objects is not None else open_local(self.path)
        self._prefix = prefix if objects is not None else ""
        self._where = self._objects.describe()
        self._footers: list[Footer] = []
        groups: list[RowGroup] = []
        for file_index, spec in enumerate(sorted(manifest.files, key=lambda f: f["name"])):
            file = self.path / spec["name"]
            try:
                footer = self._footer(spec)
            except StorageUnavailable:  # an OSError too, but the store's failure, not the file's
                raise
            except (OSError, pa.ArrowException, ObjectNotFound) as exc:
                raise LedgerCorrupt(f"ledger file {file} cannot be opened: {exc}", file=spec["name"]) from exc
            metadata = footer.metadata
            if "rows" in spec and metadata.num_rows != spec["rows"]:
                raise LedgerCorrupt(
                    f"ledger file {file} has {metadata.num_rows} rows; its manifest lists {spec['rows']}",
                    file=spec["name"],
                )
            try:
                groups.extend(row_groups_of(file, file_index, metadata))
            except ValueError as exc:
                raise LedgerCorrupt(f"ledger file {file} lacks a column: {exc}", file=spec["name"]) from exc
            self._footers.append(footer)
        self.row_groups: tuple[RowGroup, ...] = tuple(groups)
        # Each partition's last live entry once read (``last``): the ledger never changes, so a warm view
        # answers /last without a read. Bounded by ``_LASTS_MAX_BYTES`` of keys, values and headers.
        self._lasts: dict[int, Entry | None] = {}
        self._lasts_bytes = 0
        # Upper bounds of each group's last (partition, offset); ``read`` bisects them (see there).
        self._ends = [(g.partition_max, g.offset_max) for g in groups]
        self._starts = [g.partition_min for g in groups]

    def __repr__(self) -> str:
        return f"LedgerReader({str(self.path)!r}, row_groups={len(self.row_groups)})"

    def _footer(self, spec: dict[str, Any]) -> Footer:
        """The footer of the manifest's file ``spec``, from the daemon's cache (read and kept on a miss). The size
        and checksum the manifest lists are part of the key: a key written again is another entry."""
        key = self._prefix + spec["name"]
        size = spec.get("bytes")
        return footer_cache.SHARED.get((self._where, key, size, spec.get("crc32c")),
                                       lambda: footer_cache.load_footer(self._objects, key, size))

    @property
    def num_rows(self) -> int:
        """Rows in the ledger, markers included."""
        return sum(g.num_rows for g in self.row_groups)

    def read_row_group(self, group: RowGroup) -> pa.Table:
        """Read one row group (one ranged read of its bytes: ``footer_cache.read_row_group``): the only place
        that decodes ledger data (a hook for tests and metrics).

        :raises LedgerCorrupt: the file cannot be read. :raises StorageUnavailable: the store failed.
        """
        try:
            return footer_cache.read_row_group(self._objects, self._prefix + group.file.name,
                                               self._footers[group.file_index], group.index)
        except StorageUnavailable:  # an OSError too, but the store's failure, not the file's
            raise
        except (OSError, pa.ArrowException, ObjectNotFound) as exc:
            raise LedgerCorrupt(
                f"row group {group.index} of ledger file {group.file} cannot be read: {exc}",
                file=group.file.name,
            ) from exc

    def read(self, partition: int, start: int, n: int, include_markers: bool = False) -> list[Entry]:
        """Up to ``n`` live entries of ``partition`` with offset >= ``start``, in offset order
        (the deletion markers too if ``include_markers``: the compacted reader and the Kafka listener need them).

        :raises InvalidArgument: ``partition`` or ``start`` is negative, or ``n`` < 1.
        """
        return self.read_slice(partition, start, n, include_markers=include_markers).entries

    def read_slice(self, partition: int, start: int, n: int, *, include_markers: bool = False,
                   max_bytes: int | None = None) -> LedgerSlice:
        """``read``, bounded also by ``max_bytes``: entries are taken until their ``Entry.raw_bytes``
        would pass it (always at least one). The sizes are counted in Arrow before any row becomes a
        Python object, so a page of large values never holds more than the budget in memory.

        :raises InvalidArgument: ``partition`` or ``start`` is negative, ``n`` < 1 or ``max_bytes`` < 1.
        """
        rows, truncated = self.read_rows(partition, start, n, include_markers=include_markers, max_bytes=max_bytes)
        return LedgerSlice(_entries(rows), truncated)

    def read_rows(self, partition: int, start: int, n: int, *, include_markers: bool = False,
                  max_bytes: int | None = None) -> tuple[pa.Table, bool]:
        """``read_slice``'s rows as the ledger's Arrow columns, no row a Python object, and whether the byte
        budget ended them (``truncated``).

        :raises InvalidArgument: ``partition`` or ``start`` is negative, ``n`` < 1 or ``max_bytes`` < 1.
        """
        _check_int("partition", partition, 0)
        _check_int("start", start, 0)
        _check_int("n", n, 1)
        if max_bytes is not None:
            _check_int("max_bytes", max_bytes, 1)
        budget = _INF if max_bytes is None else max_bytes
        # With the data sorted, the first group whose last key reaches (partition, start) is the first
        # that can hold a wanted row. ``_ends`` only bounds the last keys from above (offsets of a group
        # that spans partitions mix them), which can make the bisection land earlier, never later.
        first = bisect.bisect_left(self._ends, (partition, start))
        found: list[pa.Table] = []
        count = used = 0
        truncated = False
        for i in range(first, len(self.row_groups)):
            group = self.row_groups[i]
            if group.partition_min > partition:
                break
            if not group.may_hold(partition, start):
                continue
            table = self.read_row_group(group)
            mask = at_or_after(table, partition, start)
            if not include_markers:
                mask = pc.and_(mask, _live(table))
            rows = table.filter(mask).slice(0, n - count)
            take = rows.num_rows
            if max_bytes is not None and take:
                # The rows whose running size stays within what is left of the budget; the first row of a read
                # whatever its size.
                running = pc.cumulative_sum(_raw_sizes(rows))
                take = pc.sum(pc.less_equal(running, pa.scalar(budget - used, pa.int64()))).as_py() or 0
                take = max(take, 0 if count else 1)
                used += running[take - 1].as_py()
            found.append(rows.slice(0, take))
            count += take
            if take < rows.num_rows:
                truncated = True
                break
            if count >= n:
                break
        if not found:
            return RECORD_SCHEMA.empty_table(), False
        return (found[0] if len(found) == 1 else pa.concat_tables(found, promote_options="default")), truncated

    def last(self, partition: int) -> Entry | None:
        """The last live entry of ``partition``, or None if it has none.

        :raises InvalidArgument: ``partition`` is negative.
        """
        _check_int("partition", partition, 0)
        if partition in self._lasts:
            return self._lasts[partition]
        found = self._read_last(partition)
        weight = _LAST_OVERHEAD + (found.raw_bytes if found is not None else 0)
        if self._lasts_bytes + weight <= _LASTS_MAX_BYTES:  # two threads may both read it: the same answer
            self._lasts[partition] = found
            self._lasts_bytes += weight
        return found

    def _read_last(self, partition: int) -> Entry | None:
        # Groups that start at or before ``partition`` form a prefix of the sorted ledger.
        end = bisect.bisect_right(self._starts, partition)
        for i in reversed(range(end)):
            group = self.row_groups[i]
            if group.partition_max < partition:
                break
            if not group.may_hold(partition):
                continue
            table = self.read_row_group(group)
            live = pc.indices_nonzero(pc.and_(of_partition(table, partition), _live(table)))
            if len(live):  # only the last live row becomes an entry: no copy of the others
                return _entries(table.slice(live[-1].as_py(), 1))[0]
        return None

    def entries(self, include_markers: bool = False) -> Iterator[Entry]:
        """Every entry in (partition, offset) order, markers only if ``include_markers``."""
        for group in self.row_groups:
            if group.num_rows == 0:
                continue
            table = self.read_row_group(group)
            if not include_markers:
                table = table.filter(_live(table))
            yield from _entries(table)

    def __iter__(self) -> Iterator[Entry]:
        return self.entries()


class LedgerHandle:
    """Counts the readers of one ledger, so that a switch never deletes files from under a reader.

    After ``retire(on_zero)``, ``acquire`` raises ``LedgerRetired`` and ``on_zero`` (e.g. deleting the
    ledger directory) runs once, on the thread that releases the last reader, or at once in ``retire``
    if there is none. An exception of ``on_zero`` is logged, never raised to a reader.
    """

    def __init__(self, reader: LedgerReader) -> None:
        self._reader = reader
        self._lock = threading.Lock()
        self._count = 0
        self._retired = False
        self._on_zero: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return f"LedgerHandle({self._reader!r}, readers={self._count}, retired={self._retired})"

    @property
    def manifest(self) -> LedgerManifest:
        return self._reader.manifest

    @property
    def readers(self) -> int:
        """How many readers hold the ledger now."""
        return self._count

    @property
    def retired(self) -> bool:
        return self._retired

    def acquire(self) -> LedgerReader:
        """Count one more reader and return the ledger's reader.

        :raises LedgerRetired: the ledger was retired (a newer one is current).
        """
        with self._lock:
            if self._retired:
                raise LedgerRetired(
                    f"ledger {self._reader.manifest.ledger_id} of topic {self._reader.manifest.topic!r} "
                    "was replaced by a newer ledger; read from the current one"
                )
            self._count += 1
            return self._reader

    def release(self) -> None:
        """Count one reader less; the last release of a retired ledger runs its ``on_zero``.

        :raises RuntimeError: more releases than acquires (a bug of the caller).
        """
        with self._lock:
            if self._count == 0:
                raise RuntimeError(f"{self!r}: release() without a matching acquire()")
            self._count -= 1
            on_zero = self._take_on_zero()
        self._run(on_zero)

    def retire(self, on_zero: Callable[[], None]) -> None:
        """Refuse new readers, and run ``on_zero`` once no reader holds the ledger.

        :raises RuntimeError: the handle was already retired.
        """
        with self._lock:
            if self._retired:
                raise RuntimeError(f"{self!r} is already retired")
            self._retired = True
            self._on_zero = on_zero
            run_now = self._take_on_zero()
        self._run(run_now)

    @contextlib.contextmanager
    def reading(self) -> Iterator[LedgerReader]:
        """``with handle.reading() as reader:`` acquire and release around a block.

        :raises LedgerRetired: the ledger was retired.
        """
        reader = self.acquire()
        try:
            yield reader
        finally:
            self.release()

    def _take_on_zero(self) -> Callable[[], None] | None:
        # Called with the lock held; the callback runs outside it, so it may take its time.
        if self._retired and self._count == 0 and self._on_zero is not None:
            on_zero, self._on_zero = self._on_zero, None
            return on_zero
        return None

    def _run(self, on_zero: Callable[[], None] | None) -> None:
        if on_zero is None:
            return
        try:
            on_zero()
        except Exception:
            # A reader must not fail because the old ledger could not be removed: the next start's
            # orphan removal deletes it.
            log.exception("cleanup of retired ledger %s failed", self._reader.path)


def _entries(table: pa.Table) -> list[Entry]:
    """The rows of ``table`` as entries (as ``Entry.from_row`` makes them), converted column by column:
    no dict per row."""
    names = set(table.column_names)

    def column(name: str) -> list[Any]:
        return table.column(name).to_pylist() if name in names else [None] * table.num_rows

    if "headers" not in names or not pc.sum(pc.list_value_length(table["headers"])).as_py():
        headers: list[tuple[tuple[str, bytes | None], ...]] = [()] * table.num_rows  # the usual case: none
    else:
        headers = [() if hs is None else tuple((h["key"], h["value"]) for h in hs) for hs in column("headers")]
    return [
        Entry(partition=p, offset=o, key=k, value=v, timestamp=t, headers=h, event_time=e, marker=bool(m),
              marker_at=a)
        for p, o, k, v, t, h, e, m, a in zip(
            column("partition"), column("offset"), column("key"), column("value"), column("timestamp"),
            headers, column("event_time"), column("marker"), column("marker_at"), strict=True,
        )
    ]


def _raw_sizes(table: pa.Table) -> pa.Array:
    """Per row, the bytes of its key, value and header keys and values (``Entry.raw_bytes``), as int64."""
    def length(column: pa.Array | pa.ChunkedArray) -> pa.Array:
        return pc.cast(pc.fill_null(pc.binary_length(column), _ZERO), pa.int64())

    sizes = length(table["key"].combine_chunks())
    sizes = pc.add(sizes, length(table["value"].combine_chunks()))
    headers = table["headers"].combine_chunks()
    if len(headers.values):
        # Each row's headers are one run of the child array: the difference of a running sum at its ends.
        per_header = pc.add(length(headers.values.field("key")), length(headers.values.field("value")))
        running = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(per_header)])
        ends = headers.offsets
        per_row = pc.subtract(pc.take(running, ends.slice(1)), pc.take(running, ends.slice(0, len(ends) - 1)))
        sizes = pc.add(sizes, pc.if_else(headers.is_valid(), per_row, _ZERO64))
    return sizes


# Arrow scalars, never Python values, go to pyarrow.compute: a Python value makes it try to import pandas
# at each call (a failed import is not cached), ~0.13 ms a call where the compute itself takes ~0.01 ms.
_ZERO = pa.scalar(0, pa.int32())
_ZERO64 = pa.scalar(0, pa.int64())
_FALSE = pa.scalar(False)


def _live(table: pa.Table) -> pa.ChunkedArray:
    # A null marker (Spark's columns are all nullable) counts as false, as in ``Entry.from_row``.
    return pc.invert(pc.fill_null(table["marker"], _FALSE))


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgument(f"{name} must be an integer >= {minimum}, got: {value!r}")
