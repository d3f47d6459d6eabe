"""The daemon's life on one ledger root: a second daemon refuses the root, a restart reports the
last run from the run history (and the ledger it finds) and keeps the policies and the unload mark, and
SIGTERM during a compaction cancels the task, records it in the history, leaves no partial ledger and
exits with code 0. The daemon exits once its Spark JVM is gone, after SIGTERM to it alone and to its whole
process group (the JVM's too), which stops it quietly. A daemon whose factory uses no Spark starts no JVM.

The tests run in order: the first daemon compacts and is stopped (SIGTERM to its process group), the second
(with a task held after its ledger is written) is the one that gets SIGTERM during a compaction.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from compactord.daemon.history import RunHistory
from compactord.storage import LocalStore
from tests.support.daemon import DaemonProcess, compact, status
from tests.support.processes import alive, descendants, executable, start_time
from tests.support.service import ledger_dirs
from tests.support.waiting import wait_for

from .conftest import Launcher

pytestmark = pytest.mark.slow

SIGTERM_BOUND_S = 45.0  # cancel, stop Spark, exit: seconds on an idle machine; generous for CI


@pytest.fixture(scope="module")
def state(launch: Launcher, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return {"root": tmp_path_factory.mktemp("lifecycle") / "ledgers"}


@pytest.fixture(scope="module")
def first(launch: Launcher, state: dict[str, Any], kafka: Any) -> DaemonProcess:
    daemon = launch("first", root=state["root"])
    topic = kafka.topic(prefix="life")
    kafka.produce(topic, [(f"k{i % 4}", f"v{i}") for i in range(16)])
    state["topic"] = topic
    state["final"] = compact(daemon, topic)
    policies = {"thresholdMessages": 7, "strategy": "first-value"}
    put = daemon.http.put(f"/v1/topics/{topic}/policies", json=policies)
    assert put.status_code == 200, put.text
    state["policies"] = put.json()
    unload = daemon.http.post(f"/v1/topics/{topic}/unload")  # remembered under the root
    assert unload.status_code == 200 and unload.json() == {"topic": topic, "unloaded": True, "task": None}
    return daemon


def test_a_second_daemon_refuses_the_root(launch: Launcher, state: dict[str, Any],
                                          first: DaemonProcess) -> None:
    second = launch.prepare("second", root=state["root"]).start()
    code = second.wait_exit(60)
    assert code is not None and code != 0, second.log_tail()
    log = second.log_text()
    assert f"pid {first.pid}" in log, log
    assert "Traceback" not in log
    # the first daemon is unharmed
    assert first.http.get("/readyz").status_code == 200
    assert status(first, state["topic"])["status"] == "SUCCESS"


def spark_jvm(daemon: DaemonProcess) -> tuple[int, str | None]:
    """The daemon's Spark JVM: its pid and start time."""
    jvms = [pid for pid in descendants(daemon.pid) if (executable(pid) or "").endswith("/java")]
    assert len(jvms) == 1, f"the daemon's Spark JVM among its descendants: {jvms}"
    return jvms[0], start_time(jvms[0])


def test_sigterm_to_the_whole_process_group_when_idle_exits_0_quietly_once_its_jvm_is_gone(
        first: DaemonProcess, state: dict[str, Any]) -> None:
    """What ``timeout``, ``docker stop`` without an init or a supervisor's group kill do: the JVM gets the
    signal too, and ignores it; the daemon stops it, with no py4j traceback and no EOFError of PySpark (SIGTERM
    to the daemon alone: ``test_sigterm_cancels_a_running_task``)."""
    assert first.process is not None
    jvm = spark_jvm(first)
    mark = len(first.log_text())
    os.killpg(first.pid, signal.SIGTERM)
    assert first.wait_exit(SIGTERM_BOUND_S) == 0, first.log_tail()
    assert not alive(*jvm), "the daemon exited before its Spark JVM"
    log = first.log_text()[mark:]
    for noise in ("ERROR", "Traceback", "EOFError", "py4j", "Exception"):
        assert noise not in log, log
    lock = Path(state["root"]) / "@compactord" / "lock"
    assert lock.read_text() == ""  # released: no holder named any more


@pytest.fixture(scope="module")
def restarted(launch: Launcher, state: dict[str, Any], first: DaemonProcess) -> DaemonProcess:
    first.stop()
    # every compaction of this daemon stops after its ledger is written, until cancelled
    return launch("restarted", root=state["root"], pauses="written:600")


