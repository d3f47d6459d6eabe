"""The backlog monitor of a running daemon: each of the four triggers fires on its own, the topic
pattern (a full match) excludes topics, per-topic policies override the broker-wide thresholds, and
``/metrics`` shows what happened.

Uses the shared daemon, whose monitor runs every second over the ``mon-*`` topics; broker-wide,
only ``compactionThresholdInMessages=1000`` is on, and each trigger topic's policy enables the
trigger under test and turns the others off.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, compact, metric, metric_samples, wait_state
from tests.support.waiting import wait_for

from .conftest import (
    FAILING_STRATEGY,
    MONITOR_PATTERN,
    SHARED_THRESHOLD_MESSAGES,
    assert_error,
)

pytestmark = pytest.mark.slow

OFF = {"thresholdBytes": 0, "thresholdMessages": 0, "maxLagSeconds": 0, "minDirtyRatio": 0}
MONITOR_WAIT_S = 60


@pytest.fixture(scope="module")
def daemon(shared_daemon: DaemonProcess) -> DaemonProcess:
    return shared_daemon


def tasks_of(daemon: DaemonProcess, topic: str) -> list[dict[str, Any]]:
    response = daemon.http.get("/v1/tasks", params={"topic": topic})
    assert response.status_code == 200, response.text
    tasks: list[dict[str, Any]] = response.json()["tasks"]
    return tasks


def passes(daemon: DaemonProcess) -> float:
    return metric(daemon, "compactord_monitor_runs_total", result="ok") or 0.0


def wait_passes(daemon: DaemonProcess, count: int = 3) -> None:
    start = passes(daemon)
    wait_for(lambda: passes(daemon) >= start + count, 30, f"{count} monitor passes", daemon)


def set_policy(daemon: DaemonProcess, topic: str, **overrides: Any) -> dict[str, Any]:
    response = daemon.http.put(f"/v1/topics/{topic}/policies", json={**OFF, **overrides})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def wait_triggered(daemon: DaemonProcess, topic: str, kind: str, reason: str) -> dict[str, Any]:
    """Wait for the monitor to start a task for ``topic``; check that the task and the log say why: the
    reason ``kind`` and a detail that matches ``reason``."""
    tasks = wait_for(lambda: tasks_of(daemon, topic), MONITOR_WAIT_S, f"the monitor to compact {topic}",
                     daemon)
    first: dict[str, Any] = tasks[-1]
    assert first["reason"] == kind and re.search(reason, first["reason_detail"]), first
    line = f"compacting topic {re.escape(topic)} \\(reason {kind}\\): .*{reason}"
    wait_for(lambda: re.search(line, daemon.log_text()), 10, f"the log to say why {topic} was compacted", daemon)
    return first


def test_bytes_trigger(daemon: DaemonProcess, kafka: Any) -> None:
    topic = kafka.topic(prefix="mon")
    set_policy(daemon, topic, thresholdBytes=500)
    kafka.produce(topic, [(f"key-{i % 4}", "x" * 100) for i in range(20)])  # ~2 KB
    wait_triggered(daemon, topic, "backlog_bytes", r"backlog \d+ bytes > threshold 500")


def test_messages_trigger_overrides_the_broker_wide_threshold(daemon: DaemonProcess, kafka: Any) -> None:
    topic, control = kafka.topic(prefix="mon"), kafka.topic(prefix="mon")
    policy = set_policy(daemon, topic, thresholdMessages=5)
    assert policy["effective"]["thresholdMessages"] == 5
    control_policy = daemon.http.get(f"/v1/topics/{control}/policies").json()
    assert control_policy["effective"]["thresholdMessages"] == SHARED_THRESHOLD_MESSAGES
    for t in (topic, control):
        kafka.produce(t, [(f"key-{i % 3}", f"v{i}") for i in range(10)])
    wait_triggered(daemon, topic, "backlog_records", r"backlog 10 records > threshold 5")
    wait_passes(daemon)
    assert tasks_of(daemon, control) == []  # 10 records are not > 1000
    assert metric(daemon, "compactord_backlog_records", topic=control) == 10


def test_max_lag_trigger(daemon: DaemonProcess, kafka: Any) -> None:
    topic = kafka.topic(prefix="mon")
    set_policy(daemon, topic, maxLagSeconds=600)
    an_hour_ago = int(time.time() * 1000) - 3600_000
    kafka.produce(topic, [(f"key-{i}", "old", 0, an_hour_ago) for i in range(3)])
    wait_triggered(daemon, topic, "max_lag", r"old > threshold 600s")


def test_dirty_ratio_trigger(daemon: DaemonProcess, kafka: Any) -> None:
    topic = kafka.topic(prefix="mon")
    kafka.produce(topic, [(f"key-{i}", "first") for i in range(20)])
    first = compact(daemon, topic)  # ledger: 20 entries
    set_policy(daemon, topic, minDirtyRatio=0.5)
    kafka.produce(topic, [(f"key-{i}", "second") for i in range(5)])  # 5 / 25 = 0.2: not dirty enough
    wait_passes(daemon)
    assert [t["task_id"] for t in tasks_of(daemon, topic)] == [first["task_id"]]
    assert metric(daemon, "compactord_dirty_ratio", topic=topic) == pytest.approx(0.2)
    kafka.produce(topic, [(f"key-{i}", "third") for i in range(20)])  # 25 / 45 = 0.56
    wait_for(lambda: len(tasks_of(daemon, topic)) == 2, MONITOR_WAIT_S, "the dirty-ratio trigger", daemon)
    # 0.556 once all 20 are in; a pass may see the production half done (e.g. 23 / 43 = 0.535)
    line = rf"compacting topic {topic} \(reason dirty_ratio\): dirty ratio 0\.5\d\d > threshold 0\.5"
    wait_for(lambda: re.search(line, daemon.log_text()), 10, "the log line of the dirty-ratio trigger", daemon)
    assert tasks_of(daemon, topic)[0]["reason"] == "dirty_ratio"
    wait_for(lambda: metric(daemon, "compactord_tasks_total", reason="dirty_ratio", result="succeeded"), 60,
             "the dirty-ratio task to end, counted under its reason", daemon)


def test_pattern_must_match_the_whole_name(daemon: DaemonProcess, kafka: Any) -> None:
    from kafka.admin import NewTopic

    suffix = f"{time.time_ns() % 10**6}-abcdef"
    longer, prefixed = f"mon-{suffix}-x", f"xmon-{suffix}"
    for topic in (longer, prefixed):
        assert re.search(MONITOR_PATTERN, topic) and not re.fullmatch(MONITOR_PATTERN, topic)
    kafka.admin.create_topics([NewTopic(longer, 1, 1), NewTopic(prefixed, 1, 1)])
    for topic in (longer, prefixed):
        set_policy(daemon, topic, thresholdMessages=1)
        kafka.produce(topic, [(f"k{i}", "v") for i in range(10)])
    wait_passes(daemon)
    for topic in (longer, prefixed):
        assert tasks_of(daemon, topic) == []
        assert metric(daemon, "compactord_backlog_records", topic=topic) is None  # not even measured
    # the pattern does not restrict a manual trigger
    assert daemon.http.put(f"/v1/topics/{longer}/compaction").status_code == 202
    assert wait_state(daemon, longer, "Succeed", "Failed")["status"] == "SUCCESS"


def test_a_broken_policies_file_skips_only_its_topic(daemon: DaemonProcess, kafka: Any) -> None:
    from kafka.admin import NewTopic

    broken = "mon-0-000000"  # sorts before every other topic here: each pass meets it first
    kafka.admin.create_topics([NewTopic(broken, 1, 1)])
    kafka.produce(broken, [("k", "v")] * 3)
    (daemon.root / broken).mkdir(parents=True, exist_ok=True)
    (daemon.root / broken / "policies.json").write_text("{edited by hand")
    topic = kafka.topic(prefix="mon")
    set_policy(daemon, topic, thresholdMessages=2)
    kafka.produce(topic, [(f"k{i}", "v") for i in range(5)])
    wait_triggered(daemon, topic, "backlog_records", r"5 records > threshold 2")
    assert tasks_of(daemon, broken) == []
    body = assert_error(daemon.http.get(f"/v1/topics/{broken}/policies"), 500)
    assert "policies.json" in body["message"] and "PUT" in body["message"]
    # a PUT replaces the broken file
    assert set_policy(daemon, broken)["policies"]["thresholdMessages"] == 0
    assert daemon.http.get(f"/v1/topics/{broken}/policies").status_code == 200


def test_policies_are_persisted(daemon: DaemonProcess, kafka: Any) -> None:
    topic = kafka.topic(prefix="mon")
    put = set_policy(daemon, topic, thresholdMessages=7)
    assert put["policies"] == {**OFF, "thresholdMessages": 7, "strategy": None, "keyTtlMs": None,
                               "maxReadBytesPerSecond": None, "iceberg": None}
    assert daemon.http.get(f"/v1/topics/{topic}/policies").json() == put
    assert (daemon.root / topic / "policies.json").is_file()
    deleted = daemon.http.delete(f"/v1/topics/{topic}/policies").json()
    assert deleted["effective"]["thresholdMessages"] == SHARED_THRESHOLD_MESSAGES
    assert not (daemon.root / topic / "policies.json").exists()


def test_each_monitored_topic_exports_its_effective_max_lag(daemon: DaemonProcess, kafka: Any) -> None:
    """What the delay alert compares a topic's backlog age with: the policy's max lag, else the broker-wide
    one (0 here: none)."""
    overridden, default = kafka.topic(prefix="mon"), kafka.topic(prefix="mon")
    set_policy(daemon, overridden, maxLagSeconds=3600)
    wait_for(lambda: metric(daemon, "compactord_topic_max_lag_seconds", topic=overridden) == 3600, MONITOR_WAIT_S,
             "the max lag of the topic's policy on /metrics", daemon)
    wait_for(lambda: metric(daemon, "compactord_topic_max_lag_seconds", topic=default) == 0, MONITOR_WAIT_S,
             "the broker-wide max lag (none) on /metrics", daemon)
    set_policy(daemon, overridden, maxLagSeconds=60)
    wait_for(lambda: metric(daemon, "compactord_topic_max_lag_seconds", topic=overridden) == 60, MONITOR_WAIT_S,
             "a changed policy's max lag on /metrics", daemon)


def test_metrics_after_compactions(daemon: DaemonProcess, kafka: Any) -> None:
    topic = kafka.topic(prefix="mon")
    kafka.produce(topic, [(f"key-{i % 3}", f"v{i}") for i in range(12)])  # 3 keys: 9 removed
    final = compact(daemon, topic)
    assert final["status"] == "SUCCESS"
    assert metric(daemon, "compactord_compactions_total", topic=topic, result="succeeded") == 1
    assert metric(daemon, "compactord_compactions_total", topic=topic, result="failed") in (None, 0)
    assert metric(daemon, "compactord_removed_events_total", topic=topic) == 9
    assert metric(daemon, "compactord_compacted_entries", topic=topic) == 3
    assert metric(daemon, "compactord_compaction_duration_seconds_count", topic=topic) == 1
    assert metric(daemon, "compactord_compaction_duration_seconds_bucket", topic=topic, le="+Inf") == 1
    assert (metric(daemon, "compactord_compaction_duration_seconds_sum", topic=topic) or 0) > 0
    since = metric(daemon, "compactord_seconds_since_last_success", topic=topic)
    assert since is not None and 0 <= since < 120
    names = {name for name, _labels, _value in metric_samples(daemon)}
    assert {"compactord_running_tasks", "compactord_pending_tasks", "compactord_ready"} <= names
    running = metric(daemon, "compactord_running_tasks")
    assert running is not None and running >= 0
    # the monitor measures the backlog after the horizon: none once compacted
    wait_for(lambda: metric(daemon, "compactord_backlog_records", topic=topic) == 0, 30,
             "the backlog metric to drop to 0 after the compaction", daemon)
    kafka.produce(topic, [("key-0", "later")])
    wait_for(lambda: metric(daemon, "compactord_backlog_records", topic=topic) == 1, 30,
             "the backlog metric to count one new record", daemon)


def test_cleanliness_metrics_after_a_known_backlog(daemon: DaemonProcess, kafka: Any) -> None:
    """Kafka's cleaner gauges: the largest compaction delay and dirty ratio over the monitored topics, the
    time since the monitor's pass, and the share of its read the last run kept."""
    topic = kafka.topic(prefix="mon")
    set_policy(daemon, topic)  # every trigger off: the backlog stays until the test compacts it
    ten_days_s = 10 * 86400
    produced_at = time.time()
    # older than any other record of the shared daemon's topics: this topic sets the maximum
    kafka.produce(topic, [(f"key-{i % 3}", f"v{i}", 0, int((produced_at - ten_days_s) * 1000)) for i in range(6)])
    wait_for(lambda: metric(daemon, "compactord_backlog_records", topic=topic) == 6, 30,
             "the monitor to measure the topic's backlog", daemon)
    # The topic's own gauges may come from a measure outside a pass (a policy change, a listing); the
    # maxima come from the monitor's pass: wait for the first pass that saw the topic.
    wait_for(lambda: (metric(daemon, "compactord_max_compaction_delay_seconds") or 0) >= ten_days_s, 30,
             "a monitor pass to see the topic's backlog", daemon)
    scrape = {(name, labels.get("topic")): value for name, labels, value in metric_samples(daemon)}
    delay = scrape[("compactord_max_compaction_delay_seconds", None)]
    assert ten_days_s <= delay < ten_days_s + (time.time() - produced_at) + 5, delay
    assert delay == pytest.approx(scrape[("compactord_backlog_age_seconds", topic)], abs=5)  # a pass apart at most
    assert scrape[("compactord_max_dirty_ratio", None)] == 1.0  # a topic never compacted is all dirty
    assert 0 <= scrape[("compactord_seconds_since_monitor_run", None)] < 30  # the monitor runs every second

    final = compact(daemon, topic)  # 6 records of 3 keys: half of them kept
    assert final["reason"] == "manual" and final["reason_detail"] == ""
    assert metric(daemon, "compactord_last_run_kept_ratio", topic=topic) == 0.5
    wait_for(lambda: (metric(daemon, "compactord_max_compaction_delay_seconds") or 0) < ten_days_s, 30,
             "the largest compaction delay to drop once the old records are compacted", daemon)
    deleted = daemon.http.delete(f"/v1/topics/{topic}")
    assert deleted.status_code == 200, deleted.text
    assert metric(daemon, "compactord_last_run_kept_ratio", topic=topic) is None  # gone with its topic


