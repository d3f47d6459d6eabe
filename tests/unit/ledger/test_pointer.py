"""The pointer as a compare-and-swap: two writers racing a switch (one wins, the other is fenced and changes
nothing), the writer epoch, the retired list and its sweep, and a root an older version wrote (its one-line
pointers and root-wide counter) read and upgraded at the next switch."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from compactord.errors import Fenced, LedgerCorrupt
from compactord.ledger.pointer import KnownPointers, Pointer
from compactord.ledger.store import LedgerStore
from tests.unit.ledger.test_store import make_ledger


def pointer_file(store: LedgerStore, topic: str) -> dict[str, object]:
    return json.loads((store.topic_dir(topic) / "CURRENT").read_text())


def test_two_writers_racing_a_switch_one_wins_the_other_is_fenced_and_changes_nothing(tmp_path: Path) -> None:
    with LedgerStore(tmp_path / "root") as store:
        store.switch("t", make_ledger(store, "t"))
        for _ in range(5):  # a race is a matter of chance: run it a few times
            base = store.pointer("t")
            candidates = [make_ledger(store, "t"), make_ledger(store, "t")]
            barrier = threading.Barrier(2)
            outcome: dict[int, object] = {}

            def switch(ledger_id: int, base: Pointer = base, barrier: threading.Barrier = barrier,
                       outcome: dict[int, object] = outcome) -> None:
                barrier.wait()
                try:
                    outcome[ledger_id] = store.switch("t", ledger_id, base, retire_for=60)
                except Fenced as exc:
                    outcome[ledger_id] = exc

            threads = [threading.Thread(target=switch, args=(i,)) for i in candidates]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            won = [i for i, o in outcome.items() if isinstance(o, Pointer)]
            lost = [i for i, o in outcome.items() if isinstance(o, Fenced)]
            assert len(won) == 1 and len(lost) == 1, outcome
            now = store.pointer("t")
            assert now.ledger == won[0] and now.version == outcome[won[0]].version  # type: ignore[union-attr]
            # The loser left no trace: its ledger is not current, not retired, and the winner's list is whole.
            assert lost[0] not in {r.id for r in now.retired}
            assert base.ledger in {r.id for r in now.retired}
            assert outcome[lost[0]].code == "fenced" and outcome[lost[0]].status == 409  # type: ignore[union-attr]
            store.delete_ledger("t", lost[0])


def test_a_switch_from_a_stale_base_is_fenced(tmp_path: Path) -> None:
    with LedgerStore(tmp_path / "root") as store:
        first, second, third = (make_ledger(store, "t") for _ in range(3))
        store.switch("t", first)
        stale = store.pointer("t")
        store.switch("t", second)
        with pytest.raises(Fenced, match="changed since it was read"):
            store.switch("t", third, stale)
        assert store.current_ledger_id("t") == second
        # The first switch of a topic creates the pointer: a writer that found none loses to one that made it.
        fresh = make_ledger(store, "u")
        store.switch("u", fresh, Pointer(None))
        with pytest.raises(Fenced):
            store.switch("u", make_ledger(store, "u"), Pointer(None))
        assert store.current_ledger_id("u") == fresh


def test_each_open_raises_the_epoch_and_a_lower_epochs_switch_is_fenced(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with LedgerStore(root) as old:
        assert old.epoch == 1
        old.switch("t", make_ledger(old, "t"))
    with LedgerStore(root) as new:  # another daemon took the root over
        assert new.epoch == 2
        new.switch("t", make_ledger(new, "t"))
        assert pointer_file(new, "t")["epoch"] == 2
    # The paused old writer wakes up with a fresh read of the pointer: its epoch still fences it.
    pending = make_ledger(old, "t")
    with pytest.raises(Fenced, match="epoch 2, above this one's"):
        old.switch("t", pending, old.pointer("t"))
    assert pointer_file(old, "t")["ledger"] == pending - 1


def test_the_retired_list_keeps_the_replaced_ledger_until_its_time(tmp_path: Path) -> None:
    with LedgerStore(tmp_path / "root") as store:
        first, second, third = (make_ledger(store, "t") for _ in range(3))
        store.switch("t", first, retire_for=600)
        assert store.pointer("t").retired == ()
        before = time.time()
        store.switch("t", second, retire_for=600)
        store.switch("t", third, retire_for=0)  # no grace: the replaced ledger is not listed
        written = pointer_file(store, "t")
        assert written["ledger"] == third and [r["id"] for r in written["retired"]] == [first]  # type: ignore[index]
        until = store.pointer("t").retired_until(first)
        assert until is not None and before + 600 <= until <= time.time() + 601
        assert store.sweep_retired("t") == []  # not due yet
        assert store.sweep_retired("t", now=until + 1) == [first]
        assert store.pointer("t").retired == () and not store.ledger_path("t", first).exists()


def test_open_sweeps_expired_retired_ledgers_and_keeps_the_others(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with LedgerStore(root) as store:
        ids = [make_ledger(store, "t") for _ in range(4)]
        for ledger_id in ids:
            store.switch("t", ledger_id, retire_for=600)
        body = pointer_file(store, "t")
        body["retired"][0]["until"] = "2001-01-01T00:00:00Z"  # type: ignore[index]
        (store.topic_dir("t") / "CURRENT").write_text(json.dumps(body))
    with LedgerStore(root) as store:
        assert [r.id for r in store.pointer("t").retired] == ids[1:3]
        assert store.ledger_ids("t") == ids[1:]


def test_an_older_versions_root_is_read_and_upgraded_at_the_next_switch(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with LedgerStore(root) as store:
        kept = make_ledger(store, "t")
        other = make_ledger(store, "u")
    # What an older version leaves: one-line pointers, the root-wide counter, no per-topic ids, no epoch.
    (root / "t" / "CURRENT").write_text(f"ledger-{kept}\n")
    (root / "u" / "CURRENT").write_text(f"ledger-{other}\n")
    (root / "@compactord" / "ledger-seq").write_text("17\n")
    for name in ("ledger-ids", "epoch"):
        path = root / "@compactord" / name
        for file in sorted(path.rglob("*"), reverse=True) if path.is_dir() else [path]:
            file.unlink()
        if path.is_dir():
            path.rmdir()
    with LedgerStore(root) as store:
        legacy = store.pointer("t")
        assert (legacy.ledger, legacy.epoch, legacy.retired, legacy.legacy) == (kept, 0, (), True)
        assert store.remove_orphans("t") == []  # the old pointer still protects its ledger
        store.verify("t", kept)
        new = make_ledger(store, "t")
        assert new == 18  # above the old root counter
        store.switch("t", new, store.pointer("t"), retire_for=60)
        body = pointer_file(store, "t")
        assert body["ledger"] == new and body["epoch"] == 1
        assert [r["id"] for r in body["retired"]] == [kept]  # type: ignore[index]
        assert not store.pointer("t").legacy
        # A topic not switched yet keeps its old pointer, read as before.
        assert (root / "u" / "CURRENT").read_text() == f"ledger-{other}\n"
        assert store.current_ledger_id("u") == other


@pytest.mark.parametrize("content", [
    '{"ledger": 0, "epoch": 1, "retired": []}', '{"ledger": 1, "epoch": -1, "retired": []}',
    '{"ledger": 1, "epoch": 1}', '{"ledger": 1, "epoch": 1, "retired": [{"id": 2, "until": "soon"}]}',
    '{"ledger": "1", "epoch": 1, "retired": []}', "[1]",
])
def test_a_malformed_json_pointer_is_corrupt(tmp_path: Path, content: str) -> None:
    with LedgerStore(tmp_path / "root") as store:
        store.switch("t", make_ledger(store, "t"))
        (store.topic_dir("t") / "CURRENT").write_text(content)
        with pytest.raises(LedgerCorrupt, match="CURRENT"):
            store.current_ledger_id("t")
        # The run that rebuilds the topic switches against the bad pointer's version, and replaces it.
        replacement = make_ledger(store, "t")
        store.switch("t", replacement, store.switch_base("t"))
        assert store.current_ledger_id("t") == replacement


def test_known_pointers_keep_what_was_written_over_a_read_that_began_before() -> None:
    known = KnownPointers()
    old, new = Pointer(1, version='"a"'), Pointer(2, version='"b"')

    def slow_fetch() -> Pointer:  # a read of the store that a switch overtakes
        known.wrote("t", new)
        return old

    assert known.read("t", slow_fetch) == old  # what this read saw
    assert known.read("t", lambda: pytest.fail("fetched again")) == new  # but the switch's pointer is kept
    known.wrote("t", None)
    assert known.read("t", lambda: old) == old


def test_the_pointer_generation_changes_with_each_write_of_this_process_and_never_comes_back(tmp_path: Path) -> None:
    store = LedgerStore(tmp_path / "root").open()
    try:
        seen = [store.pointer_generation("t")]
        store.switch("t", make_ledger(store, "t"))
        seen.append(store.pointer_generation("t"))
        store.pointer("t")  # a read changes nothing
        assert store.pointer_generation("t") == seen[-1]
        store.switch("t", make_ledger(store, "t"), retire_for=60)
        seen.append(store.pointer_generation("t"))
        store.drop_retired("t", {store.pointer("t").retired[0].id}, store.pointer("t"))
        seen.append(store.pointer_generation("t"))
        other = store.pointer_generation("u")
        store.delete_topic("t")
        seen.append(store.pointer_generation("t"))
        assert store.pointer_generation("u") == other  # another topic's is its own
    finally:
        store.close()
    seen.append(store.pointer_generation("t"))  # closed: whatever a reader learnt is learnt again

    assert len(set(seen)) == len(seen)
