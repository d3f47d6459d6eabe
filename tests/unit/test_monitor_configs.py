"""What the backlog monitor logs of a topic's cleanup configs, through the broker seam (``BrokerMetadata``):
a broker that does not describe them is said once per topic, however often the topic is refreshed (each pass,
each compaction's end), and said again when its answer changes; what is remembered of the topics is bounded."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from compactord.config import Settings
from compactord.daemon import monitor as monitor_module
from compactord.daemon.metrics import Metrics
from compactord.daemon.monitor import BacklogMonitor
from compactord.daemon.policies import PolicyStore
from compactord.daemon.scheduler import TaskRegistry
from compactord.interfaces import BrokerMetadata
from compactord.ledger.store import LedgerStore
from compactord.model import TopicConfigs
from tests.unit.test_monitor_pass import NoCompactions

UNKNOWN = TopicConfigs()
DELETE = TopicConfigs(cleanup_policy="delete", retention_ms=604_800_000)
COMPACT = TopicConfigs(cleanup_policy="compact", delete_retention_ms=86_400_000)


class DescribingBroker(BrokerMetadata):
    """Answers every topic, with ``configs`` as its DescribeConfigs answer (``UNKNOWN``: it did not describe)."""

    def __init__(self) -> None:
        self.configs = UNKNOWN

    def list_topics(self) -> list[str]:
        return []

    def ping(self) -> None:
        pass

    def partitions(self, topic: str) -> list[int]:
        return [0]

    def topic_id(self, topic: str) -> str | None:
        return None

    def offsets(self, topic: str) -> Any:
        return {}

    def first_records(self, topic: str, at: Mapping[int, int], offsets: Any) -> Any:
        return {}

    def topic_configs(self, topic: str) -> TopicConfigs:
        return self.configs

    def close(self) -> None:
        pass


@pytest.fixture
def monitor(tmp_path: Path) -> Iterator[tuple[BacklogMonitor, DescribingBroker]]:
    broker = DescribingBroker()
    settings = Settings(kafka_bootstrap_servers="127.0.0.1:9", compacted_ledger_root=str(tmp_path))
    store = LedgerStore(tmp_path)
    store.open()
    registry = TaskRegistry(NoCompactions(), 1, 60.0)  # type: ignore[arg-type]
    try:
        yield BacklogMonitor(settings, broker, store, registry, PolicyStore(store, ["publishing-order"]),
                             Metrics()), broker
    finally:
        store.close()


def told(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if r.name == "compactord.daemon.monitor"]
    caplog.clear()
    return lines


def test_an_undescribed_topic_is_said_once_and_again_when_the_answer_changes(
        monitor: tuple[BacklogMonitor, DescribingBroker], caplog: pytest.LogCaptureFixture) -> None:
    mon, broker = monitor
    caplog.set_level(logging.INFO, logger="compactord.daemon.monitor")
    for _ in range(5):  # passes, and the refresh after each compaction
        mon.refresh("prices")
    assert told(caplog) == [("topic prices: the broker did not describe its cleanup configs (DescribeConfigs); "
                             "whether it compacts the topic itself is unknown")]
    mon.refresh("ticks")
    assert [line.split(":")[0] for line in told(caplog)] == ["topic ticks"]  # each topic once

    broker.configs = COMPACT  # the broker describes it now (a grant, an upgrade)
    mon.refresh("prices")
    mon.refresh("prices")
    assert told(caplog) == [("topic prices: the broker describes its cleanup configs now: cleanup.policy=compact, "
                             "delete.retention.ms=86400000")]
    broker.configs = UNKNOWN  # and no longer
    mon.refresh("prices")
    mon.refresh("prices")
    assert len(told(caplog)) == 1


def test_a_described_topic_is_said_only_when_its_configs_change(
        monitor: tuple[BacklogMonitor, DescribingBroker], caplog: pytest.LogCaptureFixture) -> None:
    mon, broker = monitor
    caplog.set_level(logging.INFO, logger="compactord.daemon.monitor")
    broker.configs = DELETE
    mon.refresh("prices")
    mon.refresh("prices")
    assert told(caplog) == []
    broker.configs = COMPACT
    mon.refresh("prices")
    assert told(caplog) == [("topic prices: the broker describes its cleanup configs now: cleanup.policy=compact, "
                             "delete.retention.ms=86400000")]


def test_the_topics_told_are_bounded(monitor: tuple[BacklogMonitor, DescribingBroker],
                                     caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    mon, _ = monitor
    monkeypatch.setattr(monitor_module, "CONFIGS_TOLD_MAX", 3)
    caplog.set_level(logging.INFO, logger="compactord.daemon.monitor")
    for topic in ("t0", "t1", "t2", "t1", "t3", "t1"):  # t1 is kept (told recently), t0 goes first
        mon.refresh(topic)
    assert [line.split(":")[0] for line in told(caplog)] == ["topic t0", "topic t1", "topic t2", "topic t3"]
    mon.refresh("t1")
    mon.refresh("t0")  # past the bound: said again
    assert [line.split(":")[0] for line in told(caplog)] == ["topic t0"]
