"""What the listener's view knows from memory of a fetch past the horizon (``TopicView.relays``, asked on the
event loop): after a read of the current ledger, an offset past its horizon relays with no look-up of the ledger;
a switch (the pointer's generation changed) is seen by the next fetch; a fetch pinned to another ledger, an
offset at or below the horizon, or what a read learnt too long ago go to ``read``. The daemon's ledgers are the
stand-in of ``tests/support/ledger_host.py``: the view has no I/O of its own."""

from __future__ import annotations

import pytest

from compactord.listener import view as view_module
from compactord.listener.batches import BatchCache
from compactord.listener.view import CURRENT_TTL_S, TopicView
from compactord.model import Entry
from tests.support.ledger_host import LedgerHost, Ledgers

TOPIC = "prices"


def _view() -> tuple[TopicView, Ledgers]:
    ledgers = Ledgers(TOPIC)
    ledgers.add(1, [Entry(0, 3, b"a", b"old-a"), Entry(0, 9, b"b", b"old-b")], horizon={0: 9, 1: 4})
    return TopicView(LedgerHost(ledgers), BatchCache()), ledgers  # type: ignore[arg-type]


def test_past_the_horizon_a_fetch_relays_without_looking_the_ledger_up() -> None:
    view, ledgers = _view()
    assert not view.relays(TOPIC, 0, 10, None)  # nothing learnt yet: the read answers
    assert view.read(TOPIC, 0, 10, 1 << 20, None) is None  # it learns the current ledger
    infos = ledgers.infos

    assert view.relays(TOPIC, 0, 10, None) and view.relays(TOPIC, 0, 500, 1)  # unpinned, or pinned to it
    assert view.relays(TOPIC, 1, 5, None) and view.relays(TOPIC, 7, 0, None)  # a partition not in the ledger
    assert not view.relays(TOPIC, 0, 9, None) and not view.relays(TOPIC, 1, 4, None)  # at the horizon: the ledger's
    assert ledgers.infos == infos and ledgers.reads == 0


def test_a_switch_is_seen_by_the_next_fetch() -> None:
    view, ledgers = _view()
    view.read(TOPIC, 0, 10, 1 << 20, None)
    assert view.relays(TOPIC, 0, 12, None)

    ledgers.add(2, [Entry(0, 11, b"a", b"new-a")], horizon={0: 14})

    assert not view.relays(TOPIC, 0, 12, None)
    answer = view.read(TOPIC, 0, 12, 1 << 20, None)
    assert answer is not None and answer.ledger_id == 2 and answer.horizon == 14
    assert view.relays(TOPIC, 0, 15, None) and not view.relays(TOPIC, 0, 14, None)


def test_a_topic_without_a_ledger_relays_until_its_first_switch() -> None:
    ledgers = Ledgers(TOPIC)
    view = TopicView(LedgerHost(ledgers), BatchCache())  # type: ignore[arg-type]
    assert view.read(TOPIC, 0, 0, 1 << 20, None) is None
    assert view.relays(TOPIC, 0, 0, None)

    ledgers.add(1, [Entry(0, 0, b"a", b"1")], horizon={0: 0})

    assert not view.relays(TOPIC, 0, 0, None)
    answer = view.read(TOPIC, 0, 0, 1 << 20, None)
    assert answer is not None and answer.ledger_id == 1


def test_a_fetch_pinned_to_another_ledger_is_read() -> None:
    view, ledgers = _view()
    view.read(TOPIC, 0, 0, 1 << 20, None)  # pins ledger 1
    ledgers.add(2, [Entry(0, 11, b"a", b"new-a")], horizon={0: 14})
    view.read(TOPIC, 0, 15, 1 << 20, None)  # learns ledger 2

    assert not view.relays(TOPIC, 0, 15, 1)  # ledger 1 retired: the read goes on with the current one
    assert view.relays(TOPIC, 0, 15, 2) and view.relays(TOPIC, 0, 15, None)


def test_what_a_read_learnt_is_asked_again_after_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    view, _ = _view()
    now = [100.0]
    monkeypatch.setattr(view_module.time, "monotonic", lambda: now[0])
    view.read(TOPIC, 0, 10, 1 << 20, None)
    assert view.relays(TOPIC, 0, 10, None)

    now[0] += CURRENT_TTL_S  # another process's switch (a cluster's member) is seen within this

    assert not view.relays(TOPIC, 0, 10, None)
