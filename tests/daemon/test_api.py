"""The HTTP API of a running daemon: auth, topic-name and parameter validation, the error shape,
horizon and paged reads of the compacted view, listings and policies.

Uses the package's shared daemon (bearer token given as ``file:/path``, null keys retained).
"""

from __future__ import annotations

import base64
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, compact, metric, status
from tests.support.waiting import wait_for

from .conftest import SHARED_TOKEN, assert_error

pytestmark = pytest.mark.slow

HEADERS = [("h1", b"\x00\x01"), ("h2", b"")]
P0_TIMESTAMP = 1_700_000_000_000


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@pytest.fixture(scope="module")
def read_topic(shared_daemon: DaemonProcess, kafka: Any) -> dict[str, Any]:
    """A compacted 3-partition topic: partition 0 has updates, a tombstone, bytes that are not UTF-8,
    headers and a null key; partition 1 has 25 distinct keys (for paging); partition 2 is empty."""
    topic = kafka.topic(partitions=3, prefix="api")
    before = {
        "horizon": shared_daemon.http.get(f"/v1/topics/{topic}/horizon"),
        "compacted": shared_daemon.http.get(f"/v1/topics/{topic}/compacted", params={"partition": 0}),
        "last": shared_daemon.http.get(f"/v1/topics/{topic}/compacted/last", params={"partition": 0}),
        "status": status(shared_daemon, topic),
    }
    kafka.produce(topic, [
        ("k0", "a0", 0),  # offset 0, replaced by offset 3
        ("k1", "a1", 0),  # offset 1, deleted by offset 4
        ("k2", "a2", 0, P0_TIMESTAMP, HEADERS),  # offset 2
        ("k0", "b0", 0),  # offset 3
        ("k1", None, 0),  # offset 4: tombstone
        ("bin", b"\xff\xfe", 0),  # offset 5: not UTF-8
        (None, "no-key", 0),  # offset 6: kept in place (topicCompactionRetainNullKey=true)
    ])
    kafka.produce(topic, [(f"k-{i:02d}", f"v-{i}", 1) for i in range(25)])
    final = compact(shared_daemon, topic)
    return {"topic": topic, "before": before, "final": final}


# -- auth -----------------------------------------------------------------------------------------

PROTECTED = ["/v1/topics", "/v1/tasks", "/docs", "/openapi.json", "/v1/topics/some-topic/compaction",
             "/v1/topics/some-topic/policies"]


@pytest.mark.parametrize("path", PROTECTED)
def test_protected_paths_need_the_token(shared_daemon: DaemonProcess, path: str) -> None:
    with shared_daemon.client(token=None) as c:
        assert_error(c.get(path), 401, "unauthorized")
        assert_error(c.get(path, headers={"Authorization": "Basic dXNlcjpwYXNz"}), 401, "unauthorized")
        assert_error(c.get(path, headers={"Authorization": "Bearer"}), 401, "unauthorized")
    with shared_daemon.client(token="wrong-token") as c:  # a token that matches neither: who asks is unknown
        assert_error(c.get(path), 401, "unauthorized")
    with shared_daemon.client(token=SHARED_TOKEN + "x") as c:
        assert_error(c.get(path), 401, "unauthorized")
    with shared_daemon.client() as c:
        response = c.get(path)
        if "some-topic" in path:  # past auth: a name the broker lacks
            assert_error(response, 404, "topic_not_found")
        else:
            assert response.status_code == 200, response.text


def test_mutations_need_the_token_too(shared_daemon: DaemonProcess, kafka: Any) -> None:
    topic = kafka.topic(prefix="api")
    with shared_daemon.client(token=None) as c:
        assert_error(c.put(f"/v1/topics/{topic}/compaction"), 401)
        assert_error(c.delete(f"/v1/topics/{topic}"), 401)
        assert_error(c.put(f"/v1/topics/{topic}/policies", json={"thresholdMessages": 1}), 401)
    with shared_daemon.client(token="nope") as c:
        assert_error(c.put(f"/v1/topics/{topic}/compaction"), 401)
        assert_error(c.post(f"/v1/topics/{topic}/unload"), 401)
    assert status(shared_daemon, topic)["status"] == "NOT_RUN"  # nothing was triggered
    assert not (shared_daemon.root / topic).exists()


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_health_and_metrics_stay_open(shared_daemon: DaemonProcess, path: str) -> None:
    with shared_daemon.client(token=None) as c:
        response = c.get(path)
    assert response.status_code == 200, response.text
    if path == "/metrics":  # the readiness gauge follows /readyz within a watchdog tick (2 s)
        wait_for(lambda: metric(shared_daemon, "compactord_ready") == 1, 10, "compactord_ready 1",
                 shared_daemon)


