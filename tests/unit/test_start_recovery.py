"""The daemon's start on a root of many topics: it reads no topic's last success nor policies while it is built;
each topic's are read once the topic is recovered (here at its first use: the recovery pass is held with
``recovery_per_second=0``), before the topic is served; and the run history of a topic whose deletion a restart
interrupted goes with the topic's recovery, before its history is read. A real root on disk; a factory that
runs no Spark and notes the policies it is given; no broker (none is asked)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compactord.config import Settings
from compactord.daemon.core import Daemon
from compactord.daemon.history import RunHistory, RunRecord
from compactord.daemon.policies import PolicyStore, TopicPolicies
from compactord.interfaces import ServiceContext
from compactord.ledger.store import LedgerStore
from tests.support.plugins.sparkless import SparklessFactory
from tests.unit.ledger.test_lazy_recovery import write_ledger

TOPICS = [f"topic-{n:02d}" for n in range(20)]
DELETED, WITH_POLICIES = TOPICS[4], TOPICS[9]


class NotingFactory(SparklessFactory):
    """Notes each topic's limits as the daemon sets them."""

    def initialize(self, context: ServiceContext) -> None:
        super().initialize(context)
        self.limits: dict[str, tuple[int | None, int | None]] = {}

    def set_topic_limits(self, topic: str, *, key_ttl_ms: int | None = None,
                         max_read_bytes_per_second: int | None = None) -> None:
        self.limits[topic] = (key_ttl_ms, max_read_bytes_per_second)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    root = tmp_path / "root"
    settings = Settings().with_overrides(
        compacted_ledger_root=str(root),
        compaction_service_factory_class_name=f"{__name__}:NotingFactory")
    store = LedgerStore(root, recovery_per_second=0).open()
    try:
        for topic in TOPICS:
            write_ledger(store, topic)
        PolicyStore(store, ()).put(WITH_POLICIES, TopicPolicies(keyTtlMs=60_000))
        history = RunHistory(store.objects, 10, 1.0)
        now = time.time()
        history.append(RunRecord(
            task_id="t-1", topic=DELETED, state="Succeed", reason="manual", reason_detail="", caller=None,
            created_at=now - 2, started_at=now - 2, finished_at=now - 1, records_read=1, bytes_read=1,
            records_written=1, bytes_written=1, removed=0, ledger_before=None, ledger_after=1, full_rebuild=True,
            recreated=False, skipped=False, error=None, error_type=None))
        assert history.last(DELETED) is not None
        store.mark_deleting(DELETED)  # the daemon stops here: the deletion is completed at the next start
    finally:
        store.close()
    started = Daemon(settings, recovery_per_second=0)
    try:
        yield started
    finally:
        started.shutdown()


def test_nothing_of_a_topic_is_read_while_the_daemon_is_built(daemon: Daemon) -> None:
    factory: Any = daemon.factory
    assert factory.limits == {} and daemon.runs.last_success == {}
    assert not any(daemon.store.recovered(t) for t in TOPICS)


def test_a_topic_s_policies_and_last_success_come_before_it_is_served(daemon: Daemon) -> None:
    factory: Any = daemon.factory
    assert daemon.store.current_ledger_id(WITH_POLICIES) == 1
    assert factory.limits == {WITH_POLICIES: (60_000, None)}
    assert set(daemon.runs.last_success) == {WITH_POLICIES}


def test_an_interrupted_deletion_takes_the_history_with_it_before_the_history_is_read(daemon: Daemon) -> None:
    assert daemon.history.runs(DELETED) == []
    assert daemon.history.last(DELETED) is None
    assert DELETED not in daemon.store.topics() and DELETED not in daemon.runs.last_success
