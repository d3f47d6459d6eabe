"""Ledger entries as Kafka record batches (magic 2, uncompressed): each record at its original offset (the batch's
base offset and each record's delta), with its key, value, headers and timestamp; a tombstone is a record with a
null value, as on the broker, and so is a deletion marker the ledger keeps (``compactionTombstoneRetentionMs``): a
consumer that had the key from an earlier ledger deletes it.

The bytes are those kafka-python's ``DefaultRecordBatchBuilder`` writes (tests compare them), written here column
by column with Arrow's compute functions, since a read that finds no batches kept encodes every record of its
answer: a ledger's rows from their Arrow columns (``rows_batches``), each varint looked up in a table (14 bits at a
time), each record's pieces joined element-wise into one buffer, the batch's CRC-32C taken once over it; no Python
object is made per record (docs/performance.md, "Kafka listener").

A ledger never changes once written, so the batches of one read of it (a partition from an offset, within a byte
budget) are the same every time: ``BatchCache`` keeps the latest ones, bounded in bytes, keyed by the ledger
(its topic, id and making time) and the read; a read of another ledger (after a switch) is another key.

Where the ledger holds nothing more below the horizon (expired tombstones, null keys and transaction markers
were dropped), an empty batch whose last offset is the horizon carries a consumer past it, as the empty batches
Kafka's log cleaner keeps do: the consumer's next fetch is then at horizon + 1, on the live log.
"""

from __future__ import annotations

import bisect
import struct
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from crc32c import crc32c

from compactord.listener.fetch_frames import uvarint
from compactord.model import Entry, entries_table

__all__ = ["CACHE_BYTES", "MAX_DELTA", "BatchCache", "empty_batch", "entries_batches", "rows_batches"]

# A record's offset delta is an int32 varint in the batch; entries further apart go into another batch.
MAX_DELTA = 2**31 - 1
_MAGIC = 2
# A batch's header (Kafka's ``RecordBatch``): base offset, length after this field, partition leader epoch, magic,
# CRC-32C (of everything after it), attributes, last offset delta, first and max timestamps, producer id and epoch,
# base sequence, record count.
_HEADER = struct.Struct(">qiibIhiqqqhii")
_AFTER_LENGTH = 12  # the base offset and the length field
_CRC_FROM = 21  # the attributes, first byte under the CRC
_CRC_AT = 17
_ENDS = struct.Struct("=i")  # an entry of a binary array's offsets buffer
# The bytes of encoded batches the listener keeps: a few views of ~10,000 records (~1.3 MB each) read again and
# again by the applications that bootstrap from them.
CACHE_BYTES = 64 * 1024 * 1024


