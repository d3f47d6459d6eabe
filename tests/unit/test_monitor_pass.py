"""A backlog monitor's pass against a broker that stops answering, through the broker seam
(``BrokerMetadata``): the pass ends at the first topic when no broker answers at all, goes on past a
topic whose leader alone is unreachable, a stopped monitor ends its pass before the next topic, and no pass
asks the broker while the ledger root's store is known down (no compaction could write its ledger).

Without these, a pass over N topics with the broker down waited out a bootstrap timeout per topic
(~10 s each), and a test process whose daemon had stopped kept running such a pass after its tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from compactord.config import Settings
from compactord.daemon.metrics import Metrics
from compactord.daemon.monitor import BacklogMonitor
from compactord.daemon.policies import PolicyStore
from compactord.daemon.scheduler import TaskRegistry
from compactord.errors import BrokerUnavailable
from compactord.interfaces import BrokerMetadata
from compactord.ledger.store import LedgerStore

TOPICS = [f"topic-{i}" for i in range(5)]


class UnreachableBroker(BrokerMetadata):
    """Lists its topics, then cannot be reached for any of them; ``ping`` says whether any broker answers."""

    def __init__(self, answers_ping: bool, on_ask: Callable[[], None] = lambda: None) -> None:
        self.answers_ping = answers_ping
        self.on_ask = on_ask
        self.asked: list[str] = []

    def _unreachable(self, topic: str) -> Any:
        self.asked.append(topic)
        self.on_ask()
        raise BrokerUnavailable("the Kafka broker at 127.0.0.1:9 is unreachable (test)")

    def list_topics(self) -> list[str]:
        return list(TOPICS)

    def ping(self) -> None:
        if not self.answers_ping:
            raise BrokerUnavailable("no broker address accepts a connection (test)")

    def partitions(self, topic: str) -> list[int]:
        return self._unreachable(topic)

    def topic_id(self, topic: str) -> str | None:
        return self._unreachable(topic)

    def offsets(self, topic: str) -> Any:
        return self._unreachable(topic)

    def first_records(self, topic: str, at: Mapping[int, int], offsets: Any) -> Any:
        return self._unreachable(topic)

    def topic_configs(self, topic: str) -> Any:
        return self._unreachable(topic)

    def close(self) -> None:
        pass


class NoCompactions:
    def new_topic_compaction_service(self, topic: str) -> Any:
        raise AssertionError(f"nothing may be compacted here ({topic})")


def one_pass(broker: UnreachableBroker, root: Path, stop_on_first_ask: bool = False,
             store_problem: str | None = None) -> BacklogMonitor:
    """A monitor on ``broker`` and a fresh ledger root runs one pass (stopped during it, if asked; with the
    root's store known down for ``store_problem``, if given)."""
    settings = Settings(kafka_bootstrap_servers="127.0.0.1:9", compacted_ledger_root=str(root))
    store = LedgerStore(root)
    store.open()
    registry = TaskRegistry(NoCompactions(), 1, 60.0)  # type: ignore[arg-type]
    monitor = BacklogMonitor(settings, broker, store, registry, PolicyStore(store, ["publishing-order"]), Metrics(),
                             store_problem=lambda: store_problem)
    if stop_on_first_ask:
        broker.on_ask = monitor.stop
    try:
        monitor.run_once()
    finally:
        store.close()
    return monitor


def test_a_pass_ends_at_the_first_topic_when_no_broker_answers(tmp_path):
    broker = UnreachableBroker(answers_ping=False)
    monitor = one_pass(broker, tmp_path)
    assert broker.asked == ["topic-0"]
    assert monitor.last_run is not None


def test_a_topic_whose_leader_is_unreachable_does_not_stop_the_others(tmp_path):
    broker = UnreachableBroker(answers_ping=True)
    one_pass(broker, tmp_path)
    assert sorted(set(broker.asked)) == TOPICS


def test_a_stopped_monitor_ends_its_pass_before_the_next_topic(tmp_path):
    broker = UnreachableBroker(answers_ping=True)
    one_pass(broker, tmp_path, stop_on_first_ask=True)
    assert set(broker.asked) == {"topic-0"}


def test_no_pass_runs_while_the_ledger_roots_store_is_down(tmp_path):
    broker = UnreachableBroker(answers_ping=True)
    one_pass(broker, tmp_path, store_problem="the ledger root's store does not answer (test)")
    assert broker.asked == []
    one_pass(broker, tmp_path / "answers")
    assert sorted(set(broker.asked)) == TOPICS