def test_docs_and_schema_with_the_token(shared_daemon: DaemonProcess) -> None:
    schema = shared_daemon.http.get("/openapi.json").json()
    assert "/v1/topics/{topic}/compaction" in schema["paths"]
    assert "swagger" in shared_daemon.http.get("/docs").text.lower()


# -- topic names ----------------------------------------------------------------------------------

BAD_NAMES = {
    "dotdot": ("/v1/topics/%2E%2E", "reserved"),
    "dotdot-slash-x": ("/v1/topics/..%2Fx", "no '/'"),
    "slash": ("/v1/topics/a/b", "no '/'"),
    "empty": ("/v1/topics/", "1 to 249 characters"),
    "250-chars": ("/v1/topics/" + "a" * 250, "at most 249"),
    "non-ascii": ("/v1/topics/caf%C3%A9", "outside [a-zA-Z0-9._-]"),
    "space": ("/v1/topics/a%20b", "outside [a-zA-Z0-9._-]"),
}
TOPIC_ROUTES = [
    ("PUT", "/compaction"), ("GET", "/compaction"), ("DELETE", "/compaction"), ("GET", "/horizon"),
    ("GET", "/compacted?partition=0"), ("GET", "/compacted/last?partition=0"), ("POST", "/unload"),
    ("POST", "/load"), ("GET", "/policies"), ("DELETE", "/policies"), ("DELETE", ""),
]


@pytest.mark.parametrize("name", sorted(BAD_NAMES))
def test_bad_topic_names_are_422_on_every_route(shared_daemon: DaemonProcess, name: str) -> None:
    prefix, rule = BAD_NAMES[name]
    for method, suffix in TOPIC_ROUTES:
        if name == "empty" and suffix == "":
            continue  # DELETE /v1/topics/ is not a topic route at all
        code, body = shared_daemon.raw(method, prefix + suffix)
        assert code == 422, (method, prefix + suffix, code, body)
        assert set(body) == {"error", "message"}, body
        assert body["error"] == "invalid_topic_name", (method, suffix, body)
        assert rule in body["message"], (method, suffix, body)
    assert not (shared_daemon.root.parent / "x").exists()
    assert not (shared_daemon.root / "x").exists()


@pytest.mark.parametrize("raw_path", ["/v1/topics/../compaction", "/v1/topics/./compaction",
                                      "/v1/topics/../../etc/compaction"])
def test_dot_segments_sent_verbatim(shared_daemon: DaemonProcess, raw_path: str) -> None:
    """The server does not resolve ``..`` itself: such a path never reaches another route or folder."""
    code, body = shared_daemon.raw("PUT", raw_path)
    assert code == 422, (code, body)
    assert body["error"] == "invalid_topic_name", body


def test_bad_topic_name_in_a_query(shared_daemon: DaemonProcess) -> None:
    assert_error(shared_daemon.http.get("/v1/tasks", params={"topic": "../x"}), 422, "invalid_topic_name")


def test_policies_body_must_be_valid(shared_daemon: DaemonProcess, kafka: Any) -> None:
    topic = kafka.topic(prefix="api")
    path = f"/v1/topics/{topic}/policies"
    for body in ({"thresholdMessage": 5}, {"thresholdMessages": -1}, {"thresholdBytes": "10"},
                 {"minDirtyRatio": 1.5}, {"maxLagSeconds": True}, {"strategy": "no-such-strategy"}, [1, 2]):
        assert_error(shared_daemon.http.put(path, json=body), 422)
    not_json = shared_daemon.http.put(path, content=b"{not json",
                                      headers={"content-type": "application/json"})
    assert_error(not_json, 422)
    assert shared_daemon.http.get(path).json()["policies"]["thresholdMessages"] is None
    assert not (shared_daemon.root / topic / "policies.json").exists()


