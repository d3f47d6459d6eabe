"""Ledger entries as Kafka record batches (magic 2), built with kafka-python's ``DefaultRecordBatchBuilder``: each
record at its original offset (the batch's base offset and each record's delta), with its key, value, headers
and timestamp; a tombstone is a record with a null value, as on the broker, and so is a deletion marker the
ledger keeps (``compactionTombstoneRetentionMs``): a consumer that had the key from an earlier ledger deletes it.

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

from kafka.record.default_records import DefaultRecordBatchBuilder

from compactord.model import Entry

__all__ = ["CACHE_BYTES", "MAX_DELTA", "BatchCache", "empty_batch", "entries_batches"]

# A record's offset delta is an int32 varint in the batch; entries further apart go into another batch.
MAX_DELTA = 2**31 - 1
_MAGIC = 2
_BASE_OFFSET = struct.Struct(">q")  # the batch's first 8 bytes, outside its CRC (the broker sets them too)
# The bytes of encoded batches the listener keeps: a few views of ~10,000 records (~1.3 MB each) read again and
# again by the applications that bootstrap from them.
CACHE_BYTES = 64 * 1024 * 1024


def _builder() -> DefaultRecordBatchBuilder:
    return DefaultRecordBatchBuilder(magic=_MAGIC, compression_type=0, is_transactional=False, producer_id=-1,
                                     producer_epoch=-1, base_sequence=-1, batch_size=2**31 - 1)


def _finish(builder: DefaultRecordBatchBuilder, base_offset: int) -> bytes:
    batch = builder.build()
    _BASE_OFFSET.pack_into(batch, 0, base_offset)
    return bytes(batch)


def entries_batches(entries: Sequence[Entry]) -> bytes:
    """``entries`` (of one partition, in offset order) as record batches, one unless their offsets spread past
    an int32 delta."""
    out: list[bytes] = []
    builder, base = None, 0
    for entry in entries:
        if builder is None or entry.offset - base > MAX_DELTA:
            if builder is not None:
                out.append(_finish(builder, base))
            builder, base = _builder(), entry.offset
        builder.append(entry.offset - base, timestamp=entry.timestamp if entry.timestamp is not None else 0,
                       key=entry.key, value=None if entry.marker else entry.value, headers=list(entry.headers))
    if builder is not None:
        out.append(_finish(builder, base))
    return b"".join(out)


def empty_batch(first: int, last: int) -> bytes:
    """A batch of no records spanning offsets ``first`` to ``last``: a consumer reading it goes on at
    ``last + 1``.

    :raises ValueError: ``last`` is below ``first``, or further from it than an int32 delta.
    """
    if not 0 <= last - first <= MAX_DELTA:
        raise ValueError(f"an empty batch spans 0 to {MAX_DELTA} offsets, got {first} to {last}")
    builder = _builder()
    # The builder sets a batch's last offset delta from the records it appended; an empty batch has none, so it
    # is set here, before ``build`` writes it under the batch's CRC.
    builder._last_offset = last - first  # type: ignore[attr-defined]  # a slot kafka-python's stub omits
    return _finish(builder, first)


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
