"""``LedgerStore.sweep`` on a local root, where a test can date files: what the periodic sweep removes of a
topic (ledgers no pointer names, temporary files) by age and by the id ceiling, and what it keeps."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from compactord.ledger.store import LedgerStore
from tests.unit.ledger.test_store import make_ledger

HOUR = 3600.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LedgerStore]:
    with LedgerStore(tmp_path / "root") as s:
        yield s


def _age(path: Path, seconds: float) -> None:
    """Date ``path`` and everything under it ``seconds`` ago."""
    when = time.time() - seconds
    for item in [path, *path.rglob("*")] if path.is_dir() else [path]:
        os.utime(item, (when, when))


def _unsealed(store: LedgerStore, topic: str) -> int:
    """A ledger whose run died before sealing it: one part, no manifest."""
    ledger_id, _ = store.allocate_ledger(topic)
    store.objects.put(f"{store.ledger_key(topic, ledger_id)}/part-00000.parquet", b"part of a dead run")
    return ledger_id


def test_only_unreferenced_ledgers_older_than_the_cut_and_up_to_the_ceiling_go(store: LedgerStore) -> None:
    current = make_ledger(store, "t")
    store.switch("t", current)
    old, young, above = _unsealed(store, "t"), _unsealed(store, "t"), _unsealed(store, "t")
    for ledger_id in (current, old, above):
        _age(store.ledger_path("t", ledger_id), 2 * HOUR)
    swept = store.sweep("t", ceiling=young, older_than=time.time() - HOUR)
    assert swept.keys == [f"t/ledger-{old}/"] and swept.objects == 1 and swept.bytes == len(b"part of a dead run")
    assert store.ledger_ids("t") == [current, young, above]
    store.verify("t", current)


def test_without_a_pointer_a_sealed_ledger_stays_for_the_start_to_quarantine(store: LedgerStore) -> None:
    sealed, unsealed = make_ledger(store, "t"), _unsealed(store, "t")
    swept = store.sweep("t", ceiling=unsealed, older_than=time.time() + HOUR)  # everything is old enough
    assert swept.keys == [f"t/ledger-{unsealed}/"]
    assert store.ledger_ids("t") == [sealed]


def test_old_temporary_files_go_young_ones_stay(store: LedgerStore) -> None:
    current = make_ledger(store, "t")
    store.switch("t", current)
    old_tmp, young_tmp = store.topic_dir("t") / "CURRENT.tmp", store.ledger_path("t", current) / "part-x.tmp"
    old_tmp.write_bytes(b"an older version's pointer write")
    young_tmp.write_bytes(b"young")
    _age(old_tmp, 2 * HOUR)
    swept = store.sweep("t", ceiling=current, older_than=time.time() - HOUR)
    assert swept.keys == ["t/CURRENT.tmp"]
    assert not old_tmp.exists() and young_tmp.exists()
    assert store.sweep("t", ceiling=current, older_than=time.time() + HOUR).keys == [f"t/ledger-{current}/part-x.tmp"]
    store.verify("t", current)
