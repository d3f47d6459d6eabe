"""Ledger entries as Kafka record batches (magic 2, uncompressed): each record at its original offset (the batch's
base offset and each record's delta), with its key, value, headers and timestamp; a tombstone is a record with a
null value, as on the broker, and so is a deletion marker the ledger keeps (``compactionTombstoneRetentionMs``): a
consumer that had the key from an earlier ledger deletes it.

The bytes are those kafka-python's ``DefaultRecordBatchBuilder`` writes (a test compares them), written here with
less Python per record, since a read that finds no batches kept encodes every record of its answer: a ledger's
rows from their Arrow columns (``rows_batches``: no ``Entry`` made per row), the small varints (lengths, counts)
from a table, the records written into one buffer per batch, the batch's CRC-32C taken once over it
(docs/performance.md, "Kafka listener").

A ledger never changes once written, so the batches of one read of it (a partition from an offset, within a byte
budget) are the same every time: ``BatchCache`` keeps the latest ones, bounded in bytes, keyed by the ledger
(its topic, id and making time) and the read; a read of another ledger (after a switch) is another key.

Where the ledger holds nothing more below the horizon (expired tombstones, null keys and transaction markers
were dropped), an empty batch whose last offset is the horizon carries a consumer past it, as the empty batches
Kafka's log cleaner keeps do: the consumer's next fetch is then at horizon + 1, on the live log.
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from crc32c import crc32c

from compactord.listener.fetch_frames import uvarint
from compactord.model import Entry

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
# The bytes of encoded batches the listener keeps: a few views of ~10,000 records (~1.3 MB each) read again and
# again by the applications that bootstrap from them.
CACHE_BYTES = 64 * 1024 * 1024


def _varint(value: int) -> bytes:
    """``value`` as Kafka's zigzag varint (a varlong for timestamps: the same encoding)."""
    return uvarint((value << 1) ^ (value >> 63))


# The varints of -1 (a null's length) to 16383: every key, value and record length of a usual record, every count.
_SMALL = [_varint(n) for n in range(-1, 1 << 14)]
_SMALL_LEN = len(_SMALL) - 1
_ATTRIBUTES = b"\x00"  # a record's attributes: none are used
_NULL = _SMALL[0]  # the length of a null key, value or header value
# Arrow scalars, never Python values, go to pyarrow.compute (a Python value costs an import attempt: reads.py).
_FALSE = pa.scalar(False)
_NULL_VALUE = pa.scalar(None, pa.binary())


def _sealed(batch: bytearray, base: int, count: int, last_delta: int, first_ts: int, max_ts: int) -> bytes:
    """``batch`` (its header's room, then its ``count`` records) with its header and CRC written."""
    _HEADER.pack_into(batch, 0, base, len(batch) - _AFTER_LENGTH, 0, _MAGIC, 0, 0, last_delta, first_ts, max_ts,
                      -1, -1, -1, count)
    struct.pack_into(">I", batch, _CRC_AT, crc32c(memoryview(batch)[_CRC_FROM:]))
    return bytes(batch)


def entries_batches(entries: Sequence[Entry]) -> bytes:
    """``entries`` (of one partition, in offset order) as record batches, one unless their offsets spread past
    an int32 delta."""
    return _batches([e.offset for e in entries], [e.timestamp for e in entries], [e.key for e in entries],
                    [None if e.marker else e.value for e in entries], [e.headers for e in entries])


def rows_batches(rows: pa.Table) -> bytes:
    """``entries_batches`` of a ledger's rows as read (``TopicCompactionService.read_compacted_rows``): their
    columns made Python lists, no ``Entry`` made per row."""
    names = set(rows.column_names)
    values = rows.column("value")
    if "marker" in names:
        values = pc.if_else(pc.fill_null(rows.column("marker"), _FALSE), _NULL_VALUE, values)
    count = rows.num_rows
    headers: list[Sequence[tuple[str, bytes | None]]] = [()] * count  # the usual case: none
    if "headers" in names and count and pc.sum(pc.list_value_length(rows.column("headers"))).as_py():
        headers = [() if hs is None else [(h["key"], h["value"]) for h in hs]
                   for hs in rows.column("headers").to_pylist()]
    timestamps = rows.column("timestamp").to_pylist() if "timestamp" in names else [None] * count
    return _batches(rows.column("offset").to_pylist(), timestamps, rows.column("key").to_pylist(),
                    values.to_pylist(), headers)


def _batches(offsets: list[int], timestamps: list[int | None], keys: list[bytes | None],
             values: list[bytes | None], headers: list[Sequence[tuple[str, bytes | None]]]) -> bytes:
    """The records of the same index in each list as record batches (a value None for a tombstone)."""
    small, small_len, varint = _SMALL, _SMALL_LEN, _varint
    out: list[bytes] = []
    batch = bytearray(_HEADER.size)
    count = base = first_ts = max_ts = last = 0
    for offset, timestamp, key, value, pairs in zip(offsets, timestamps, keys, values, headers, strict=True):
        if timestamp is None:
            timestamp = 0
        if not count or offset - base > MAX_DELTA:
            if count:
                out.append(_sealed(batch, base, count, last - base, first_ts, max_ts))
                batch, count = bytearray(_HEADER.size), 0
            base, first_ts, max_ts = offset, timestamp, timestamp
        elif timestamp > max_ts:
            max_ts = timestamp
        last = offset
        count += 1
        delta_ts, delta = timestamp - first_ts, offset - base
        record = bytearray(_ATTRIBUTES)
        record += small[delta_ts + 1] if 0 <= delta_ts < small_len else varint(delta_ts)
        record += small[delta + 1] if delta < small_len else varint(delta)
        if key is None:
            record += _NULL
        else:
            size = len(key)
            record += small[size + 1] if size < small_len else varint(size)
            record += key
        if value is None:
            record += _NULL
        else:
            size = len(value)
            record += small[size + 1] if size < small_len else varint(size)
            record += value
        record += small[len(pairs) + 1] if len(pairs) < small_len else varint(len(pairs))
        for name, header in pairs:
            encoded = name.encode("utf-8")
            record += varint(len(encoded))
            record += encoded
            if header is None:
                record += _NULL
            else:
                record += varint(len(header))
                record += header
        size = len(record)
        batch += small[size + 1] if size < small_len else varint(size)
        batch += record
    if count:
        out.append(_sealed(batch, base, count, last - base, first_ts, max_ts))
    return b"".join(out)


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
