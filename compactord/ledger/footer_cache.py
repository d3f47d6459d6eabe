"""The Parquet footers of ledger files, kept in memory: a ledger's files never change once sealed, so each
file's footer (its ``FileMetaData``) and the byte span of each of its row groups are read once and then shared
by every reader of the daemon.

With them a row group is one ranged read of the store (``read_row_group``): its column chunks are contiguous,
so the span from the first chunk's first page to the last chunk's end is fetched in one GET and pyarrow decodes
it from memory, never reading the footer again. On an S3 root a page read then costs one GET per row group it
touches, and no HEAD; a local root saves the same opens and seeks.

The cache is bounded in bytes (``storageMetadataCacheBytes``; 0 turns it off), evicts the least recently used
footer, and is safe to share between threads. Its entries are keyed by the store, the object's key, and the
size and CRC-32C the ledger's manifest lists, so a key written again with other bytes is never served stale.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from compactord.errors import InvalidArgument, ObjectNotFound
from compactord.storage import ObjectStore
from compactord.storage.base import RangedFile

__all__ = ["DEFAULT_MAX_BYTES", "MAX_BYTES", "SHARED", "CacheStats", "Footer", "FooterCache", "load_footer", "read_row_group"]

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
MAX_BYTES = 4 * 1024 * 1024 * 1024
# What pyarrow itself reads first of a file's end: one read holds the footer of any ledger file but a huge one.
_TAIL_BYTES = 64 * 1024
# A decoded FileMetaData holds more than its Thrift bytes (schema objects, per-chunk statistics); the factor
# and the per-entry overhead make the bound err on the safe side.
_DECODED_FACTOR = 3
_ENTRY_OVERHEAD = 512


@dataclass(frozen=True, slots=True)
class Footer:
    """A ledger file's footer: its size in bytes, its metadata, and each row group's ``[start, end)`` bytes."""

    size: int
    metadata: pq.FileMetaData
    spans: tuple[tuple[int, int], ...]

    @property
    def weight(self) -> int:
        """What the entry is counted as against the cache's bound (an estimate of its memory)."""
        return self.metadata.serialized_size * _DECODED_FACTOR + _ENTRY_OVERHEAD + 64 * len(self.spans)


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Lookups since the start (hits, misses: loaded), evictions, and what the cache holds now."""

    hits: int
    misses: int
    evictions: int
    bytes: int
    entries: int
    max_bytes: int


class FooterCache:
    """Footers by key, least recently used first out once their weights pass ``max_bytes``. Thread-safe; a
    footer is loaded outside the lock, so a slow read never blocks the hits of other readers."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, Footer] = OrderedDict()
        self._bytes = 0
        self._max = 0
        self._hits = self._misses = self._evictions = 0
        self.resize(max_bytes)

    def resize(self, max_bytes: int) -> None:
        """Bound the cache to ``max_bytes`` (0: keep nothing), evicting what no longer fits.

        :raises InvalidArgument: ``max_bytes`` is not an integer in 0..4 GiB.
        """
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or not 0 <= max_bytes <= MAX_BYTES:
            raise InvalidArgument(f"a footer cache's bound is an integer of bytes in 0..{MAX_BYTES}, got: {max_bytes!r}")
        with self._lock:
            self._max = max_bytes
            self._evict()

    def get(self, key: Hashable, load: Callable[[], Footer]) -> Footer:
        """The footer under ``key``, loaded by ``load`` (and kept, if it fits) when absent."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                self._hits += 1
                return found
            self._misses += 1
        footer = load()
        with self._lock:
            if self._max and key not in self._entries and footer.weight <= self._max:
                self._entries[key] = footer
                self._bytes += footer.weight
                self._evict()
        return footer

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, self._evictions, self._bytes, len(self._entries), self._max)

    def _evict(self) -> None:
        # Called with the lock held.
        while self._entries and self._bytes > self._max:
            _, old = self._entries.popitem(last=False)
            self._bytes -= old.weight
            self._evictions += 1


#: The daemon's one cache: every ``LedgerReader`` reads through it (the daemon sizes it at its start).
SHARED = FooterCache()


def load_footer(objects: ObjectStore, key: str, size: int | None = None) -> Footer:
    """Read the footer of the Parquet object ``key``: one ranged read of its end (two for a footer over
    64 KiB), plus a HEAD when its ``size`` is not known.

    :raises ObjectNotFound: there is no object under ``key``.
    :raises pyarrow.ArrowException: the object is not Parquet.
    """
    if size is None:
        info = objects.head(key)
        if info is None:
            raise ObjectNotFound(f"{objects.location(key)} does not exist", key=key)
        size = info.size
    start = max(0, size - _TAIL_BYTES)
    tail = objects.get(key, start, size)
    with pa.PythonFile(RangedFile(objects, key, size, start, tail), mode="r") as source:
        metadata = pq.read_metadata(source)
    return Footer(size, metadata, tuple(_span(metadata.row_group(i)) for i in range(metadata.num_row_groups)))


def read_row_group(objects: ObjectStore, key: str, footer: Footer, index: int) -> pa.Table:
    """Row group ``index`` of the object ``key`` whose footer is ``footer``: its span in one ranged read.

    :raises ObjectNotFound: the object is gone.
    :raises pyarrow.ArrowException: its bytes are not what the footer says.
    """
    start, end = footer.spans[index]
    data = objects.get(key, start, end)
    with pa.PythonFile(RangedFile(objects, key, footer.size, start, data), mode="r") as source, \
            pq.ParquetFile(source, metadata=footer.metadata) as pf:
        return pf.read_row_group(index, use_threads=False)


def _span(rg: pq.RowGroupMetaData) -> tuple[int, int]:
    """The bytes of a row group: from its first column chunk's first page (the dictionary page, if any) to the
    end of its last chunk."""
    starts, ends = [], []
    for i in range(rg.num_columns):
        chunk = rg.column(i)
        first = chunk.dictionary_page_offset if chunk.has_dictionary_page and chunk.dictionary_page_offset \
            else chunk.data_page_offset
        starts.append(first)
        ends.append(first + chunk.total_compressed_size)
    return (min(starts), max(ends)) if starts else (0, 0)