def test_uncleanable_bytes_count_the_backlog_of_failing_topics(daemon: DaemonProcess, kafka: Any) -> None:
    topic = kafka.topic(prefix="mon")
    set_policy(daemon, topic, strategy=FAILING_STRATEGY)  # every trigger off, a strategy that fails
    kafka.produce(topic, [(f"key-{i % 2}", "x" * 50) for i in range(8)])
    assert daemon.http.put(f"/v1/topics/{topic}/compaction").status_code == 202
    final = wait_state(daemon, topic, "Succeed", "Failed", "Cancelled")
    assert final["state"] == "Failed", final
    backlog = wait_for(lambda: metric(daemon, "compactord_backlog_bytes", topic=topic), 30,
                       "the monitor to measure the failed topic's backlog", daemon)
    assert backlog >= 8 * 50
    wait_for(lambda: metric(daemon, "compactord_uncleanable_bytes") == backlog, 30,
             "the failed topic's backlog to count as uncleanable", daemon)
    [run] = daemon.http.get(f"/v1/topics/{topic}/history").json()["runs"]
    assert run["state"] == "Failed" and run["error"] and run["records_written"] == 0
    # a run that succeeds makes it clean again
    set_policy(daemon, topic)
    assert compact(daemon, topic)["status"] == "SUCCESS"
    wait_for(lambda: metric(daemon, "compactord_uncleanable_bytes") == 0, 30,
             "the uncleanable bytes to drop once the topic's compaction succeeds", daemon)


