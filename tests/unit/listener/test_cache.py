"""The record batches the listener keeps of its ledger reads (``BatchCache``, ``TopicView.read``): bounded in
bytes, the least recently used dropped first; a read of a ledger again is answered from them, the same bytes;
after a switch, the retired ledger's batches are not served, the new ledger's are. The daemon's ledgers here are
a small stand-in (``tests/support/ledger_host.py``) that counts its page reads: the view has no I/O of its own."""

from __future__ import annotations

from kafka.record.memory_records import MemoryRecords

from compactord.listener.batches import BatchCache, entries_batches
from compactord.listener.view import TopicView
from compactord.model import Entry
from tests.support.ledger_host import LedgerHost, Ledgers

TOPIC = "prices"


def test_the_kept_bytes_stay_within_the_bound_the_least_recently_used_going_first() -> None:
    cache = BatchCache(max_bytes=400)
    for key in "abcd":
        cache.put(key, key.encode() * 100)
    assert cache.bytes == 400 and len(cache) == 4
    assert cache.get("a") == b"a" * 100  # now the most recently used

    cache.put("e", b"e" * 100)

    assert cache.bytes == 400
    assert cache.get("b") is None  # the least recently used
    assert [cache.get(k) for k in "acde"] == [k.encode() * 100 for k in "acde"]


def test_an_answer_larger_than_a_quarter_of_the_bound_is_not_kept() -> None:
    cache = BatchCache(max_bytes=400)
    cache.put("small", b"s" * 100)

    cache.put("large", b"l" * 101)

    assert cache.get("large") is None
    assert cache.get("small") == b"s" * 100 and cache.bytes == 100


def test_a_key_put_again_is_counted_once() -> None:
    cache = BatchCache(max_bytes=400)
    cache.put("a", b"1" * 50)
    cache.put("a", b"2" * 80)
    assert cache.bytes == 80 and cache.get("a") == b"2" * 80


def _values(records: bytes) -> list[tuple[int, bytes | None]]:
    batches, found = MemoryRecords(records), []
    while (batch := batches.next_batch()) is not None:
        found += [(r.offset, r.value) for r in batch]
    return found


def _view() -> tuple[TopicView, Ledgers]:
    service = Ledgers(TOPIC)
    service.add(1, [Entry(0, 3, b"a", b"old-a"), Entry(0, 9, b"b", b"old-b")])
    return TopicView(LedgerHost(service), BatchCache()), service  # type: ignore[arg-type]


def test_a_ledger_read_again_is_answered_from_the_kept_batches() -> None:
    view, service = _view()
    first = view.read(TOPIC, 0, 0, 1 << 20, None)
    assert first is not None and service.reads == 1

    again = view.read(TOPIC, 0, 0, 1 << 20, 1)

    assert again == first and service.reads == 1
    assert first.records == entries_batches(service.ledgers[1][1])
    assert _values(first.records) == [(3, b"old-a"), (9, b"old-b")]


def test_another_offset_or_byte_budget_is_another_read() -> None:
    view, service = _view()
    view.read(TOPIC, 0, 0, 1 << 20, None)

    later = view.read(TOPIC, 0, 4, 1 << 20, None)
    smaller = view.read(TOPIC, 0, 0, 10, None)

    assert service.reads == 3
    assert later is not None and _values(later.records) == [(9, b"old-b")]
    assert smaller is not None


def test_after_a_switch_the_retired_ledger_s_batches_are_not_served() -> None:
    view, service = _view()
    old = view.read(TOPIC, 0, 0, 1 << 20, None)
    assert old is not None and old.ledger_id == 1

    service.add(2, [Entry(0, 5, b"a", b"new-a"), Entry(0, 9, b"b", b"new-b")])  # ledger 1 retired
    pinned = view.read(TOPIC, 0, 0, 1 << 20, 1)  # a read pinned to ledger 1 goes on with the current one
    current = view.read(TOPIC, 0, 0, 1 << 20, None)

    for answer in (pinned, current):
        assert answer is not None and answer.ledger_id == 2
        assert _values(answer.records) == [(5, b"new-a"), (9, b"new-b")]
