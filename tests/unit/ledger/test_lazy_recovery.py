"""Each topic is recovered at its first use or by the paced recovery pass, never all at ``open()``: on the
session's real S3 server, ``open()`` of a root with many topics asks nothing of any topic, and a topic's
recovery (an interrupted deletion completed, orphans removed) still comes before anything of it is read, also
when the pass has not reached it (held here: ``recovery_per_second=0``)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from compactord.ledger import layout
from compactord.ledger.store import DAEMON_DIR, LedgerStore
from compactord.model import LedgerManifest, StrategySettings
from compactord.storage import ObjectStore
from tests.support.s3_server import S3Server
from tests.support.timeouts import READY_TIMEOUT_S
from tests.support.waiting import wait_for

TOPICS = [f"topic-{n:03d}" for n in range(40)]


class CountingObjects:
    """The root's store, with every call's first argument (a key or prefix; "" for none) noted by its method."""

    def __init__(self, objects: ObjectStore) -> None:
        self._objects = objects
        self.calls: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._objects, name)
        if not callable(found) or name.startswith("_"):
            return found

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls.append((name, args[0] if args and isinstance(args[0], str) else ""))
            return found(*args, **kwargs)

        return call

    def topics_asked(self) -> set[str]:
        """The topics whose objects were asked for: every key or prefix but the root's own."""
        return {key.split("/")[0] for _, key in self.calls if key and key.split("/")[0] != DAEMON_DIR}


def write_ledger(store: LedgerStore, topic: str) -> int:
    """A finalized (empty) ledger, switched to: what a compaction leaves."""
    ledger_id, _ = store.allocate_ledger(topic)
    store.finalize_ledger(topic, ledger_id, LedgerManifest(ledger_id, topic, horizon={}, strategy=StrategySettings(),
                                                           files=[]))
    store.switch(topic, ledger_id)
    return ledger_id


@pytest.fixture
def prefix(s3_server: S3Server) -> Iterator[str]:
    """A root on the S3 server holding ``TOPICS``, each with a ledger, and ``TOPICS[7]`` half deleted (its mark
    written, its ledger still there: the daemon stopped then)."""
    name = f"lazy-{uuid.uuid4().hex[:12]}"
    store = LedgerStore(f"s3://x/{name}", s3_server.store(name), recovery_per_second=0).open()
    try:
        for topic in TOPICS:
            write_ledger(store, topic)
        store.mark_deleting(TOPICS[7])
    finally:
        store.close()
    yield name


def reopened(s3_server: S3Server, prefix: str, per_second: float = 0) -> tuple[LedgerStore, CountingObjects]:
    objects = CountingObjects(s3_server.store(prefix))
    return LedgerStore(f"s3://x/{prefix}", objects, recovery_per_second=per_second).open(), objects  # type: ignore[arg-type]


def test_open_asks_nothing_of_any_topic(s3_server: S3Server, prefix: str) -> None:
    store, objects = reopened(s3_server, prefix)
    try:
        assert objects.topics_asked() == set()
        assert store.topics() == TOPICS  # one listing of the root: the topics are all there, none recovered
        assert objects.head(layout.deleting_key(TOPICS[7])) is not None
    finally:
        store.close()


def test_a_topic_is_recovered_before_its_first_read_though_the_pass_has_not_reached_it(
        s3_server: S3Server, prefix: str) -> None:
    store, objects = reopened(s3_server, prefix)
    try:
        deleted, kept = TOPICS[7], TOPICS[3]
        store.objects.put(f"{kept}/ledger-99/part-00000.parquet", b"left by a run that died")  # an orphan
        assert objects.head(layout.deleting_key(deleted)) is not None  # not recovered at open()
        assert store.current_ledger_id(deleted) is None  # the read completed the deletion first
        assert objects.head(layout.deleting_key(deleted)) is None and deleted not in store.topics()
        assert store.ledger_ids(kept) == [1]  # the orphan went before the listing
        assert objects.topics_asked() == {deleted, kept}  # the others wait for their use, or for the pass
    finally:
        store.close()


def test_the_pass_recovers_every_topic_and_stops_at_close(s3_server: S3Server, prefix: str) -> None:
    store, objects = reopened(s3_server, prefix, per_second=200)
    try:
        wait_for(lambda: all(store.recovered(t) for t in store.topics()), READY_TIMEOUT_S,
                 "the recovery pass to recover every topic")
        assert objects.head(layout.deleting_key(TOPICS[7])) is None and TOPICS[7] not in store.topics()
    finally:
        store.close()
    asked = len(objects.calls)
    store.topics()  # a store that is not open reads, and recovers nothing
    assert len(objects.calls) == asked + 1


def test_a_hook_runs_once_per_topic_before_the_topic_is_served(s3_server: S3Server, prefix: str) -> None:
    store, _ = reopened(s3_server, prefix)
    seen: list[tuple[str, bool]] = []
    try:
        store.current_ledger_id(TOPICS[1])  # recovered before the hook: it hears of it when it comes
        store.after_recovery(lambda topic, deleted: seen.append((topic, deleted)))
        assert seen == [(TOPICS[1], False)]
        store.current_ledger_id(TOPICS[7])
        store.load_manifest(TOPICS[2], 1)
        store.load_manifest(TOPICS[2], 1)
        assert seen == [(TOPICS[1], False), (TOPICS[7], True), (TOPICS[2], False)]
    finally:
        store.close()
