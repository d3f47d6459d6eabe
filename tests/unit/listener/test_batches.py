"""Ledger entries encoded as record batches by ``listener/batches.py``, decoded back with kafka-python's reader
(``MemoryRecords``): original offsets with their gaps, keys, values, tombstones, headers and timestamps; an empty
batch that carries a reader to the horizon; the bytes those kafka-python's builder writes, for every kind of
record (lengths past the varint table, timestamps before the batch's first, none, markers, headers), the same
from a ledger's Arrow columns as from its entries."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from compactord.listener.batches import MAX_DELTA, empty_batch, entries_batches, rows_batches
from compactord.model import RECORD_SCHEMA, Entry, entries_table


def _decoded(data: bytes) -> list[tuple[int, int, int, list[tuple[int, bytes | None, bytes | None, int, list]]]]:
    """Each batch as (base offset, last offset, crc valid, its records as (offset, key, value, timestamp, headers))."""
    batches = []
    records = MemoryRecords(data)
    while records.has_next():
        batch = records.next_batch()
        batches.append((batch.base_offset, batch.last_offset, batch.validate_crc(),
                        [(r.offset, r.key, r.value, r.timestamp, list(r.headers)) for r in batch]))
    return batches


def test_entries_keep_their_offsets_keys_values_tombstones_headers_and_timestamps() -> None:
    entries = [Entry(0, 3, b"a", b"1", timestamp=1000, headers=(("h", b"x"), ("n", None))),
               Entry(0, 17, b"b", None, timestamp=900),  # a tombstone, older than the record before it
               Entry(0, 40, b"c", b"", timestamp=5000)]

    batches = _decoded(entries_batches(entries))

    assert batches == [(3, 40, True, [(3, b"a", b"1", 1000, [("h", b"x"), ("n", None)]),
                                      (17, b"b", None, 900, []), (40, b"c", b"", 5000, [])])]


def test_a_deletion_marker_is_a_tombstone_at_its_offset_with_its_timestamp() -> None:
    # A row the ledger marks as a deletion is a deletion whatever its value column holds.
    entries = [Entry(0, 4, b"a", b"1", timestamp=10), Entry(0, 9, b"gone", b"stale", timestamp=20, marker=True,
                                                           marker_at=30)]

    assert _decoded(entries_batches(entries)) == [(4, 9, True, [(4, b"a", b"1", 10, []), (9, b"gone", None, 20, [])])]


def test_offsets_further_apart_than_an_int32_delta_go_into_another_batch() -> None:
    entries = [Entry(0, 5, b"a", b"1", timestamp=1), Entry(0, 5 + MAX_DELTA + 1, b"b", b"2", timestamp=2)]

    batches = _decoded(entries_batches(entries))

    assert [(base, last, [r[0] for r in recs]) for base, last, _, recs in batches] == [
        (5, 5, [5]), (5 + MAX_DELTA + 1, 5 + MAX_DELTA + 1, [5 + MAX_DELTA + 1])]


def test_no_entries_make_no_batch() -> None:
    assert entries_batches([]) == b""


def test_an_empty_batch_spans_to_the_horizon() -> None:
    batches = _decoded(entries_batches([Entry(0, 2, b"k", b"v", timestamp=1)]) + empty_batch(3, 99))

    assert batches == [(2, 2, True, [(2, b"k", b"v", 1, [])]), (3, 99, True, [])]


def _built(entries: list[Entry]) -> bytes:
    """``entries`` in one batch written by kafka-python's ``DefaultRecordBatchBuilder``, at the first's offset."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=2**31 - 1)
    base = entries[0].offset
    for e in entries:
        builder.append(e.offset - base, timestamp=e.timestamp if e.timestamp is not None else 0, key=e.key,
                       value=None if e.marker else e.value, headers=list(e.headers))
    batch = builder.build()
    batch[:8] = base.to_bytes(8, "big")
    return bytes(batch)


def test_the_batches_are_the_bytes_kafka_python_s_builder_writes() -> None:
    long = bytes(range(256)) * 80  # past the table of small varints
    entries = [Entry(0, 7, b"a", b"1", timestamp=5000),
               Entry(0, 8, None, b"no key", timestamp=4000),  # before the first: a negative delta
               Entry(0, 20, b"b", None, timestamp=None),  # a tombstone; no timestamp
               Entry(0, 21, long, long, timestamp=2**40, headers=(("h", b"x"), ("\u00e9t\u00e9", None), ("n", long))),
               Entry(0, 22, b"gone", b"stale", timestamp=6000, marker=True, marker_at=7000),
               Entry(0, 7 + 20_000, b"", b"", timestamp=6000)]  # an offset delta past the table

    assert entries_batches(entries) == _built(entries)
    assert entries_batches(entries[:1]) == _built(entries[:1])
    assert rows_batches(entries_table(entries)) == _built(entries)  # the same from the ledger's columns


def test_rows_are_the_batches_of_their_entries_also_without_the_later_columns() -> None:
    entries = [Entry(0, 3, b"a", b"1", timestamp=1000), Entry(0, 9, b"b", b"2", timestamp=None),
               Entry(0, 5 + MAX_DELTA + 1, b"c", None, timestamp=3)]
    table = entries_table(entries)

    assert rows_batches(table) == entries_batches(entries)
    # A ledger written before headers and markers were columns: its rows have none.
    assert rows_batches(table.drop_columns(["headers", "marker", "marker_at", "event_time"])) == \
        entries_batches(entries)
    assert rows_batches(RECORD_SCHEMA.empty_table()) == b""


_bytes = st.one_of(st.none(), st.binary(max_size=40), st.binary(min_size=16_384, max_size=16_400))
_headers = st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))), max_size=3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3_000_000), st.one_of(st.none(), st.integers(-2**61, 2**61)), _bytes,
                          _bytes, _headers, st.booleans()), min_size=1, max_size=30),
       st.integers(0, 2**62))
def test_any_entries_are_the_bytes_kafka_python_s_builder_writes(rows: list, first: int) -> None:
    # Offsets with gaps of up to millions (varints of 1 to 4 bytes), any timestamp, null or long keys and values,
    # headers with null values, markers: column by column, the bytes the builder writes record by record.
    entries, offset = [], first
    for gap, timestamp, key, value, headers, marker in rows:
        entries.append(Entry(0, offset, key, value, timestamp=timestamp, headers=tuple(headers), marker=marker,
                             marker_at=1 if marker else None))
        offset += gap

    assert entries_batches(entries) == _built(entries)
