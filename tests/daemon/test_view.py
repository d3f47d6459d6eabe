"""The compacted view over HTTP under what real brokers do, against the real daemon and the real test
broker: a topic deleted and recreated behind the daemon's back (Apache Kafka tells nobody), and Kafka's
rule for empty values, end to end.
"""

from __future__ import annotations

import base64
import time
from typing import Any

from tests.support.daemon import DaemonProcess, compact, metric
from tests.support.waiting import wait_for

from .conftest import assert_error


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _view(daemon: DaemonProcess, topic: str) -> dict[bytes, bytes | None]:
    response = daemon.http.get(f"/v1/topics/{topic}/compacted", params={"partition": 0, "limit": 10000})
    assert response.status_code == 200, response.text
    return {base64.b64decode(e["key"]): None if e["value"] is None else base64.b64decode(e["value"])
            for e in response.json()["entries"]}


def test_a_recreated_topic_answers_410_until_its_rebuild_lands(shared_daemon: DaemonProcess, kafka: Any) -> None:
    """Reproduced from the issue on the real broker: 100 keys compacted, the topic deleted and created
    again with nothing calling the DELETE hook, 150 new records. The daemon's monitor (one-second
    interval) sees the new topic id; reads answer 410 ``topic_recreated`` instead of the old view, and
    the next compaction rebuilds in full from the new log."""
    daemon = shared_daemon
    topic = kafka.topic(prefix="view")
    kafka.produce(topic, [(f"old{i}", f"v{i}") for i in range(100)])
    compact(daemon, topic)
    assert len(_view(daemon, topic)) == 100
    before = metric(daemon, "compactord_recreated_rebuilds_total", topic=topic) or 0.0

    kafka.recreate(topic)
    kafka.produce(topic, [(f"new{i}", f"w{i}") for i in range(150)])
    gone = wait_for(lambda: (r := daemon.http.get(f"/v1/topics/{topic}/compacted",
                                                  params={"partition": 0})).status_code == 410 and r,
                    60, "reads of the recreated topic to answer 410", daemon)
    assert_error(gone, 410, "topic_recreated")
    assert_error(daemon.http.get(f"/v1/topics/{topic}/compacted/last", params={"partition": 0}), 410,
                 "topic_recreated")

    compact(daemon, topic)
    assert _view(daemon, topic) == {f"new{i}".encode(): f"w{i}".encode() for i in range(150)}
    assert metric(daemon, "compactord_recreated_rebuilds_total", topic=topic) == before + 1


def test_empty_values_are_values_over_http(shared_daemon: DaemonProcess,
                                                                   kafka: Any) -> None:
    daemon = shared_daemon
    topic = kafka.topic(prefix="view")
    kafka.produce(topic, [("empty", b""), ("null", "x"), ("null", None),
                          ("headers", "v", 0, None, [("empty", b""), ("set", b"1")])])
    compact(daemon, topic)
    assert _view(daemon, topic) == {b"empty": b"", b"headers": b"v"}
    entries = daemon.http.get(f"/v1/topics/{topic}/compacted", params={"partition": 0}).json()["entries"]
    empty = next(e for e in entries if e["key"] == _b64(b"empty"))
    assert empty["value"] == ""  # an empty value, not null
    headers = next(e for e in entries if e["key"] == _b64(b"headers"))["headers"]
    assert headers == [{"key": "empty", "value": ""}, {"key": "set", "value": _b64(b"1")}]
    horizon = daemon.http.get(f"/v1/topics/{topic}/horizon").json()
    assert horizon["rules"] == {"strategy": "publishing-order", "event_time_source": "timestamp",
                                "empty_value_is_tombstone": False, "retain_null_key": True, "key_ttl_ms": 0}


def test_a_topic_the_broker_compacts_itself_shows_its_configs_and_the_risk(shared_daemon: DaemonProcess,
                                                                           kafka: Any) -> None:
    """The test broker describes ``cleanup.policy`` of a topic created with it; the monitor's refresh
    (one second here) brings it to ``GET /v1/topics`` with the warning for a strategy that needs losers."""
    from kafka.admin import NewTopic

    daemon = shared_daemon
    topic = f"view-bc-{time.time_ns() % 10**9}"
    kafka.admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"cleanup.policy": "compact"})])
    kafka.produce(topic, [("k", "v")])
    assert daemon.http.put(f"/v1/topics/{topic}/policies", json={"strategy": "first-value"}).status_code == 200
    compact(daemon, topic)

    def listed() -> dict[str, Any] | None:
        rows = daemon.http.get("/v1/topics", params={"limit": 1000}).json()["topics"]
        row = next((r for r in rows if r["topic"] == topic), None)
        return row if row is not None and row["broker"] is not None else None

    row = wait_for(listed, 30, f"{topic} with the broker's view in GET /v1/topics", daemon)
    assert row["broker"]["configs"]["cleanup_policy"] == "compact"
    assert row["broker"]["configs"]["compacted_by_broker"] is True
    assert any("first-value" in w and "broker compacts" in w for w in row["warnings"])
    # its series exist once a pass sees it with a ledger (the monitor passes every second here)
    wait_for(lambda: metric(daemon, "compactord_topic_broker_compacted", topic=topic) == 1.0, 30,
             f"{topic}'s compactord_topic_broker_compacted series", daemon)
