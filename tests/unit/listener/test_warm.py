"""New ledgers warmed before a client asks (``listener/warm.py``): once this daemon switches a topic that a ledger
answered fetches of, the first page of each of its partitions is kept, so a bootstrap's fetches, from the log
start or from the first entry (the earliest offset the listener lists), are answered with no page read; a topic no
fetch read from a ledger, or none within the window, is never warmed, and a look that finds no switch reads
nothing. The daemon's ledgers are the stand-in of ``tests/support/ledger_host.py``, which counts its page
reads."""

from __future__ import annotations

from compactord.listener.batches import BatchCache, empty_batch, entries_batches
from compactord.listener.view import WARM_BYTES, TopicView
from compactord.listener.warm import Warmer
from compactord.model import Entry
from tests.support.ledger_host import LedgerHost, Ledgers

TOPIC = "prices"


def _ledger(ledgers: Ledgers, ledger_id: int) -> list[Entry]:
    entries = [Entry(p, o, f"k{o}".encode(), f"v{ledger_id}-{o}".encode(), timestamp=1)
               for p in (0, 1) for o in (3, 4 + ledger_id)]
    ledgers.add(ledger_id, entries, horizon={0: 9, 1: 9})
    return entries


def _setup() -> tuple[Ledgers, TopicView, Warmer]:
    ledgers = Ledgers(TOPIC)
    _ledger(ledgers, 1)
    view = TopicView(LedgerHost(ledgers), BatchCache())  # type: ignore[arg-type]
    return ledgers, view, Warmer(view, ledgers)


def test_a_switch_of_a_topic_fetched_from_a_ledger_is_warmed_and_a_bootstrap_reads_no_page() -> None:
    ledgers, view, warmer = _setup()
    assert view.read(TOPIC, 0, 0, WARM_BYTES, None) is not None  # a client reads the view
    assert warmer.look() == []  # the first look notes the generation: nothing switched since
    entries = _ledger(ledgers, 2)
    reads = ledgers.reads

    assert warmer.look() == [TOPIC]
    assert ledgers.reads == reads + 2  # one page of each partition
    assert warmer.look() == []  # nothing switched since

    from_start = view.read(TOPIC, 0, 0, WARM_BYTES, None)
    from_first = view.read(TOPIC, 1, 3, WARM_BYTES, None)  # ListOffsets(earliest): the first entry
    assert ledgers.reads == reads + 2  # both from the kept batches
    assert from_start is not None and from_start.ledger_id == 2
    assert from_start.records == entries_batches([e for e in entries if e.partition == 0]) + empty_batch(7, 9)
    assert from_first is not None and from_first.records == \
        entries_batches([e for e in entries if e.partition == 1]) + empty_batch(7, 9)


def test_a_topic_no_fetch_read_from_a_ledger_or_none_within_the_window_is_not_warmed() -> None:
    ledgers, view, warmer = _setup()
    warmer.look()
    _ledger(ledgers, 2)
    assert warmer.look() == [] and ledgers.reads == 0  # no client read the topic from a ledger

    view.read(TOPIC, 0, 0, WARM_BYTES, None)
    warmer.look()
    late = Warmer(view, ledgers, window_s=-1.0)  # every fetch older than its window
    late.look()
    _ledger(ledgers, 3)
    reads = ledgers.reads

    assert late.look() == [] and ledgers.reads == reads
    assert warmer.look() == [TOPIC]
