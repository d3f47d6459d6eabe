"""Tasks over HTTP on a daemon whose tasks are held at the test pause points: trigger and 409, the
PIP-387 states as the status shows them, cancel (and its refusal while switching), and the broker's
unload and delete hooks during a compaction, which answer within ``compactionCancelTimeoutSeconds``.

This daemon has no token: every endpoint is open.
"""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import httpx
import pytest

from compactord.task import REASON_KINDS
from tests.support.daemon import DaemonProcess, metric, status, wait_state
from tests.support.service import ledger_dirs
from tests.support.waiting import wait_for

from .conftest import Launcher, assert_error, run_cli

pytestmark = pytest.mark.slow

CANCEL_TIMEOUT_S = 3
# The hooks must answer within compactionCancelTimeoutSeconds; the margin covers one HTTP round trip
# on a loaded machine. A liveness bound (no hang, no deadlock), not a performance figure.
HOOK_BOUND_S = CANCEL_TIMEOUT_S + 1.5
PAUSES = "pending:1.5,creating_raw_reader:1.5,running:3,switch:5"
ORDER = ["Pending", "Creating_Raw_Reader", "Running", "Ending_with_switch_ledger", "Succeed"]
MONITOR_INTERVAL_S = 1


@pytest.fixture(scope="module")
def daemon(launch: Launcher) -> DaemonProcess:
    return launch(
        "tasks",
        pauses=PAUSES,
        compactionCancelTimeoutSeconds=CANCEL_TIMEOUT_S,
        compactionMaxConcurrentTasks=4,
        brokerServiceCompactionMonitorIntervalInSeconds=MONITOR_INTERVAL_S,
        compactionTopicsPattern="tsk-.*",
    )


@pytest.fixture(scope="module")
def prepared(daemon: DaemonProcess, kafka: Any) -> dict[str, str]:
    """Topics whose first compaction is triggered up front (they run beside the first tests)."""
    topics = {name: kafka.topic(prefix="tsk") for name in ("cancel", "unload", "delete")}
    for topic in topics.values():
        kafka.produce(topic, [(f"k{i % 5}", f"first-{i}") for i in range(20)])
        response = daemon.http.put(f"/v1/topics/{topic}/compaction")
        assert response.status_code == 202, response.text
    return topics


def first_ledger(daemon: DaemonProcess, topic: str) -> dict[str, Any]:
    """Wait for the topic's first compaction; return its horizon and compacted view."""
    final = wait_state(daemon, topic, "Succeed", "Failed", "Cancelled")
    assert final["status"] == "SUCCESS", final
    return view(daemon, topic)


def view(daemon: DaemonProcess, topic: str) -> dict[str, Any]:
    horizon = daemon.http.get(f"/v1/topics/{topic}/horizon")
    assert horizon.status_code == 200, horizon.text
    entries = daemon.http.get(f"/v1/topics/{topic}/compacted", params={"partition": 0, "encoding": "utf8"})
    assert entries.status_code == 200, entries.text
    return {"horizon": horizon.json(), "entries": entries.json()["entries"]}


def parse_time(value: str) -> datetime:
    assert value.endswith("Z"), value
    return datetime.fromisoformat(value)


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[float, Any]:
    started = time.monotonic()
    result = fn(*args, **kwargs)
    return time.monotonic() - started, result


def check_task(task: dict[str, Any], topic: str) -> None:
    assert set(task) == {"topic", "status", "state", "task_id", "reason", "reason_detail", "started_at",
                         "finished_at", "last_error", "progress", "full_rebuild", "recreated", "read_throttle",
                         "kind", "warnings", "storage_requests"}, task
    # The run's requests to the ledger root's store, by operation (none on a local root: it has no observer).
    assert all(isinstance(op, str) and isinstance(n, int) and n > 0 for op, n in task["storage_requests"].items())
    assert task["reason"] in REASON_KINDS and isinstance(task["reason_detail"], str)
    assert isinstance(task["warnings"], list)
    assert task["topic"] == topic
    assert uuid.UUID(task["task_id"]).version == 4
    parse_time(task["started_at"])
    if task["finished_at"] is not None:
        assert parse_time(task["finished_at"]) >= parse_time(task["started_at"])
    assert set(task["progress"]) == {"records_read", "records_total"}


