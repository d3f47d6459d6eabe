"""Fetch answers as bytes, v4 to v12 (what the listener serves and asks of the broker), without kafka-python's
protocol classes: a relayed fetch is on the path of every consumer at the end of the log, and its records are the
broker's to pass on as they are. ``parse_fetch`` reads the broker's answer into its partitions' fields, each
partition's record set a slice of the frame, never decoded; ``encode_fetch`` writes the listener's answer with
those record sets spliced in. The layouts are Kafka's ``FetchResponse`` (flexible from v12: compact arrays,
strings and bytes, tagged fields); the bytes are those kafka-python writes and reads (a test compares them).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["FetchedPartition", "MalformedAnswer", "encode_fetch", "parse_fetch", "uvarint"]

_FLEXIBLE = 12
_I16, _I32, _I64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")
_HIGH = struct.Struct(">ihq")  # partition index, error code, high watermark
_OFFSETS = struct.Struct(">qq")  # last stable offset, log start offset; an aborted transaction's producer, offset


class MalformedAnswer(ValueError):
    """A broker's answer that is not the Fetch answer asked for."""


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    """A partition's part of a Fetch answer: its error code, offsets and aborted transactions (None: none given,
    as a read_uncommitted answer has them), and its record set as the broker sent it."""

    partition_index: int
    error_code: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted_transactions: tuple[tuple[int, int], ...] | None = None  # (producer id, first offset)
    records: bytes | None = None


class _Reader:
    def __init__(self, frame: bytes) -> None:
        self.data = memoryview(frame)
        self.at = 0

    def fixed(self, layout: struct.Struct) -> tuple[int, ...]:
        values = layout.unpack_from(self.data, self.at)
        self.at += layout.size
        return values

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7

    def length(self, flexible: bool, fixed: struct.Struct) -> int:
        """An array's, a string's or bytes' length (-1: null)."""
        return self.uvarint() - 1 if flexible else self.fixed(fixed)[0]

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.at += self.uvarint()

    def take(self, size: int) -> memoryview:
        if size < 0 or self.at + size > len(self.data):
            raise MalformedAnswer(f"{size} bytes at {self.at} of an answer of {len(self.data)}")
        taken = self.data[self.at:self.at + size]
        self.at += size
        return taken


def parse_fetch(frame: bytes, version: int) -> dict[tuple[str, int], FetchedPartition]:
    """The partitions of a Fetch answer at ``version`` (4 to 12; ``frame``: its header and body, the size prefix
    taken off), each with its record set as the broker sent it.

    :raises MalformedAnswer: the frame does not hold such an answer.
    """
    flexible = version >= _FLEXIBLE
    reader = _Reader(frame)
    found: dict[tuple[str, int], FetchedPartition] = {}
    try:
        reader.fixed(_I32)  # the correlation id, matched by the connection
        if flexible:
            reader.skip_tags()
        reader.fixed(_I32)  # throttle time
        if version >= 7:
            reader.fixed(_I16)  # error code (of the fetch session, which the relay does not open)
            reader.fixed(_I32)  # session id
        for _ in range(reader.length(flexible, _I32)):
            topic = str(reader.take(reader.length(flexible, _I16)), "utf-8")
            for _ in range(reader.length(flexible, _I32)):
                index, error, high = reader.fixed(_HIGH)
                stable, start = reader.fixed(_OFFSETS) if version >= 5 else (reader.fixed(_I64)[0], -1)
                aborted: tuple[tuple[int, int], ...] | None = None
                count = reader.length(flexible, _I32)
                if count >= 0:
                    transactions = []
                    for _ in range(count):
                        transactions.append(reader.fixed(_OFFSETS))
                        if flexible:
                            reader.skip_tags()
                    aborted = tuple((p, o) for p, o in transactions)
                if version >= 11:
                    reader.fixed(_I32)  # preferred read replica
                size = reader.length(flexible, _I32)
                records = None if size < 0 else bytes(reader.take(size))
                if flexible:
                    reader.skip_tags()
                found[(topic, index)] = FetchedPartition(index, error, high, stable, start, aborted, records)
            if flexible:
                reader.skip_tags()
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise MalformedAnswer(f"a Fetch v{version} answer that does not parse: {exc!r}") from exc
    return found


def uvarint(value: int) -> bytes:
    """``value`` (not negative) as Kafka's unsigned varint (a compact length, a tagged-field count)."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length(size: int, flexible: bool, fixed: struct.Struct) -> bytes:
    """An array's, a string's or bytes' length (-1: null) as ``version`` writes it."""
    return uvarint(size + 1) if flexible else fixed.pack(size)


def encode_fetch(version: int, correlation_id: int,
                 topics: Sequence[tuple[str, Sequence[FetchedPartition]]]) -> bytes:
    """The listener's Fetch answer at ``version`` (4 to 12), framed: no throttle, no fetch session, each
    partition's record set written as it is."""
    flexible = version >= _FLEXIBLE
    out = [_I32.pack(0), _I32.pack(correlation_id)]  # the size, written last
    if flexible:
        out.append(b"\x00")  # the header's tagged fields: none
    out.append(_I32.pack(0))  # throttle time
    if version >= 7:
        out += (_I16.pack(0), _I32.pack(0))  # error code, session id
    out.append(_length(len(topics), flexible, _I32))
    for topic, partitions in topics:
        name = topic.encode("utf-8")
        out += (_length(len(name), flexible, _I16), name, _length(len(partitions), flexible, _I32))
        for p in partitions:
            out.append(_HIGH.pack(p.partition_index, p.error_code, p.high_watermark))
            out.append(_OFFSETS.pack(p.last_stable_offset, p.log_start_offset) if version >= 5
                       else _I64.pack(p.last_stable_offset))
            aborted = p.aborted_transactions
            out.append(_length(-1 if aborted is None else len(aborted), flexible, _I32))
            for producer_id, first_offset in aborted or ():
                out.append(_OFFSETS.pack(producer_id, first_offset))
                if flexible:
                    out.append(b"\x00")
            if version >= 11:
                out.append(_I32.pack(-1))  # no preferred read replica
            records = p.records
            out.append(_length(-1 if records is None else len(records), flexible, _I32))
            if records is not None:
                out.append(records)
            if flexible:
                out.append(b"\x00")
        if flexible:
            out.append(b"\x00")
    if flexible:
        out.append(b"\x00")
    frame = bytearray(b"".join(out))
    _I32.pack_into(frame, 0, len(frame) - _I32.size)
    return bytes(frame)