def test_policy_numbers_past_their_range_answer_422_and_the_bounds_are_kept(shared_daemon: DaemonProcess,
                                                                            kafka: Any) -> None:
    """A value past a field's documented range (docs/http-api.md) is refused, never stored to fail each run of
    the topic later; the ranges' tops are taken."""
    topic = kafka.topic(prefix="api")
    path = f"/v1/topics/{topic}/policies"
    for body in ({"keyTtlMs": 2**64}, {"keyTtlMs": 10**100}, {"maxReadBytesPerSecond": 10**100},
                 {"thresholdBytes": 2**63}, {"thresholdMessages": 10**100}, {"maxLagSeconds": 2**64}):
        (name, _), = body.items()
        answer = assert_error(shared_daemon.http.put(path, json=body), 422, "invalid_argument")
        assert answer["message"].startswith(f"{name} must be a whole number from 0 to "), answer
    assert not (shared_daemon.root / topic / "policies.json").exists()
    tops = {"keyTtlMs": 3_153_600_000_000, "maxReadBytesPerSecond": 2**40, "thresholdBytes": 2**63 - 1,
            "thresholdMessages": 2**63 - 1, "maxLagSeconds": 3_153_600_000}
    put = shared_daemon.http.put(path, json=tops)
    assert put.status_code == 200, put.text
    assert {name: put.json()["policies"][name] for name in tops} == tops


# -- triggers and status --------------------------------------------------------------------------


def test_trigger_of_a_topic_the_broker_lacks_is_404(shared_daemon: DaemonProcess) -> None:
    topic = f"api-missing-{uuid.uuid4().hex[:8]}"
    body = assert_error(shared_daemon.http.put(f"/v1/topics/{topic}/compaction"), 404, "topic_not_found")
    assert topic in body["message"]
    assert not (shared_daemon.root / topic).exists()


def test_never_compacted_topic(shared_daemon: DaemonProcess, kafka: Any) -> None:
    topic = kafka.topic(prefix="api")
    kafka.produce(topic, [("k", "v")])
    assert status(shared_daemon, topic) == {
        "topic": topic, "status": "NOT_RUN", "state": None, "task_id": None, "reason": None,
        "reason_detail": None, "started_at": None, "finished_at": None, "last_error": None,
        "progress": {"records_read": 0, "records_total": 0},
        "full_rebuild": False, "recreated": False, "storage_requests": {}, "read_throttle": None, "kind": None,
        "warnings": [],
    }
    # The schema /openapi.json gives a task names every key a task's status has, each required.
    task_schema = shared_daemon.http.get("/openapi.json").json()["components"]["schemas"]["Task"]
    assert set(task_schema["properties"]) == set(task_schema["required"]) == set(status(shared_daemon, topic))
    assert shared_daemon.http.get(f"/v1/topics/{topic}/history").json() == {"topic": topic, "runs": [], "next": None}
    assert_error(shared_daemon.http.get(f"/v1/topics/{topic}/history", params={"limit": 0}), 422, "invalid_argument")
    assert_error(shared_daemon.http.get(f"/v1/topics/{topic}/horizon"), 404, "not_compacted")
    assert_error(shared_daemon.http.get(f"/v1/topics/{topic}/compacted", params={"partition": 0}), 404,
                 "not_compacted")
    assert_error(shared_daemon.http.get(f"/v1/topics/{topic}/compacted/last", params={"partition": 0}), 404,
                 "not_compacted")
    assert_error(shared_daemon.http.delete(f"/v1/topics/{topic}/compaction"), 404, "no_task_running")


def test_unknown_route_and_method(shared_daemon: DaemonProcess) -> None:
    assert_error(shared_daemon.http.get("/nope"), 404, "not_found")
    assert_error(shared_daemon.http.get("/v2/topics"), 404, "not_found")
    assert_error(shared_daemon.http.post("/v1/topics/some-topic/compaction"), 405, "method_not_allowed")
    assert_error(shared_daemon.http.patch("/v1/topics/some-topic/policies", json={}), 405,
                 "method_not_allowed")


# -- horizon and reads ----------------------------------------------------------------------------


def test_horizon(shared_daemon: DaemonProcess, read_topic: dict[str, Any]) -> None:
    topic = read_topic["topic"]
    assert_error(read_topic["before"]["horizon"], 404, "not_compacted")
    body = shared_daemon.http.get(f"/v1/topics/{topic}/horizon").json()
    assert body["topic"] == topic
    assert isinstance(body["ledger_id"], int) and body["ledger_id"] >= 1
    assert body["partitions"] == [{"partition": 0, "offset": 6}, {"partition": 1, "offset": 24},
                                  {"partition": 2, "offset": -1}]


def test_status_before_and_after(shared_daemon: DaemonProcess, read_topic: dict[str, Any]) -> None:
    assert read_topic["before"]["status"]["status"] == "NOT_RUN"
    final = read_topic["final"]
    assert final["status"] == "SUCCESS" and final["state"] == "Succeed"
    assert final["progress"]["records_read"] == final["progress"]["records_total"] == 32
    assert final["finished_at"] >= final["started_at"]