def test_trigger_conflict_and_states(daemon: DaemonProcess, kafka: Any, prepared: dict[str, str]) -> None:
    topic = kafka.topic(prefix="tsk")
    kafka.produce(topic, [(f"k{i % 5}", f"v{i}") for i in range(30)])
    before = datetime.now().astimezone()
    response = daemon.http.put(f"/v1/topics/{topic}/compaction")
    assert response.status_code == 202, response.text
    task = response.json()
    check_task(task, topic)
    assert task["status"] == "RUNNING" and task["state"] == "Pending"
    assert task["finished_at"] is None and task["last_error"] is None
    assert abs((parse_time(task["started_at"]) - before).total_seconds()) < 5

    second = daemon.http.put(f"/v1/topics/{topic}/compaction")
    conflict = assert_error(second, 409, "compaction_already_running")
    check_task(conflict["task"], topic)
    assert conflict["task"]["task_id"] == task["task_id"] and conflict["task"]["status"] == "RUNNING"

    seen: list[str] = []
    refused_while_switching: dict[str, Any] | None = None
    listed_while_running = False
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        current = status(daemon, topic)
        assert current["task_id"] == task["task_id"]
        if not seen or seen[-1] != current["state"]:
            seen.append(current["state"])
        if current["state"] == "Running" and not listed_while_running:
            tasks = daemon.http.get("/v1/tasks", params={"topic": topic}).json()["tasks"]
            assert [(t["task_id"], t["status"]) for t in tasks] == [(task["task_id"], "RUNNING")]
            listing = {t["topic"]: t for t in daemon.http.get("/v1/topics", params={"limit": 1000}).json()["topics"]}
            assert listing[topic]["current_task"]["task_id"] == task["task_id"]
            listed_while_running = True
        if current["state"] == "Ending_with_switch_ledger" and refused_while_switching is None:
            refused_while_switching = assert_error(daemon.http.delete(f"/v1/topics/{topic}/compaction"), 409,
                                                   "task_not_cancellable")
            assert_error(daemon.http.put(f"/v1/topics/{topic}/compaction"), 409, "compaction_already_running")
        if current["status"] != "RUNNING":
            break
        time.sleep(0.05)
    assert seen == ORDER, f"states seen: {seen}\n{daemon.log_tail()}"
    assert refused_while_switching is not None
    assert refused_while_switching["task"]["state"] == "Ending_with_switch_ledger"
    assert refused_while_switching["task"]["task_id"] == task["task_id"]
    final = status(daemon, topic)
    check_task(final, topic)
    assert final["status"] == "SUCCESS" and final["last_error"] is None
    assert final["progress"] == {"records_read": 30, "records_total": 30}
    assert final["finished_at"] is not None
    # the refused cancel did not break the switch: the ledger is served
    assert [e["key"] for e in view(daemon, topic)["entries"]] == ["k0", "k1", "k2", "k3", "k4"]


def test_cancel_keeps_the_previous_ledger(daemon: DaemonProcess, kafka: Any,
                                          prepared: dict[str, str]) -> None:
    topic = prepared["cancel"]
    before = first_ledger(daemon, topic)
    kept = ledger_dirs(daemon.root, topic)
    assert len(kept) == 1
    kafka.produce(topic, [(f"k{i % 5}", f"second-{i}") for i in range(10)])

    task = daemon.http.put(f"/v1/topics/{topic}/compaction").json()
    wait_state(daemon, topic, "Running")
    elapsed, response = timed(daemon.http.delete, f"/v1/topics/{topic}/compaction")
    assert response.status_code == 200, response.text
    assert elapsed < HOOK_BOUND_S
    cancelled = response.json()
    check_task(cancelled, topic)
    assert cancelled["task_id"] == task["task_id"]
    assert (cancelled["status"], cancelled["state"]) == ("ERROR", "Cancelled")
    after = status(daemon, topic)
    assert (after["status"], after["state"], after["task_id"]) == ("ERROR", "Cancelled", task["task_id"])
    assert "cancel" in after["last_error"]
    assert after["finished_at"] is not None
    # the previous ledger is still the one served, and nothing partial is left beside it
    assert view(daemon, topic) == before
    assert ledger_dirs(daemon.root, topic) == kept
    assert_error(daemon.http.delete(f"/v1/topics/{topic}/compaction"), 404, "no_task_running")
    assert metric(daemon, "compactord_compactions_total", topic=topic, result="cancelled") == 1
    assert metric(daemon, "compactord_compactions_total", topic=topic, result="succeeded") == 1

    # the same through the CLI
    second = daemon.http.put(f"/v1/topics/{topic}/compaction").json()
    wait_state(daemon, topic, "Running")
    cli = run_cli("--url", daemon.url, "cancel", topic, "--json")
    assert cli.returncode == 0, cli.stderr
    body = json.loads(cli.stdout)
    assert (body["task_id"], body["state"], body["status"]) == (second["task_id"], "Cancelled", "ERROR")
    assert view(daemon, topic) == before
    again = run_cli("cancel", topic, env={"COMPACTORD_URL": daemon.url})
    assert again.returncode != 0
    assert again.stderr.strip().count("\n") == 0 and "no_task_running" in again.stderr
    assert "Traceback" not in again.stderr


