"""What a restart finds on the ledger root after a kill -9: a topic deletion that was pending is
completed before anything serves the topic; ledgers found without their ``CURRENT`` are quarantined
(moved aside, counted in ``compactord_quarantined_topics``), not wiped; the run history is kept (and a
deleted topic's is gone), also of topics whose names differ by a suffix (``coll``, ``coll.jsonl``). One daemon
shows it all, killed once and restarted once."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from tests.support.daemon import compact, metric, wait_state
from tests.support.probes import GATE_ENV
from tests.support.service import ledger_dirs
from tests.support.waiting import wait_for

from .conftest import PAUSING_FACTORY, Launcher

pytestmark = pytest.mark.slow


def test_a_restart_after_kill_9_completes_a_pending_deletion_and_keeps_every_topic_s_history(
    launch: Launcher, kafka: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """One daemon, killed once: its topics named x and x.jsonl keep their histories, a deletion pending at the kill
    completes at the restart, a ledger that lost its pointer is quarantined."""
    from kafka.admin import NewTopic

    root = tmp_path_factory.mktemp("recovery") / "ledgers"
    gate = tmp_path_factory.mktemp("recovery-gate") / "open"
    gate.touch()
    # 3 runs kept: a topic's history is compacted into its file at its 5th run (a tenth over, at least one). Its
    # tasks pass the switch while the gate file exists.
    daemon = launch.prepare("recovery", root=root, compactionHistoryMaxRuns=3,
                            compactionServiceFactoryClassName=PAUSING_FACTORY)
    daemon.env[GATE_ENV] = f"switch:{gate}"
    daemon.start().wait_ready()

    # Topics whose names differ by a suffix: each keeps its own history.
    coll, other = kafka.topic(prefix="coll"), kafka.topic(prefix="other")
    suffixed = f"{coll}.jsonl"
    kafka.admin.create_topics([NewTopic(suffixed, 1, 1)])
    for name in (coll, suffixed, other):
        kafka.produce(name, [(f"k{i % 3}", f"v{i}") for i in range(9)])
    runs = {suffixed: [compact(daemon, suffixed)["task_id"]]}
    runs[coll] = [compact(daemon, coll)["task_id"] for _ in range(7)]  # its history compacted at the 5th
    runs[other] = [compact(daemon, other)["task_id"]]

    def histories(d: Any) -> dict[str, list[str]]:
        return {name: [r["task_id"] for r in d.http.get(f"/v1/topics/{name}/history").json()["runs"]]
                for name in runs}

    expected = {name: list(reversed(ids[-3:])) for name, ids in runs.items()}
    assert histories(daemon) == expected
    assert "recorded in the run history once the store answers" not in daemon.log_text()
    assert "the ledger root's store does not answer" not in daemon.log_text()  # never marked down
    assert daemon.http.get("/readyz").json()["reads"] is True
    folder = root / "@compactord" / "history"
    assert (folder / coll / "compacted.jsonl").is_file() and (folder / suffixed).is_dir()

    # the switch cannot be cancelled: the deletion has to wait for the task, in memory only
    gate.unlink()
    topic = kafka.topic(prefix="del")
    kafka.produce(topic, [(f"k{i % 4}", f"v{i}") for i in range(16)])
    # A read budget (one that holds nothing back) runs it as a Spark job, which keeps its slot to the end: a
    # small run read in the driver would leave it (``compactionDriverRunMaxRecords``).
    put = daemon.http.put(f"/v1/topics/{topic}/policies",
                          json={"thresholdMessages": 7, "maxReadBytesPerSecond": 100_000_000})
    assert put.status_code == 200, put.text
    assert daemon.http.put(f"/v1/topics/{topic}/compaction").status_code == 202
    wait_for(lambda: "held at test gate 'switch'" in daemon.log_text(), 120, "the task to reach the switch",
             daemon)
    assert wait_state(daemon, topic, "Ending_with_switch_ledger")["status"] == "RUNNING"
    # the one slot is held: these wait in Pending, and end there, cancelled (each end is in the history)
    kept, dropped = kafka.topic(prefix="hist"), kafka.topic(prefix="hist")
    for queued_topic in (kept, dropped):
        queued = daemon.http.put(f"/v1/topics/{queued_topic}/compaction")
        assert queued.status_code == 202 and queued.json()["state"] == "Pending", queued.text
        assert daemon.http.delete(f"/v1/topics/{queued_topic}/compaction").json()["state"] == "Cancelled"
    [run] = daemon.http.get(f"/v1/topics/{dropped}/history").json()["runs"]
    assert run["state"] == "Cancelled"
    gone = daemon.http.delete(f"/v1/topics/{dropped}")
    assert gone.status_code == 200 and gone.json()["deleted"] is True, gone.text
    assert daemon.http.get(f"/v1/topics/{dropped}/history").json() == {"topic": dropped, "runs": [], "next": None}
    assert not (root / "@compactord" / "history" / dropped).exists()
    deleted = daemon.http.delete(f"/v1/topics/{topic}")
    assert deleted.status_code == 202, deleted.text
    assert deleted.json()["deleted"] is False
    [name] = ledger_dirs(root, topic)
    written = root / topic / name
    assert (written / "manifest.json").is_file()  # finalized, not yet current
    # another topic's finalized ledger that lost its pointer: quarantined at the restart, not wiped
    shutil.copytree(written, root / "lost-pointer" / written.name)
    daemon.kill_group()
    assert daemon.wait_exit(30) is not None

    gate.touch()
    restarted = daemon.start().wait_ready()
    # each topic is recovered at its first use or by the paced pass after the start (not before serving)
    wait_for(lambda: not (root / topic).exists(), 60, "the pending deletion to complete", restarted)
    wait_for(lambda: metric(restarted, "compactord_quarantined_topics") == 1, 60, "the lost pointer's quarantine",
             restarted)
    listed = {t["topic"]: t for t in restarted.http.get("/v1/topics", params={"limit": 1000}).json()["topics"]}
    assert listed[topic]["last_compaction"]["status"] == "NOT_RUN"  # still on the broker, nothing kept
    quarantine = root / "@compactord" / "quarantine"
    [found] = [stamp for lost in quarantine.iterdir() for stamp in lost.iterdir()]
    assert found.parent.name == "lost-pointer" and (found / written.name / "manifest.json").is_file()
    assert metric(restarted, "compactord_quarantined_topics") == 1
    assert "quarantine" in restarted.log_text()
    # the cancelled run survived the kill -9, and is what the status reports
    [run] = restarted.http.get(f"/v1/topics/{kept}/history").json()["runs"]
    assert (run["state"], run["reason"], run["caller"], run["error"]) == (
        "Cancelled", "manual", "127.0.0.1", "cancelled by request")
    last = restarted.http.get(f"/v1/topics/{kept}/compaction").json()
    assert (last["status"], last["state"], last["task_id"]) == ("ERROR", "Cancelled", run["task_id"])
    assert restarted.http.get(f"/v1/topics/{dropped}/history").json()["runs"] == []
    # every history of the topics named x and x.jsonl kept; each current ledger came from its last run, a success
    assert histories(restarted) == expected
    for name in runs:
        assert restarted.http.get(f"/v1/topics/{name}/compaction").json()["status"] == "SUCCESS"
