"""Scale-out: the daemon's compactions on a real standalone Spark cluster give the local-mode result.

A Master and one Worker from the pyspark distribution (``bin/spark-class``: the pip package has no
start scripts) run on loopback; the daemon runs as its own process with ``sparkMaster=spark://...``
and a ledger root on the local disk, which one machine shares by construction. The same topic is
compacted in local mode by the in-process engine; both ledgers must hold the same entries and horizon.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from compactord.embedded import free_port
from compactord.model import Entry
from tests.support.daemon import DaemonProcess, compact, write_conf
from tests.support.service import compact as compact_here
from tests.support.service import entries

pytestmark = pytest.mark.slow

PARTITIONS = 3
Row = tuple[int, int, bytes | None, bytes | None, int | None, tuple[tuple[str, bytes], ...]]


def spark_class() -> Path:
    import pyspark

    path = Path(pyspark.__file__).parent / "bin" / "spark-class"
    assert path.exists(), f"the pyspark distribution has no {path}"
    return path


class StandaloneCluster:
    """A standalone Master and one Worker on 127.0.0.1, each in its own session, stopped by PID."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.webui_port = free_port()
        self.worker_webui_port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.env = {
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            # no REST submission port (6066 by default: it would clash with any other master here)
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "SPARK_LOCAL_DIRS": str(workdir / "local"),
            "SPARK_WORKER_DIR": str(workdir / "work"),
        }

    def _spawn(self, name: str, *args: str) -> None:
        with open(self.workdir / f"{name}.log", "ab") as log:
            self.processes.append(subprocess.Popen(
                [str(spark_class()), *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, start_new_session=True,
            ))

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def status(self) -> dict[str, Any]:
        """The Master's web UI JSON (workers, applications)."""
        return httpx.get(f"http://127.0.0.1:{self.webui_port}/json/", timeout=5.0).json()

    def start(self, timeout: float = 90.0) -> StandaloneCluster:
        (self.workdir / "local").mkdir(parents=True, exist_ok=True)
        (self.workdir / "work").mkdir(parents=True, exist_ok=True)
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.webui_port))
        self._spawn("worker", "org.apache.spark.deploy.worker.Worker", self.master_url, "--host", "127.0.0.1",
                    "--cores", "2", "--memory", "2g", "--webui-port", str(self.worker_webui_port),
                    "--work-dir", str(self.workdir / "work"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process, name in zip(self.processes, ("master", "worker"), strict=True):
                if process.poll() is not None:
                    raise AssertionError(
                        f"the Spark {name} exited with code {process.returncode}:\n{self.log(name)}")
            try:
                status = self.status()
                workers = status.get("workers", [])
                alive = status.get("aliveworkers", sum(w.get("state") == "ALIVE" for w in workers))
                if alive >= 1:
                    return self
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        raise AssertionError(f"no worker registered within {timeout:.0f}s\nmaster:\n{self.log('master')}\n"
                             f"worker:\n{self.log('worker')}")

    def stop(self) -> None:
        """SIGTERM to each process group (the Worker's holds its executors), then SIGKILL."""
        for process in reversed(self.processes):
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(10)


def _row(entry: Entry) -> Row:
    headers = tuple((k, v or b"") for k, v in entry.headers)
    return entry.partition, entry.offset, entry.key, entry.value, entry.timestamp, headers


def _decode(data: str | None) -> bytes | None:
    return None if data is None else base64.b64decode(data)


def ledger_over_http(daemon: DaemonProcess, topic: str) -> tuple[dict[int, int], list[Row]]:
    """The horizon and every live entry of the topic, read through the daemon's read API."""
    rows: list[Row] = []
    with daemon.client() as http:
        response = http.get(f"/v1/topics/{topic}/horizon")
        assert response.status_code == 200, response.text
        horizon = {p["partition"]: p["offset"] for p in response.json()["partitions"]}
        for partition in sorted(horizon):
            start: int | None = 0
            while start is not None:
                page = http.get(f"/v1/topics/{topic}/compacted",
                                params={"partition": partition, "start": start, "limit": 50}).json()
                for e in page["entries"]:
                    headers = tuple((h["key"], base64.b64decode(h["value"])) for h in e["headers"])
                    rows.append((e["partition"], e["offset"], _decode(e["key"]), _decode(e["value"]),
                                 e["timestamp"], headers))
                start = page["next_start"]
    return horizon, rows


def produce_mixed(kafka: Any, topic: str) -> None:
    """Overwrites, null and empty tombstones, null keys, headers and timestamps over 3 partitions."""
    records = []
    for i in range(600):
        key = None if i % 97 == 1 else f"key-{i % 40}"
        value = None if i % 11 == 0 and key else b"" if i % 13 == 0 else f"value-{i}".encode()
        partition = (i % 40) % PARTITIONS  # a key stays in one partition
        headers = [("seq", str(i).encode()), ("bin", bytes([i % 256, 0, 255]))] if i % 3 == 0 else None
        records.append((key, value, partition, 1_700_000_000_000 + i * 1000, headers))
    kafka.produce(topic, records)


def local_mode_ledger(make_factory: Any, root: Path, topic: str) -> tuple[dict[int, int], list[Row]]:
    """Compact ``topic`` in this process on the test session's local[2] Spark; its horizon and entries."""
    local = make_factory(root=root).new_topic_compaction_service(topic)
    compact_here(local)
    rows = [_row(e) for p in range(PARTITIONS) for e in entries(local, p)]
    manifest = local.ledger_info()
    assert manifest is not None
    return dict(manifest.horizon), rows


def test_compaction_on_a_standalone_cluster_equals_local_mode(kafka: Any, broker: Any, tmp_path: Path,
                                                              request: pytest.FixtureRequest) -> None:
    topic = kafka.topic(partitions=PARTITIONS, prefix="cluster")
    produce_mixed(kafka, topic)
    cluster = StandaloneCluster(tmp_path / "spark-cluster")
    port = free_port()
    token = "cluster-token"
    conf = write_conf(tmp_path / "broker.conf", {
        "kafkaBootstrapServers": broker.bootstrap,
        "compactedLedgerRoot": str(tmp_path / "cluster-ledgers"),  # a local path: shared on one machine
        "httpPort": str(port),
        "httpAuthToken": token,
        "sparkMaster": cluster.master_url,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.memory": "1g",
        "spark.executor.memory": "1g",
        "spark.cores.max": "2",
        "compactionTopicsPattern": topic,
        "brokerServiceCompactionThresholdInBytes": "0",
    })
    daemon = DaemonProcess(conf, tmp_path / "daemon.log", port, tmp_path / "cluster-ledgers", token)
    try:
        cluster.start()
        daemon.start()
        # While the daemon's session starts on the cluster, the reference: local mode, in this process
        # (asked for only now, so that a first start of the test session's Spark overlaps the daemon's).
        local_horizon, local_rows = local_mode_ledger(request.getfixturevalue("make_factory"),
                                                      tmp_path / "local-ledgers", topic)
        daemon.wait_ready()
        (app,) = [a for a in cluster.status()["activeapps"] if a["name"] == "compactord"]
        assert app["cores"] >= 1, f"the daemon's application got no executor cores: {app}"
        compact(daemon, topic)
        cluster_horizon, cluster_rows = ledger_over_http(daemon, topic)
    finally:
        try:
            code = daemon.stop()
        finally:
            cluster.stop()

    log = daemon.log_text()
    assert code == 0, f"SIGTERM should stop the daemon and its cluster application cleanly (exit code {code})"
    assert f"sparkMaster={cluster.master_url} runs executors on other machines" in log
    assert "must be a path every executor and this daemon can reach" in log
    assert local_rows and len({r[2] for r in local_rows}) < 40, "tombstones should have deleted some keys"
    assert cluster_horizon == local_horizon
    assert cluster_rows == local_rows
    # The executors ran on the Worker: it kept the application's executor logs.
    assert list((tmp_path / "spark-cluster" / "work").glob(f"{app['id']}/*/stderr"))
