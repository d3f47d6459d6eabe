"""Reads pinned to a retired ledger (``ledger_id=``) through the topic's service: served until the ``until``
the pointer's retired list gives, also by a new service on the same root after a restart; a 410
``ledger_retired`` (never a 500) past it or once its files are gone; the sweep deletes it, each retired ledger
at its own ``until`` when several switches fall within one grace period; the sweeps of every topic wait
on one thread (``engine/sweeps.py``)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from compactord.config import Settings
from compactord.engine.factory import SparkCompactionServiceFactory
from compactord.engine.service import SparkTopicCompactionService
from compactord.engine.sweeps import SweepScheduler
from compactord.errors import Fenced, LedgerRetired
from compactord.interfaces import ServiceContext
from compactord.ledger.reads import LedgerHandle
from compactord.model import Position
from tests.support.timeouts import STOP_TIMEOUT_S
from tests.support.waiting import wait_for
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


def test_every_ledger_retired_within_one_grace_is_deleted_at_its_own_until(root: Path) -> None:
    factory = open_factory(root)
    try:
        service = factory.new_topic_compaction_service("t")
        store = factory.store
        ids = [make_ledger(store, "t") for _ in range(4)]
        for ledger_id in ids:
            switch(service, ledger_id)
        # Three replaced within one grace, each due a second after the one before (as switches a second apart
        # leave them); a read arms the sweep for the first.
        path = store.topic_dir("t") / "CURRENT"
        body = json.loads(path.read_text())
        now = int(time.time())
        for i, entry in enumerate(body["retired"]):
            entry["until"] = datetime.fromtimestamp(now + 2 + i, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        path.write_text(json.dumps(body))
        assert [r.id for r in store.pointer("t").retired] == ids[:3]
        assert len(values(service, None)) == 10

        def swept() -> bool:
            return not store.pointer("t").retired and not any(store.ledger_path("t", i).exists() for i in ids[:3])
        # Each goes at its until, by the sweep's timer alone (no switch, read or restart meanwhile).
        wait_for(swept, 60, "every retired ledger deleted after its until")
        assert store.current_ledger_id("t") == ids[3] and store.ledger_path("t", ids[3]).exists()
    finally:
        factory.close()


def test_a_sweep_due_while_a_task_of_the_topic_runs_is_tried_again_after_it(root: Path) -> None:
    factory = open_factory(root, grace=1)
    try:
        service = factory.new_topic_compaction_service("t")
        old = make_ledger(factory.store, "t")
        switch(service, old)
        switch(service, make_ledger(factory.store, "t"))
        task = service.compact(start=False)  # a task of the topic: its switch must find the pointer as it read it
        until = factory.store.pointer("t").retired_until(old)
        assert until is not None
        wait_for(lambda: time.time() > until + 1, 10, "the retired ledger's until past")
        assert factory.store.ledger_path("t", old).exists()  # kept while the task runs
        task.cancel()
        wait_for(lambda: not factory.store.ledger_path("t", old).exists(), 60,
                 "the retired ledger deleted once the task ended")
        assert factory.store.pointer("t").retired == ()
    finally:
        factory.close()


def test_the_sweeps_of_many_topics_share_one_thread(root: Path) -> None:
    """Each of many topics has a ledger waiting for its sweep (due in ten minutes): they wait on the process's one
    sweep thread, not a thread each; a sweep due sooner, asked for since, still runs at its time."""
    topics = 30
    factory = open_factory(root)
    try:
        store = factory.store
        before = set(threading.enumerate())
        for i in range(topics):
            service = factory.new_topic_compaction_service(f"t{i}")
            switch(service, make_ledger(store, f"t{i}"))
            switch(service, make_ledger(store, f"t{i}"))
        assert all(store.pointer(f"t{i}").retired for i in range(topics))
        started = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
        assert len(started) <= 1, started
        service = factory.new_topic_compaction_service("t0")
        [retired] = store.pointer("t0").retired
        expire(service)
        assert len(values(service, None)) == 10  # a read finds the until past: the sweep is due now
        wait_for(lambda: not store.ledger_path("t0", retired.id).exists(), 60, "t0's retired ledger swept at once")
        assert store.pointer("t1").retired  # the others wait for their time
    finally:
        factory.close()


def test_the_sweep_thread_calls_in_time_order_past_a_failure_and_ends_when_none_is_left() -> None:
    sweeps = SweepScheduler("test-sweeps")
    called: list[str] = []

    def fails() -> None:
        called.append("fails")
        raise RuntimeError("a sweep's own error")

    asked = threading.Event()
    now = time.time()
    sweeps.at(now - 10, lambda: called.append("first" if asked.wait(STOP_TIMEOUT_S) else "not asked in time"))
    try:  # the thread holds in the first call while the others are asked for, out of their order
        sweeps.at(now + 0.3, lambda: called.append("b"))
        sweeps.at(now, fails)
        sweeps.at(now + 0.3, lambda: called.append("c"))  # as late as b, asked after it
        sweeps.at(now - 5, lambda: called.append("a"))
    finally:
        asked.set()
    wait_for(lambda: len(called) == 5, STOP_TIMEOUT_S, "every call made")
    assert called == ["first", "a", "fails", "b", "c"] and sweeps.pending() == 0
    wait_for(lambda: "test-sweeps" not in {t.name for t in threading.enumerate()}, STOP_TIMEOUT_S,
             "the sweep thread ended")
    sweeps.at(time.time(), lambda: called.append("d"))  # a thread again for the next
    wait_for(lambda: called[-1] == "d", STOP_TIMEOUT_S, "the next call made")