def test_a_cancelled_run_reports_one_count_everywhere(daemon: DaemonProcess, kafka: Any) -> None:
    """The cancel's answer, the topic's status and the run's history record give the same records read: the
    count at the cancel, taken from what the readers reported by then."""
    topic = kafka.topic(partitions=2, prefix="tsk")
    kafka.produce(topic, [(f"k{i}", "v" * 1000, i % 2) for i in range(8_000)])
    policies = daemon.http.put(f"/v1/topics/{topic}/policies", json={"maxReadBytesPerSecond": 400_000})
    assert policies.status_code == 200, policies.text  # about 20 s to read it all: the cancel comes first
    task_id = daemon.http.put(f"/v1/topics/{topic}/compaction").json()["task_id"]
    # The count taken at the cancel is what the readers had reported to the driver by then (over the run's
    # channel), whether or not the task's status showed it yet.
    ahead = wait_for(lambda: status(daemon, topic)["progress"]["records_read"], 60, "the run to read", daemon)
    response = daemon.http.delete(f"/v1/topics/{topic}/compaction")
    assert response.status_code in (200, 202), response.text
    cancelled = response.json()
    assert (cancelled["task_id"], cancelled["state"]) == (task_id, "Cancelled")
    count, total = cancelled["progress"]["records_read"], cancelled["progress"]["records_total"]
    assert ahead <= count < total == 8_000, (ahead, cancelled["progress"])
    wait_for(lambda: status(daemon, topic)["state"] == "Cancelled", 60, "the cancelled status", daemon)
    assert status(daemon, topic)["progress"] == {"records_read": count, "records_total": total}
    runs = daemon.http.get(f"/v1/topics/{topic}/history").json()["runs"]
    assert (runs[0]["task_id"], runs[0]["state"]) == (task_id, "Cancelled")
    assert runs[0]["records_read"] == count, (runs[0]["records_read"], count)
    listed = daemon.http.get("/v1/tasks", params={"topic": topic}).json()["tasks"][0]
    assert listed["progress"]["records_read"] == count


def monitor_passes(daemon: DaemonProcess) -> float:
    return metric(daemon, "compactord_monitor_runs_total", result="ok") or 0.0


def task_ids(daemon: DaemonProcess, topic: str) -> list[str]:
    return [t["task_id"] for t in daemon.http.get("/v1/tasks", params={"topic": topic}).json()["tasks"]]


def test_unload_during_a_compaction(daemon: DaemonProcess, kafka: Any, prepared: dict[str, str]) -> None:
    topic = prepared["unload"]
    before = first_ledger(daemon, topic)
    kafka.produce(topic, [(f"n{i}", f"second-{i}") for i in range(10)])
    task = daemon.http.put(f"/v1/topics/{topic}/compaction").json()
    wait_state(daemon, topic, "Running")

    elapsed, response = timed(daemon.http.post, f"/v1/topics/{topic}/unload")
    assert elapsed < HOOK_BOUND_S
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["topic"] == topic and body["unloaded"] is True
    assert (body["task"]["task_id"], body["task"]["state"]) == (task["task_id"], "Cancelled")
    assert (daemon.root / topic / "UNLOADED").is_file()
    # the previous ledger stays, readable; the task history stays
    assert view(daemon, topic) == before
    assert len(ledger_dirs(daemon.root, topic)) == 1
    assert len(task_ids(daemon, topic)) == 2
    listing = {t["topic"]: t for t in daemon.http.get("/v1/topics", params={"limit": 1000}).json()["topics"]}
    assert listing[topic]["unloaded"] is True

    # the monitor skips it, although its policy would fire
    policy = daemon.http.put(f"/v1/topics/{topic}/policies", json={"thresholdMessages": 1})
    assert policy.status_code == 200, policy.text
    passes = monitor_passes(daemon)
    wait_for(lambda: monitor_passes(daemon) >= passes + 3, 30, "three monitor passes", daemon)
    assert len(task_ids(daemon, topic)) == 2

    # load: the monitor compacts it again
    loaded = daemon.http.post(f"/v1/topics/{topic}/load")
    assert loaded.status_code == 200 and loaded.json() == {"topic": topic, "unloaded": False}
    assert not (daemon.root / topic / "UNLOADED").exists()
    wait_for(lambda: len(task_ids(daemon, topic)) == 3, 30, "the monitor to trigger the loaded topic", daemon)
    assert f"compacting topic {topic} (reason backlog_records): backlog" in daemon.log_text()
    assert daemon.http.delete(f"/v1/topics/{topic}/policies").status_code == 200
    assert daemon.http.delete(f"/v1/topics/{topic}/compaction").status_code == 200

    # a manual trigger also brings an unloaded topic back
    assert daemon.http.post(f"/v1/topics/{topic}/unload").json()["task"] is None
    assert daemon.http.put(f"/v1/topics/{topic}/compaction").status_code == 202
    assert not (daemon.root / topic / "UNLOADED").exists()
    assert daemon.http.delete(f"/v1/topics/{topic}/compaction").status_code == 200
    assert view(daemon, topic) == before


