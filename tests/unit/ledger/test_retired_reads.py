"""Reads pinned to a retired ledger (``ledger_id=``) through the topic's service: served until the ``until``
the pointer's retired list gives, also by a new service on the same root after a restart; a 410
``ledger_retired`` (never a 500) past it or once its files are gone; the sweep deletes it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from compactord.config import Settings
from compactord.engine.factory import SparkCompactionServiceFactory
from compactord.engine.service import SparkTopicCompactionService
from compactord.errors import Fenced, LedgerRetired
from compactord.interfaces import ServiceContext
from compactord.ledger.reader import LedgerHandle
from compactord.model import Position
from tests.unit.ledger.test_store import make_ledger, rows


def open_factory(root: Path, grace: int = 600) -> SparkCompactionServiceFactory:
    # Neither the Spark session nor the broker client connects before it is used.
    made = SparkCompactionServiceFactory()
    made.initialize(ServiceContext(Settings(compacted_ledger_root=str(root),
                                            compaction_retired_ledger_grace_seconds=grace)))
    return made


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "ledgers"


def switch(service: SparkTopicCompactionService, ledger_id: int) -> None:
    """What a run does at its end: the switch from the pointer it read, then the replaced ledger kept."""
    store = service.factory.store
    base = store.switch_base(service.topic)
    handle = LedgerHandle(store.open_reader(service.topic, ledger_id, store.load_manifest(service.topic, ledger_id)))
    old, problem = service.switch_to(handle, ledger_id, base)
    assert problem is None
    if old is not None and base.ledger is not None:
        service.keep_retired(old, base.ledger, lambda: store.delete_ledger(service.topic, base.ledger or 0))


def values(service: SparkTopicCompactionService, ledger_id: int | None) -> list[bytes | None]:
    return [e.value for e in service.read_compacted_page(Position(0, 0), 100, ledger_id=ledger_id).entries]


def expire(service: SparkTopicCompactionService) -> None:
    """Move every retired ledger's ``until`` into the past, as time passing would."""
    path = service.factory.store.topic_dir(service.topic) / "CURRENT"
    body = json.loads(path.read_text())
    for entry in body["retired"]:
        entry["until"] = "2001-01-01T00:00:00Z"
    path.write_text(json.dumps(body))


def test_a_restart_still_serves_a_pinned_retired_ledger_until_its_until(root: Path) -> None:
    factory = open_factory(root)
    try:
        service = factory.new_topic_compaction_service("t")
        old = make_ledger(factory.store, "t", rows(0, range(3)))
        switch(service, old)
        new = make_ledger(factory.store, "t", rows(0, range(5)))
        switch(service, new)
        assert values(service, old) == [b"v0", b"v1", b"v2"]
    finally:
        factory.close()
    factory = open_factory(root)  # a new daemon on the same root: no timer, no handle in memory
    try:
        service = factory.new_topic_compaction_service("t")
        assert values(service, old) == [b"v0", b"v1", b"v2"]
        assert len(values(service, None)) == 5
        expire(service)  # its time passes (its sweep is not due before then)
        assert service.sweep_retired() == [old]
        assert not factory.store.ledger_path("t", old).exists()
        assert factory.store.pointer("t").retired == ()
        with pytest.raises(LedgerRetired, match="replaced more than") as caught:
            values(service, old)
        assert caught.value.status == 410
    finally:
        factory.close()


def test_a_pinned_ledger_whose_files_are_gone_is_retired_not_an_error(root: Path) -> None:
    factory = open_factory(root)
    try:
        service = factory.new_topic_compaction_service("t")
        old = make_ledger(factory.store, "t")
        switch(service, old)
        switch(service, make_ledger(factory.store, "t"))
    finally:
        factory.close()
    shutil.rmtree(root / "t" / f"ledger-{old}")  # an operator, or a disk, took them
    factory = open_factory(root)
    try:
        service = factory.new_topic_compaction_service("t")
        with pytest.raises(LedgerRetired, match="files are gone") as caught:
            values(service, old)
        assert caught.value.status == 410
    finally:
        factory.close()


def test_a_run_fenced_by_another_writer_changes_nothing(root: Path) -> None:
    factory = open_factory(root)
    try:
        service = factory.new_topic_compaction_service("t")
        switch(service, make_ledger(factory.store, "t"))
        store = factory.store
        base = store.switch_base("t")  # a task starts
        winner = make_ledger(store, "t", rows(0, range(7)))
        store.switch("t", winner, store.switch_base("t"))  # another writer switches meanwhile
        loser = make_ledger(store, "t")
        handle = LedgerHandle(store.open_reader("t", loser, store.load_manifest("t", loser)))
        with pytest.raises(Fenced):
            service.switch_to(handle, loser, base)
        assert store.current_ledger_id("t") == winner and len(values(service, None)) == 7
    finally:
        factory.close()