def test_read_partition_base64(shared_daemon: DaemonProcess, read_topic: dict[str, Any]) -> None:
    topic = read_topic["topic"]
    assert_error(read_topic["before"]["compacted"], 404, "not_compacted")
    body = shared_daemon.http.get(f"/v1/topics/{topic}/compacted", params={"partition": 0}).json()
    ledger_id = shared_daemon.http.get(f"/v1/topics/{topic}/horizon").json()["ledger_id"]
    assert body["ledger_id"] == ledger_id
    assert body["next_start"] is None
    entries = body["entries"]
    assert [(e["offset"], e["key"], e["value"]) for e in entries] == [
        (2, b64(b"k2"), b64(b"a2")),
        (3, b64(b"k0"), b64(b"b0")),
        (5, b64(b"bin"), b64(b"\xff\xfe")),
        (6, None, b64(b"no-key")),  # a null key is JSON null
    ]
    assert all(e["partition"] == 0 for e in entries)
    assert entries[0]["timestamp"] == P0_TIMESTAMP
    assert entries[0]["headers"] == [{"key": k, "value": b64(v)} for k, v in HEADERS]
    assert entries[1]["headers"] == []
    assert all(isinstance(e["timestamp"], int) for e in entries)


def test_read_utf8(shared_daemon: DaemonProcess, read_topic: dict[str, Any]) -> None:
    topic = read_topic["topic"]
    body = shared_daemon.http.get(f"/v1/topics/{topic}/compacted",
                                  params={"partition": 1, "encoding": "utf8", "limit": 3}).json()
    assert [(e["key"], e["value"]) for e in body["entries"]] == [
        ("k-00", "v-0"), ("k-01", "v-1"), ("k-02", "v-2")]
    # headers stay base64 whatever the encoding
    p0 = shared_daemon.http.get(f"/v1/topics/{topic}/compacted",
                                params={"partition": 0, "encoding": "utf8", "limit": 2}).json()
    assert [(e["key"], e["value"]) for e in p0["entries"]] == [("k2", "a2"), ("k0", "b0")]
    assert p0["entries"][0]["headers"] == [{"key": k, "value": b64(v)} for k, v in HEADERS]
    # offset 5 holds bytes that are not UTF-8
    not_utf8 = shared_daemon.http.get(f"/v1/topics/{topic}/compacted",
                                      params={"partition": 0, "encoding": "utf8"})
    body = assert_error(not_utf8, 422, "invalid_argument")
    assert "base64" in body["message"]


def test_paged_reads(shared_daemon: DaemonProcess, read_topic: dict[str, Any]) -> None:
    topic = read_topic["topic"]
    pages, start = [], 0
    while start is not None:
        body = shared_daemon.http.get(f"/v1/topics/{topic}/compacted",
                                      params={"partition": 1, "start": start, "limit": 7}).json()
        pages.append(body["entries"])
        assert len(body["entries"]) <= 7
        start = body["next_start"]
        assert len(pages) < 10, "next_start never became null"
    assert [len(p) for p in pages] == [7, 7, 7, 4]
    offsets = [e["offset"] for page in pages for e in page]
    assert offsets == list(range(25))
    whole = shared_daemon.http.get(f"/v1/topics/{topic}/compacted",
                                   params={"partition": 1, "limit": 10000}).json()
    assert [e for page in pages for e in page] == whole["entries"]
    assert whole["next_start"] is None
    # a page that ends exactly at the horizon says so
    exact = shared_daemon.http.get(f"/v1/topics/{topic}/compacted",
                                   params={"partition": 1, "start": 20, "limit": 5}).json()
    assert [e["offset"] for e in exact["entries"]] == [20, 21, 22, 23, 24]
    assert exact["next_start"] is None
    middle = shared_daemon.http.get(f"/v1/topics/{topic}/compacted",
                                    params={"partition": 0, "start": 4, "limit": 1}).json()
    assert [e["offset"] for e in middle["entries"]] == [5]
    assert middle["next_start"] == 6
    beyond = shared_daemon.http.get(f"/v1/topics/{topic}/compacted",
                                    params={"partition": 1, "start": 25}).json()
    assert beyond["entries"] == [] and beyond["next_start"] is None