# Unsigned varints are written by lookup: of 0..16383 whole (one or two bytes), and past that, 14 bits at a time as
# two bytes with the continuation bit set, then the rest.
_TABLE_BITS = 14
_UVARINTS = pa.array([uvarint(n) for n in range(1 << _TABLE_BITS)], pa.binary())
_GROUPS = pa.array([bytes([(n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80]) for n in range(1 << _TABLE_BITS)],
                   pa.binary())
_U64 = pa.uint64()
_TABLE_SIZE = pa.scalar(1 << _TABLE_BITS, _U64)
_LOW_BITS = pa.scalar((1 << _TABLE_BITS) - 1, _U64)
_SHIFT = pa.scalar(_TABLE_BITS, _U64)
_U64_ZERO = pa.scalar(0, _U64)
_ONE = pa.scalar(1, pa.int64())
_SIGN_LESS_ONE = pa.scalar(62, pa.int64())
_NO_LENGTH = pa.scalar(-1, pa.int64())
_ZERO = pa.scalar(0, pa.int64())
_EMPTY = pa.scalar(b"", pa.binary())
_BYTE_ZERO = pa.scalar(b"\x00", pa.binary())  # a record's attributes (none are used); a count of no headers
# Arrow scalars, never Python values, go to pyarrow.compute (a Python value costs an import attempt: reads.py).
_FALSE = pa.scalar(False)
_NULL_VALUE = pa.scalar(None, pa.binary())


def _uvarints(values: pa.Array) -> pa.Array:
    """Each of ``values`` (uint64) as Kafka's unsigned varint: a binary array."""
    small = pc.less(values, _TABLE_SIZE)
    if pc.all(small).as_py():
        return pc.take(_UVARINTS, values)
    rest = pc.binary_join_element_wise(pc.take(_GROUPS, pc.bit_wise_and(values, _LOW_BITS)),
                                       _uvarints(pc.shift_right(values, _SHIFT)), _EMPTY)
    return pc.if_else(small, pc.take(_UVARINTS, pc.if_else(small, values, _U64_ZERO)), rest)


def _varints(values: pa.Array) -> pa.Array:
    """Each of ``values`` (int64) as Kafka's zigzag varint (a varlong: the same encoding)."""
    sign = pc.shift_right(pc.shift_right(values, _SIGN_LESS_ONE), _ONE)  # -1 or 0: Arrow shifts by at most 62
    zigzag = pc.bit_wise_xor(pc.shift_left(values, _ONE), sign)
    return _uvarints(pc.cast(zigzag, _U64, safe=False))


def _sealed(batch: bytearray, base: int, count: int, last_delta: int, first_ts: int, max_ts: int) -> bytes:
    """``batch`` (its header's room, then its ``count`` records) with its header and CRC written."""
    _HEADER.pack_into(batch, 0, base, len(batch) - _AFTER_LENGTH, 0, _MAGIC, 0, 0, last_delta, first_ts, max_ts,
                      -1, -1, -1, count)
    struct.pack_into(">I", batch, _CRC_AT, crc32c(memoryview(batch)[_CRC_FROM:]))
    return bytes(batch)


def entries_batches(entries: Sequence[Entry]) -> bytes:
    """``entries`` (of one partition, in offset order) as record batches, one unless their offsets spread past
    an int32 delta."""
    return rows_batches(entries_table(entries))


def rows_batches(rows: pa.Table) -> bytes:
    """A ledger's rows as read (``TopicCompactionService.read_compacted_rows``: one partition's, in offset order) as
    record batches, one unless their offsets spread past an int32 delta; the later columns (headers, markers) may
    be missing (a ledger written before them). Encoded by Arrow's compute functions, column by column: no Python
    object is made per row."""
    count = rows.num_rows
    if not count:
        return b""
    rows = rows.combine_chunks()
    offsets = _column(rows, "offset")
    first, last = offsets[0].as_py(), offsets[-1].as_py()
    if last - first <= MAX_DELTA:
        return _batch(rows)
    out, at, listed = [], 0, offsets.to_pylist()
    while at < count:
        end = bisect.bisect_right(listed, listed[at] + MAX_DELTA, at)
        out.append(_batch(rows.slice(at, end - at)))
        at = end
    return b"".join(out)


def _column(rows: pa.Table, name: str) -> pa.Array:
    column = rows.column(name)
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _lengths(column: pa.Array) -> pa.Array:
    """Each value's length, -1 for a null (int64)."""
    return pc.fill_null(pc.cast(pc.binary_length(column), pa.int64()), _NO_LENGTH)


def _batch(rows: pa.Table) -> bytes:
    """``rows`` (offsets from the first's to at most ``MAX_DELTA`` past it) as one record batch."""
    names = set(rows.column_names)
    count = rows.num_rows
    offsets = _column(rows, "offset")
    base, last = offsets[0].as_py(), offsets[-1].as_py()
    keys = _column(rows, "key")
    values = _column(rows, "value")
    if "marker" in names:  # a deletion marker is a tombstone whatever its value column holds
        values = pc.if_else(pc.fill_null(_column(rows, "marker"), _FALSE), _NULL_VALUE, values)
    timestamps = pc.fill_null(_column(rows, "timestamp"), _ZERO) if "timestamp" in names \
        else pa.array([0] * count, pa.int64())
    first_ts, max_ts = timestamps[0].as_py(), pc.max(timestamps).as_py()
    header_count, header_bytes = _headers(_column(rows, "headers")) if "headers" in names else (_BYTE_ZERO, _EMPTY)
    body = pc.binary_join_element_wise(
        _BYTE_ZERO,
        _varints(pc.subtract(timestamps, pa.scalar(first_ts, pa.int64()))),
        _varints(pc.subtract(offsets, pa.scalar(base, pa.int64()))),
        _varints(_lengths(keys)), pc.fill_null(keys, _EMPTY),
        _varints(_lengths(values)), pc.fill_null(values, _EMPTY),
        header_count, header_bytes, _EMPTY)
    records = pc.binary_join_element_wise(_varints(_lengths(body)), body, _EMPTY)
    _, ends, data = records.buffers()
    start = _ENDS.unpack_from(ends, 4 * records.offset)[0]
    end = _ENDS.unpack_from(ends, 4 * (records.offset + count))[0]
    batch = bytearray(_HEADER.size)
    batch += memoryview(data)[start:end]  # the records, one after the other
    return _sealed(batch, base, count, last - base, first_ts, max_ts)


def _headers(column: pa.Array) -> tuple[pa.Array | pa.Scalar, pa.Array | pa.Scalar]:
    """Each row's count of headers as a varint, and its headers as a record writes them (a name's length and
    bytes, a value's length and bytes)."""
    counts = pc.fill_null(pc.list_value_length(column), pa.scalar(0, pa.int32()))
    if not pc.sum(counts).as_py():  # the usual case: none
        return _BYTE_ZERO, _EMPTY
    elements = pc.list_flatten(column)
    names = pc.fill_null(pc.cast(pc.struct_field(elements, "key"), pa.binary()), _EMPTY)
    values = pc.struct_field(elements, "value")
    encoded = pc.binary_join_element_wise(_varints(_lengths(names)), names, _varints(_lengths(values)),
                                          pc.fill_null(values, _EMPTY), _EMPTY)
    ends = pa.concat_arrays([pa.array([0], pa.int32()), pc.cumulative_sum(counts)])
    per_row = pc.binary_join(pa.ListArray.from_arrays(ends, encoded), _EMPTY)
    return _varints(pc.cast(counts, pa.int64())), per_row


def empty_batch(first: int, last: int) -> bytes:
    """A batch of no records spanning offsets ``first`` to ``last``: a consumer reading it goes on at
    ``last + 1``.

    :raises ValueError: ``last`` is below ``first``, or further from it than an int32 delta.
    """
    if not 0 <= last - first <= MAX_DELTA:
        raise ValueError(f"an empty batch spans 0 to {MAX_DELTA} offsets, got {first} to {last}")
    return _sealed(bytearray(_HEADER.size), first, 0, last - first, 0, 0)


class BatchCache:
    """Encoded batches by the read that made them, the least recently used dropped first to keep at most
    ``max_bytes`` of them; an answer larger than a quarter of that is not kept (it would push out many
    smaller ones). Safe across threads."""

    def __init__(self, max_bytes: int = CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._kept: OrderedDict[Hashable, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, key: Hashable) -> bytes | None:
        with self._lock:
            found = self._kept.get(key)
            if found is not None:
                self._kept.move_to_end(key)
            return found

    def put(self, key: Hashable, batches: bytes) -> None:
        if len(batches) > self.max_bytes // 4:
            return
        with self._lock:
            replaced = self._kept.pop(key, None)
            self.bytes -= 0 if replaced is None else len(replaced)
            self._kept[key] = batches
            self.bytes += len(batches)
            while self.bytes > self.max_bytes:
                self.bytes -= len(self._kept.popitem(last=False)[1])
