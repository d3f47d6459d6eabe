"""What the monitor keeps of a topic (``BrokerTopic``) and what reads and triggers conclude from it:
a new log, the implicit max lag of a broker-compacted topic, the strategies at risk there."""

from __future__ import annotations

import time
from typing import Any

import pytest

from compactord.daemon.monitor import BrokerTopic
from compactord.model import LedgerManifest, PartitionOffsets, StrategySettings, TopicConfigs


def manifest(topic_id: str | None = "id-1", horizon: dict[int, int] | None = None,
             finished_at: float | None = None) -> LedgerManifest:
    return LedgerManifest(1, "t", horizon if horizon is not None else {0: 9, 1: 4}, StrategySettings(), [],
                          topic_id=topic_id, finished_at_ms=int((finished_at or time.time() - 60) * 1000))


def seen(topic_id: str | None = "id-1", ends: dict[int, int] | None = None,
         configs: TopicConfigs | None = None, at: float | None = None) -> BrokerTopic:
    ends = ends if ends is not None else {0: 10, 1: 5}
    offsets = {p: PartitionOffsets(p, 0, e) for p, e in ends.items()}
    return BrokerTopic(topic_id, offsets, configs or TopicConfigs(), at or time.time())


def test_the_same_log_is_not_new() -> None:
    assert seen().new_log(manifest()) is None
    assert seen(topic_id=None).new_log(manifest()) is None  # a broker without ids: nothing to compare
    assert seen().new_log(manifest(topic_id=None)) is None  # a legacy manifest


@pytest.mark.parametrize(("broker_says", "why"), [
    ({"topic_id": "id-2"}, "topic id changed"),
    ({"ends": {0: 3, 1: 5}}, "below the horizon"),
    ({"ends": {0: 10}}, "no longer exist"),
])
def test_a_new_log_says_why(broker_says: dict[str, Any], why: str) -> None:
    assert why in (seen(**broker_says).new_log(manifest()) or "")


def test_a_view_older_than_the_ledger_tells_nothing() -> None:
    now = time.time()
    assert seen(topic_id="id-2", at=now - 10).new_log(manifest(finished_at=now)) is None


def test_a_broker_compacted_topic_is_compacted_before_its_tombstones_go() -> None:
    compacted = TopicConfigs(cleanup_policy="compact,delete", delete_retention_ms=86_400_000)
    assert seen(configs=compacted).implicit_max_lag_seconds() == 43_200
    assert seen(configs=TopicConfigs(cleanup_policy="delete", delete_retention_ms=1000)).implicit_max_lag_seconds() \
        is None
    assert seen().implicit_max_lag_seconds() is None  # unknown configs


def test_the_effective_max_lag_is_the_shorter_of_the_configured_and_the_implicit_one() -> None:
    compacted = seen(configs=TopicConfigs(cleanup_policy="compact", delete_retention_ms=86_400_000))
    assert [compacted.effective_max_lag(c) for c in (0, 86_400, 3_600)] == [43_200, 43_200, 3_600]
    plain = seen(configs=TopicConfigs(cleanup_policy="delete", delete_retention_ms=86_400_000))
    assert [plain.effective_max_lag(c) for c in (0, 86_400)] == [0, 86_400]  # 0: no max lag


def test_strategies_that_need_losers_are_at_risk_on_a_broker_compacted_topic() -> None:
    view = seen(configs=TopicConfigs(cleanup_policy="compact"))
    assert view.warnings("publishing-order") == []
    assert all("first-value" in w for w in view.warnings("first-value"))
    assert view.warnings("event-time") and view.warnings("my.module:Custom")
    assert seen(configs=TopicConfigs(cleanup_policy="delete")).warnings("first-value") == []
    assert TopicConfigs().compacted_by_broker is None and TopicConfigs().to_json()["compacted_by_broker"] is None


def test_entry_json_keeps_null_values_null_and_empty_ones_empty() -> None:
    """kafka-python cannot produce a null header value (Kafka allows one): the shape is checked here."""
    from compactord.api.views import entry_json
    from compactord.model import Entry

    entry = Entry(partition=0, offset=3, key=b"k", value=b"", headers=(("none", None), ("empty", b""), ("x", b"1")))
    data = entry_json(entry, "base64")
    assert data["value"] == ""
    assert data["headers"] == [{"key": "none", "value": None}, {"key": "empty", "value": ""},
                               {"key": "x", "value": "MQ=="}]
    assert entry_json(Entry(partition=0, offset=4, key=b"k", value=None), "utf8")["value"] is None


def test_each_trigger_says_its_kind_and_the_values_that_fired_it() -> None:
    from compactord.daemon.monitor import Backlog, triggers_fired
    from compactord.task import Reason

    backlog = Backlog("t", records=30, bytes=104857600, age_seconds=700.4, ledger_records=10)
    policy = {"thresholdBytes": 52428800, "thresholdMessages": 20, "maxLagSeconds": 600, "minDirtyRatio": 0.5}
    assert triggers_fired(backlog, policy) == [
        Reason("backlog_bytes", "backlog 104857600 bytes > threshold 52428800"),
        Reason("backlog_records", "backlog 30 records > threshold 20"),
        Reason("max_lag", "oldest uncompacted record 700s old > threshold 600s"),
        Reason("dirty_ratio", "dirty ratio 0.750 > threshold 0.5"),
    ]
    off = {"thresholdBytes": 0, "thresholdMessages": 30, "maxLagSeconds": 0, "minDirtyRatio": 0}
    assert triggers_fired(backlog, off) == []  # off, or not strictly greater