def test_read_last(shared_daemon: DaemonProcess, read_topic: dict[str, Any]) -> None:
    topic = read_topic["topic"]
    assert_error(read_topic["before"]["last"], 404, "not_compacted")
    last = shared_daemon.http.get(f"/v1/topics/{topic}/compacted/last", params={"partition": 1}).json()
    assert last == {"partition": 1, "offset": 24, "key": b64(b"k-24"), "value": b64(b"v-24"),
                    "timestamp": last["timestamp"], "headers": []}
    text = shared_daemon.http.get(f"/v1/topics/{topic}/compacted/last",
                                  params={"partition": 1, "encoding": "utf8"}).json()
    assert (text["key"], text["value"]) == ("k-24", "v-24")
    null_key = shared_daemon.http.get(f"/v1/topics/{topic}/compacted/last", params={"partition": 0}).json()
    assert null_key["offset"] == 6 and null_key["key"] is None
    assert_error(shared_daemon.http.get(f"/v1/topics/{topic}/compacted/last", params={"partition": 2}), 404,
                 "entry_not_found")
    assert_error(shared_daemon.http.get(f"/v1/topics/{topic}/compacted/last", params={"partition": 3}), 422)
    assert_error(shared_daemon.http.get(f"/v1/topics/{topic}/compacted/last"), 422)


@pytest.mark.parametrize("params", [
    {"partition": 3}, {"partition": 99}, {"partition": -1}, {"partition": "x"}, {},
    {"partition": 0, "limit": 0}, {"partition": 0, "limit": 10001}, {"partition": 0, "limit": -5},
    {"partition": 0, "start": -1}, {"partition": 0, "start": "abc"}, {"partition": 0, "encoding": "latin1"},
    {"partition": 0, "start": 2**63}, {"partition": 2**31},
], ids=repr)
def test_bad_read_parameters_are_422(shared_daemon: DaemonProcess, read_topic: dict[str, Any],
                                     params: dict[str, Any]) -> None:
    response = shared_daemon.http.get(f"/v1/topics/{read_topic['topic']}/compacted", params=params)
    body = assert_error(response, 422)
    if "partition" not in params:
        assert "partition" in body["message"]


def test_read_limit_bounds_accepted(shared_daemon: DaemonProcess, read_topic: dict[str, Any]) -> None:
    topic = read_topic["topic"]
    for limit in (1, 10000):
        response = shared_daemon.http.get(f"/v1/topics/{topic}/compacted",
                                          params={"partition": 1, "limit": limit})
        assert response.status_code == 200, response.text
        assert len(response.json()["entries"]) == min(limit, 25)


# -- listings and policies ------------------------------------------------------------------------


def test_topics_and_tasks_listings(shared_daemon: DaemonProcess, read_topic: dict[str, Any]) -> None:
    topic = read_topic["topic"]
    topics = {t["topic"]: t for t in shared_daemon.http.get("/v1/topics", params={"limit": 1000}).json()["topics"]}
    entry = topics[topic]
    assert entry["on_broker"] is True and entry["unloaded"] is False and entry["current_task"] is None
    assert entry["last_compaction"]["status"] == "SUCCESS"
    assert entry["last_compaction"]["task_id"] == read_topic["final"]["task_id"]
    tasks = shared_daemon.http.get("/v1/tasks", params={"topic": topic}).json()["tasks"]
    assert [t["task_id"] for t in tasks] == [read_topic["final"]["task_id"]]
    assert tasks[0] == read_topic["final"]
    everything = shared_daemon.http.get("/v1/tasks").json()["tasks"]
    assert read_topic["final"]["task_id"] in {t["task_id"] for t in everything}


def test_policies_round_trip(shared_daemon: DaemonProcess, kafka: Any) -> None:
    topic = kafka.topic(prefix="api")
    path = f"/v1/topics/{topic}/policies"
    default = shared_daemon.http.get(path).json()
    assert default["policies"] == {"thresholdBytes": None, "thresholdMessages": None, "maxLagSeconds": None,
                                   "minDirtyRatio": None, "strategy": None, "keyTtlMs": None,
                                   "maxReadBytesPerSecond": None, "iceberg": None}
    assert default["effective"]["thresholdBytes"] == 0  # brokerServiceCompactionThresholdInBytes=0 here
    put = shared_daemon.http.put(path, json={"thresholdMessages": 5, "minDirtyRatio": 0.25})
    assert put.status_code == 200, put.text
    assert put.json()["policies"]["thresholdMessages"] == 5
    got = shared_daemon.http.get(path).json()
    assert got == put.json()
    assert got["effective"]["thresholdMessages"] == 5 and got["effective"]["minDirtyRatio"] == 0.25
    assert (Path(shared_daemon.root) / topic / "policies.json").is_file()
    deleted = shared_daemon.http.delete(path)
    assert deleted.status_code == 200
    assert deleted.json() == default
    assert shared_daemon.http.get(path).json() == default
    assert not (Path(shared_daemon.root) / topic / "policies.json").exists()
