"""The daemon on an S3 ledger root (the session's SeaweedFS): it checks the bucket at start, compacts into it
(counting the run's requests to the bucket) and serves reads from it over HTTP, a warm read at the cost of its
data's ranged GETs; wrong credentials refuse the start with exit 74 and one line.

The daemon is the package's ``s3_daemon`` (test_s3_faults.py faults its store through a proxy, healed since)."""

from __future__ import annotations

import base64
from typing import Any

from tests.support.daemon import DaemonProcess, compact, metric, metric_samples
from tests.support.s3_server import BUCKET, SECRET_KEY
from tests.support.timeouts import TASK_TIMEOUT_S
from tests.support.waiting import wait_for

EXIT_IOERR = 74


def test_a_daemon_compacts_into_and_reads_from_an_s3_root(s3_daemon: DaemonProcess, kafka: Any,
                                                           s3_server: Any) -> None:
    # No monitor pass and no periodic sweep during the test (a pass lists the root's topics): the requests counted
    # below are the reads'.
    daemon = s3_daemon
    root = str(daemon.root)
    prefix = root.split("/", 3)[3]
    topic = kafka.topic(prefix="s3")
    records = [(f"k{i % 40}", f"v{i}") for i in range(200)]
    kafka.produce(topic, records)
    final = compact(daemon, topic)
    # The run's requests to the bucket, by operation: the reading tasks' part uploads, the driver's manifest put
    # and pointer write at least, in its status and in its history record.
    requests = final["storage_requests"]
    pointer = requests.get("put_if_absent", 0) + requests.get("put_if_match", 0)
    assert requests.get("put_file", 0) >= 1 and requests.get("put", 0) >= 1 and pointer >= 1, requests
    runs = daemon.http.get(f"/v1/topics/{topic}/history").json()["runs"]
    assert [run["task_id"] for run in runs] == [final["task_id"]]
    assert runs[0]["storage_requests"]["put"] >= 1 and runs[0]["storage_requests"] == requests
    page = daemon.http.get(f"/v1/topics/{topic}/compacted", params={"partition": 0, "limit": 1000})
    assert page.status_code == 200, page.text
    view = {base64.b64decode(e["key"]): base64.b64decode(e["value"]) for e in page.json()["entries"]}
    assert view == {f"k{k}".encode(): f"v{160 + k}".encode() for k in range(40)}
    last = daemon.http.get(f"/v1/topics/{topic}/compacted/last", params={"partition": 0, "encoding": "utf8"})
    assert last.status_code == 200 and (last.json()["key"], last.json()["value"]) == ("k39", "v199")
    info = daemon.http.get("/v1/info").json()
    assert info["ledger_root"] == root == f"s3://{BUCKET}/{prefix}" and SECRET_KEY not in str(info)
    keys = [info.key for info in s3_server.store(prefix).list(f"{topic}/")]
    assert f"{topic}/CURRENT" in keys and any(k.endswith(".parquet") for k in keys)
    assert not (daemon.workdir / "ledgers").exists() and not (daemon.workdir / "s3:").exists()

    # Reads of a warm view: the pointer and the manifest are the daemon's own (it holds the root's lease), the
    # footers cached; a page costs at most two ranged GETs and /last one, with no HEAD or LIST.
    def requests_by_op() -> dict[str, float]:  # one scrape of /metrics (which lists the quarantine folder)
        return {labels["op"]: value for name, labels, value in metric_samples(daemon)
                if name == "compactord_storage_requests_total"}

    # Its start's first monitor pass reads each of the broker's topics' rows from the root (the session broker holds
    # hundreds), and its paced recovery pass each topic an earlier module left there: what is counted starts once
    # both have ended. Background work of earlier modules' topics (a retired ledger's expiry) may still read the
    # root during one window: the reads are measured in up to three, and one must show the reads' own requests only.
    wait_for(lambda: (metric(daemon, "compactord_monitor_pass_topics") or 0) > 0, TASK_TIMEOUT_S,
             "the monitor's first pass to end", daemon)
    wait_for(lambda: daemon.log_text().count("the recovery pass went over")
             >= daemon.log_text().count("compactord is ready"), TASK_TIMEOUT_S, "the recovery pass's end", daemon)
    def window() -> tuple[dict[str, float], dict[str, float]]:
        before = requests_by_op()
        for _ in range(5):
            assert daemon.http.get(f"/v1/topics/{topic}/compacted", params={"partition": 0}).status_code == 200
            assert daemon.http.get(f"/v1/topics/{topic}/compacted/last", params={"partition": 0}).status_code == 200
        return before, requests_by_op()

    def reads_only(before: dict[str, float], after: dict[str, float]) -> bool:
        return (after.get("get", 0) - before.get("get", 0) <= 5 * (2 + 1)
                and after.get("head", 0) == before.get("head", 0)
                and after.get("list", 0) - before.get("list", 0) <= 1)  # the second scrape's own

    windows = []
    for _ in range(3):
        windows.append(window())
        if reads_only(*windows[-1]):
            break
    assert reads_only(*windows[-1]), (windows, daemon.log_tail(30))

    # An incremental run checks the previous ledger with one listing (its files at the versions its manifest
    # recorded are not read again) and reads its footer knowing its size: no HEAD of a ledger file, so no more
    # HEADs than the full run made (the id allocation's and the switch's).
    kafka.produce(topic, [(f"k{i}", f"w{i}") for i in range(10)])
    incremental = compact(daemon, topic)["storage_requests"]
    assert incremental.get("head", 0) <= requests.get("head", 0), (requests, incremental)


def test_wrong_s3_credentials_refuse_the_start_with_one_line(launch: Any, s3_server: Any) -> None:
    daemon = launch.prepare("s3-denied", root=f"s3://{BUCKET}/denied",  # type: ignore[arg-type]
                            **s3_server.daemon_conf(s3SecretAccessKey="not-the-secret"))
    daemon.start()
    assert daemon.wait_exit(120) == EXIT_IOERR, daemon.log_tail()
    assert "compactedLedgerRoot=s3://" in daemon.log_text(), daemon.log_tail()
    assert "not-the-secret" not in daemon.log_text()