def listed(daemon: DaemonProcess, topic: str) -> dict[str, Any]:
    response = daemon.http.get("/v1/topics", params={"prefix": topic})
    assert response.status_code == 200, response.text
    [entry] = [t for t in response.json()["topics"] if t["topic"] == topic]
    return entry  # type: ignore[no-any-return]


def test_a_topic_changed_appears_changed_in_the_listing_within_one_pass(daemon: DaemonProcess, kafka: Any) -> None:
    """The listing answers from the monitor's passes (not from requests of its own): a compaction's result and
    records produced after it are in the listing once a pass that started after them has ended, each backlog with
    the time it was measured."""
    topic = kafka.topic(prefix="mon")
    kafka.produce(topic, [(f"k{i % 4}", f"v{i}") for i in range(12)])
    wait_passes(daemon, 2)
    first = listed(daemon, topic)
    assert first["backlog"]["records"] == 12 and first["last_compaction"]["status"] == "NOT_RUN", first
    assert first["behind"] is False and first["backlog"]["measure_age_ms"] >= 0, first
    final = compact(daemon, topic)
    assert listed(daemon, topic)["last_compaction"]["task_id"] == final["task_id"]  # the task is in memory
    produced_at = time.time()
    kafka.produce(topic, [(f"k{i}", f"w{i}") for i in range(5)])
    wait_passes(daemon, 2)  # the second began after the records were produced
    entry = listed(daemon, topic)
    assert entry["backlog"]["records"] == 5, entry
    measured = entry["backlog"]["measured_at"]
    assert measured is not None and time.mktime(time.strptime(measured[:19], "%Y-%m-%dT%H:%M:%S")) \
        - time.timezone >= int(produced_at), (measured, produced_at)
    assert entry["last_compaction"]["status"] == "SUCCESS", entry


def test_the_listed_backlog_of_a_recreated_topic_is_its_whole_new_log(daemon: DaemonProcess, kafka: Any) -> None:
    """Not what lies past the old ledger's horizon (nothing): the pass measures a log that is not the ledger's
    from its start. The topic is outside the pattern, so that no trigger rebuilds it meanwhile."""
    topic = kafka.topic(prefix="xmon")
    assert not re.fullmatch(MONITOR_PATTERN, topic)
    kafka.produce(topic, [(f"old{i}", f"v{i}") for i in range(100)])
    compact(daemon, topic)
    kafka.recreate(topic)
    kafka.produce(topic, [(f"new{i}", f"w{i}") for i in range(10)])
    wait_for(lambda: (listed(daemon, topic).get("backlog") or {}).get("records") == 10, 60,
             "the listing to show the recreated topic's whole new log as its backlog", daemon)
    assert {t["reason"] for t in tasks_of(daemon, topic)} == {"manual"}  # no trigger ran: the pass measured it
