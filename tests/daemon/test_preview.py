"""``GET /v1/topics/{topic}/compaction/preview`` on the shared daemon (a real process over HTTP, the real
broker and Spark): the exact preview equals, record for record, what the next compaction keeps."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from compactord.engine.preview import kept_digest
from tests.support.daemon import DaemonProcess, compact

from .conftest import SHARED_TOKEN, assert_error, run_cli


def _ledger(daemon: DaemonProcess, topic: str, partitions: int) -> list[dict[str, Any]]:
    entries = []
    for p in range(partitions):
        response = daemon.http.get(f"/v1/topics/{topic}/compacted", params={"partition": p, "limit": 10000})
        assert response.status_code == 200, response.text
        entries.extend(response.json()["entries"])
    return entries


def _raw(value: str | None) -> int:
    return 0 if value is None else len(base64.b64decode(value))


@pytest.mark.slow
def test_the_exact_preview_equals_the_next_compaction(shared_daemon: DaemonProcess, kafka: Any) -> None:
    topic = kafka.topic(partitions=2, prefix="preview")  # not a mon-* topic: nothing compacts it by itself
    kafka.produce(topic, [(f"k{i % 40}", f"v{i}" * (1 + i % 3), i % 2) for i in range(200)])
    compact(shared_daemon, topic)
    kafka.produce(topic, [(f"k{i % 60}", f"w{i}", i % 2) for i in range(150)]
                  + [("k1", None, 1), ("k2", None, 0), (None, "no-key", 0)])  # tombstones; a kept null key

    sampled = shared_daemon.http.get(f"/v1/topics/{topic}/compaction/preview")
    assert sampled.status_code == 200, sampled.text
    estimate = sampled.json()
    assert estimate["exact"] is False and estimate["sample_records"] == 153  # the whole tail fits the sample
    assert estimate["records_kept"] + estimate["records_removed"] == 40 + 153
    assert 0 < estimate["dirty_ratio"] < 1 and estimate["estimated_seconds"] is not None

    # A GET never starts a task: not even one a web page sends cross-site.
    cross_site = shared_daemon.http.get(f"/v1/topics/{topic}/compaction/preview", params={"exact": "true"},
                                        headers={"Origin": "http://evil.example"})
    assert cross_site.status_code == 422 and "POST" in cross_site.json()["message"], cross_site.text
    assert not [t for t in shared_daemon.http.get("/v1/tasks", params={"topic": topic}).json()["tasks"]
                if t["kind"] == "preview"]
    response = shared_daemon.http.post(f"/v1/topics/{topic}/compaction/preview", json={})
    assert response.status_code == 200, response.text
    preview = response.json()
    assert preview["exact"] is True and preview["sample_records"] is None
    for name in ("records_kept", "records_removed", "bytes_kept", "bytes_removed"):
        assert isinstance(preview[name], int), name
    status = shared_daemon.http.get(f"/v1/topics/{topic}/compaction").json()
    assert status["task_id"] != preview["task_id"]  # the topic's last compaction is still the first one
    listed = shared_daemon.http.get("/v1/tasks", params={"topic": topic}).json()["tasks"]
    assert [t["kind"] for t in listed if t["task_id"] == preview["task_id"]] == ["preview"]

    compact(shared_daemon, topic)
    kept = _ledger(shared_daemon, topic, 2)
    assert preview["records_kept"] == len(kept) == 59  # 60 keys, 2 deleted, and the null-key record
    assert preview["bytes_kept"] == sum(_raw(e["key"]) + _raw(e["value"]) for e in kept)
    assert preview["kept_digest"] == kept_digest([(e["partition"], e["offset"]) for e in kept])
    assert preview["markers"] == 2  # k1 and k2: each deletion kept as a marker for its retention
    assert preview["records_removed"] == 40 + 153 - 59 - 2
    assert sampled.json()["records_kept"] > 0

    # The CLI, after the compaction: nothing left in the tail, so the estimate is the ledger itself.
    env = {"COMPACTORD_URL": shared_daemon.url, "COMPACTORD_TOKEN": SHARED_TOKEN}
    table = run_cli("preview", topic, env=env)
    assert table.returncode == 0, table.stderr
    assert "estimate from 0 tail records" in table.stdout and "kept           59" in table.stdout
    exact = run_cli("preview", topic, "--exact", "--json", env=env)
    assert exact.returncode == 0, exact.stderr
    again = json.loads(exact.stdout)
    assert again["exact"] is True and again["records_kept"] == 59 and again["records_removed"] == 0


def test_a_preview_of_a_topic_the_broker_does_not_have_is_404(shared_daemon: DaemonProcess) -> None:
    assert_error(shared_daemon.http.get("/v1/topics/no-such-topic-for-preview/compaction/preview"), 404,
                 "topic_not_found")