def test_delete_during_a_compaction(daemon: DaemonProcess, kafka: Any, prepared: dict[str, str]) -> None:
    topic = prepared["delete"]
    first_ledger(daemon, topic)
    policy = daemon.http.put(f"/v1/topics/{topic}/policies", json={"thresholdBytes": 1 << 30})
    assert policy.status_code == 200, policy.text
    kafka.produce(topic, [(f"k{i}", f"second-{i}") for i in range(10)])
    task = daemon.http.put(f"/v1/topics/{topic}/compaction").json()
    wait_state(daemon, topic, "Running")

    elapsed, response = timed(daemon.http.delete, f"/v1/topics/{topic}")
    assert elapsed < HOOK_BOUND_S
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["topic"] == topic and body["deleted"] is True
    assert (body["task"]["task_id"], body["task"]["state"]) == (task["task_id"], "Cancelled")
    assert not (daemon.root / topic).exists()
    assert_error(daemon.http.get(f"/v1/topics/{topic}/horizon"), 404, "not_compacted")
    assert_error(daemon.http.get(f"/v1/topics/{topic}/compacted", params={"partition": 0}), 404,
                 "not_compacted")
    assert daemon.http.get(f"/v1/topics/{topic}/policies").json()["policies"]["thresholdBytes"] is None
    assert status(daemon, topic)["status"] == "NOT_RUN"
    # a topic the daemon knows nothing about (and the broker lacks): nothing deleted, 404
    gone = f"tsk-gone-{uuid.uuid4().hex[:6]}"
    assert gone in assert_error(daemon.http.delete(f"/v1/topics/{gone}"), 404, "topic_not_found")["message"]


def test_delete_and_unload_while_switching(daemon: DaemonProcess, kafka: Any) -> None:
    """A switching task cannot be cancelled: the hooks still answer within the bound (202), and the
    rest happens once the switch is over."""
    topics = {"delete": kafka.topic(prefix="tsk"), "unload": kafka.topic(prefix="tsk")}
    hooks = {"delete": ("DELETE", "/v1/topics/{topic}"), "unload": ("POST", "/v1/topics/{topic}/unload")}

    def when_switching(name: str) -> tuple[float, httpx.Response]:
        """Call the hook as soon as the topic's task is switching (each topic has its own thread)."""
        topic = topics[name]
        method, path = hooks[name]
        wait_state(daemon, topic, "Ending_with_switch_ledger")
        with daemon.client() as c:
            return timed(c.request, method, path.format(topic=topic))

    for topic in topics.values():
        kafka.produce(topic, [(f"k{i % 3}", f"v{i}") for i in range(12)])
    with ThreadPoolExecutor(max_workers=len(topics)) as pool:
        futures = {name: pool.submit(when_switching, name) for name in topics}
        for topic in topics.values():
            assert daemon.http.put(f"/v1/topics/{topic}/compaction").status_code == 202
        results = {name: future.result(timeout=180) for name, future in futures.items()}
    for name in topics:
        elapsed, response = results[name]
        assert elapsed < HOOK_BOUND_S, (name, elapsed)
        assert response.status_code == 202, (name, response.text)
        assert response.json()["task"]["state"] == "Ending_with_switch_ledger"

    deleted, unloaded = topics["delete"], topics["unload"]
    assert results["delete"][1].json()["deleted"] is False
    wait_for(lambda: not (daemon.root / deleted).exists(), 60, "the deleted topic's folder to go", daemon)
    assert_error(daemon.http.get(f"/v1/topics/{deleted}/horizon"), 404, "not_compacted")

    final = wait_state(daemon, unloaded, "Succeed", "Failed")
    assert final["status"] == "SUCCESS"
    assert [e["key"] for e in view(daemon, unloaded)["entries"]] == ["k0", "k1", "k2"]
    assert (daemon.root / unloaded / "UNLOADED").is_file()


@pytest.mark.parametrize("path", ["/docs", "/openapi.json", "/v1/topics", "/v1/tasks", "/metrics", "/readyz"])
def test_without_a_token_everything_is_open(daemon: DaemonProcess, path: str) -> None:
    with daemon.client(token=None) as c:
        response = c.get(path)
    assert response.status_code == 200, response.text