def test_restart_reports_the_ledger(restarted: DaemonProcess, state: dict[str, Any]) -> None:
    topic, before = state["topic"], state["final"]
    after = status(restarted, topic)
    # the last run, from the history the first daemon wrote before its SIGTERM
    assert after["status"] == "SUCCESS" and after["state"] == "Succeed" and after["task_id"] == before["task_id"]
    assert after["last_error"] is None and after["reason"] == "manual"
    assert (after["started_at"], after["finished_at"]) == (before["started_at"], before["finished_at"])
    assert after["progress"]["records_read"] == 16
    assert restarted.http.get("/v1/tasks", params={"topic": topic}).json()["tasks"] == []
    history = restarted.http.get(f"/v1/topics/{topic}/history")
    assert history.status_code == 200, history.text
    [run] = history.json()["runs"]
    assert history.json()["next"] is None
    assert (run["task_id"], run["state"], run["reason"], run["records_read"], run["records_written"]) == \
        (before["task_id"], "Succeed", "manual", 16, 4)
    assert run["caller"] == "127.0.0.1" and run["removed"] == 12 and run["error"] is None
    assert run["ledger_before"] is None and isinstance(run["ledger_after"], int)
    # kept outside the topic's folder: the ledger layout is unchanged
    root = Path(state["root"])
    [recorded] = (root / "@compactord" / "history" / topic).iterdir()  # one object per run, until compacted
    assert json.loads(recorded.read_bytes())["task_id"] == run["task_id"]
    assert {p.name for p in (root / topic).iterdir()} == {"CURRENT", f"ledger-{run['ledger_after']}",
                                                          "policies.json", "UNLOADED"}
    horizon = restarted.http.get(f"/v1/topics/{topic}/horizon").json()
    assert horizon["partitions"] == [{"partition": 0, "offset": 15}]
    entries = restarted.http.get(f"/v1/topics/{topic}/compacted", params={"partition": 0, "encoding": "utf8"})
    assert [(e["key"], e["value"]) for e in entries.json()["entries"]] == [
        ("k0", "v12"), ("k1", "v13"), ("k2", "v14"), ("k3", "v15")]
    assert restarted.http.get(f"/v1/topics/{topic}/policies").json() == state["policies"]
    listing = {t["topic"]: t for t in restarted.http.get("/v1/topics").json()["topics"]}
    assert listing[topic]["last_compaction"]["status"] == "SUCCESS"
    assert listing[topic]["unloaded"] is True


def test_sigterm_cancels_a_running_task(restarted: DaemonProcess, state: dict[str, Any], kafka: Any) -> None:
    topic = kafka.topic(prefix="life")
    kafka.produce(topic, [(f"k{i % 4}", f"v{i}") for i in range(16)])
    response = restarted.http.put(f"/v1/topics/{topic}/compaction")
    assert response.status_code == 202, response.text
    # held in Running after its new ledger was written (not yet switched to)
    wait_for(lambda: "at test pause point 'written'" in restarted.log_text(), 120,
             "the task to write its ledger", restarted)
    assert status(restarted, topic)["state"] == "Running"
    assert len(ledger_dirs(restarted.root, topic)) == 1  # the partial ledger
    assert restarted.process is not None
    jvm = spark_jvm(restarted)

    started = time.monotonic()
    restarted.process.send_signal(signal.SIGTERM)  # to the daemon alone, as KillMode=mixed and tini send it
    code = restarted.wait_exit(SIGTERM_BOUND_S)
    elapsed = time.monotonic() - started
    assert code == 0, f"exit code {code} after {elapsed:.1f}s\n{restarted.log_tail()}"
    assert elapsed < SIGTERM_BOUND_S
    assert not alive(*jvm), "the daemon exited before its Spark JVM"
    log = restarted.log_text()
    assert f"compaction of topic {topic} (task {response.json()['task_id']}) cancelled" in log, log
    # the task's partial ledger is gone, nothing points at it, the other topic's ledger is intact
    root = Path(restarted.root)
    assert ledger_dirs(root, topic) == []
    assert not (root / topic / "CURRENT").exists()
    assert list((root / "@compactord" / "progress").glob("*")) == []
    assert len(ledger_dirs(root, state["topic"])) == 1
    # the cancel is in the history the next start reads (the file as the daemon wrote it before exiting)
    [run] = RunHistory(LocalStore(root), 1000, 30).runs(topic)
    assert (run.task_id, run.state, run.error) == (response.json()["task_id"], "Cancelled",
                                                   "the daemon is shutting down")


SPARKLESS_FACTORY = "tests.support.plugins.sparkless:SparklessFactory"


def test_a_factory_without_spark_starts_no_jvm(launch: Launcher) -> None:
    """The factory builds and owns the Spark session: a daemon whose factory has no runtime is ready for
    compactions once the broker answers, with no JVM among its descendants, and stops with code 0."""
    daemon = launch("sparkless", compactionServiceFactoryClassName=SPARKLESS_FACTORY)
    ready = daemon.http.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["compactions"] is True and not ready.json().get("problems"), ready.json()
    jvms = [pid for pid in descendants(daemon.pid) if (executable(pid) or "").endswith("/java")]
    assert jvms == [], f"a daemon without Spark started JVMs: {jvms}\n{daemon.log_tail()}"
    assert "Spark session" not in daemon.log_text(), daemon.log_tail()
    assert daemon.stop() == 0, daemon.log_tail()
