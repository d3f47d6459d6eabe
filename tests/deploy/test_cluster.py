"""Scale-out: the daemon's compactions on a real standalone Spark cluster give the local-mode result.

A Master and two Workers from the pyspark distribution (``bin/spark-class``: the pip package has no
start scripts) run on loopback, each Worker with its own work and local folders, one cluster for the module;
the daemon runs as its own process with ``sparkMaster=spark://...`` and a ledger root on the local disk, or
on S3 (the session's SeaweedFS: then no folder at all is shared). The same topic is
compacted in local mode by the in-process engine; both ledgers must hold the same entries and horizon.
The driver and its tasks on the executors talk over the driver's channel only: an incremental run's early
tasks get their plan, a throttled run's tasks get a larger share as others end, a cancel stops a run, and
no progress, cancel, rate or plan file appears under the ledger root meanwhile.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from compactord.embedded import dies_with, free_port
from compactord.model import Entry
from tests.support.channel import control_files
from tests.support.daemon import DaemonProcess, compact, status, write_conf
from tests.support.s3_server import BUCKET
from tests.support.service import compact as compact_here
from tests.support.service import entries
from tests.support.timeouts import TASK_TIMEOUT_S
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

PARTITIONS = 3
WORKERS = 2
# The throttled topic: ~4 MB over 2 partitions of 3:1, read at this budget (>= 5 s); partition 1 ends first,
# and the driver hands its share to the task still reading.
CAP = 800_000
THROTTLED = [(f"k{i}", b"x" * 1000, int(i % 4 == 0)) for i in range(4000)]
Row = tuple[int, int, bytes | None, bytes | None, int | None, tuple[tuple[str, bytes], ...]]


def spark_class() -> Path:
    import pyspark

    path = Path(pyspark.__file__).parent / "bin" / "spark-class"
    assert path.exists(), f"the pyspark distribution has no {path}"
    return path


class StandaloneCluster:
    """A standalone Master and ``WORKERS`` Workers on 127.0.0.1, each in its own session, stopped by PID."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.webui_port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.env = {
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            # no REST submission port (6066 by default: it would clash with any other master here)
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        }

    def _spawn(self, name: str, *args: str, env: dict[str, str] | None = None) -> None:
        with open(self.workdir / f"{name}.log", "ab") as log:
            self.processes.append(subprocess.Popen(
                [str(spark_class()), *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**self.env, **(env or {})}, start_new_session=True,
                preexec_fn=dies_with(os.getpid()),  # noqa: PLW1509 - prctl and getppid only: safe after fork
            ))

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def status(self) -> dict[str, Any]:
        """The Master's web UI JSON (workers, applications)."""
        return httpx.get(f"http://127.0.0.1:{self.webui_port}/json/", timeout=5.0).json()

    def work_dir(self, worker: int) -> Path:
        return self.workdir / f"worker-{worker}" / "work"

    def start(self, timeout: float = 90.0) -> StandaloneCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.webui_port))
        for worker in range(WORKERS):  # no folder in common: each its own work and local folders
            local = self.workdir / f"worker-{worker}" / "local"
            local.mkdir(parents=True, exist_ok=True)
            self.work_dir(worker).mkdir(parents=True, exist_ok=True)
            self._spawn(f"worker-{worker}", "org.apache.spark.deploy.worker.Worker", self.master_url, "--host",
                        "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
                        "--work-dir", str(self.work_dir(worker)),
                        env={"SPARK_LOCAL_DIRS": str(local), "SPARK_WORKER_DIR": str(self.work_dir(worker))})
        names = ["master", *(f"worker-{w}" for w in range(WORKERS))]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process, name in zip(self.processes, names, strict=True):
                if process.poll() is not None:
                    raise AssertionError(
                        f"the Spark {name} exited with code {process.returncode}:\n{self.log(name)}")
            try:
                status = self.status()
                workers = status.get("workers", [])
                alive = status.get("aliveworkers", sum(w.get("state") == "ALIVE" for w in workers))
                if alive >= WORKERS:
                    return self
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        raise AssertionError(f"the workers did not register within {timeout:.0f}s\nmaster:\n{self.log('master')}\n"
                             f"worker:\n{self.log('worker-0')}")

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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """One cluster for the module's daemons (each its own application): a cluster start costs tens of seconds."""
    started = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        yield started.start()
    finally:
        started.stop()


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
                                                              cluster: StandaloneCluster,
                                                              request: pytest.FixtureRequest) -> None:
    topic = kafka.topic(partitions=PARTITIONS, prefix="cluster")
    produce_mixed(kafka, topic)
    port = free_port()
    token = "cluster-token"
    conf = write_conf(tmp_path / "broker.conf", _daemon_conf(
        broker, cluster, topic, port, token,
        compactedLedgerRoot=str(tmp_path / "cluster-ledgers"),  # a local path: shared on one machine
        logLevel="DEBUG"))  # the channel's hand-offs are logged at DEBUG
    daemon = DaemonProcess(conf, tmp_path / "daemon.log", port, tmp_path / "cluster-ledgers", token)
    try:
        daemon.start()
        # While the daemon's session starts on the cluster, the reference: local mode, in this process
        # (asked for only now, so that a first start of the test session's Spark overlaps the daemon's).
        local_horizon, local_rows = local_mode_ledger(request.getfixturevalue("make_factory"),
                                                      tmp_path / "local-ledgers", topic)
        daemon.wait_ready()
        app = _application(cluster)
        compact(daemon, topic)
        cluster_horizon, cluster_rows = ledger_over_http(daemon, topic)
        seen = over_the_channel(kafka, daemon, topic, tmp_path / "cluster-ledgers")
    finally:
        code = daemon.stop()

    log = daemon.log_text()
    assert code == 0, f"SIGTERM should stop the daemon and its cluster application cleanly (exit code {code})"
    assert f"sparkMaster={cluster.master_url} runs executors on other machines" in log
    assert "must be a path every executor and this daemon can reach" in log
    assert local_rows and len({r[2] for r in local_rows}) < 40, "tombstones should have deleted some keys"
    assert cluster_horizon == local_horizon
    assert cluster_rows == local_rows
    # The executors ran on both Workers: each kept the application's executor logs in its own folder.
    for worker in range(WORKERS):
        assert list(cluster.work_dir(worker).glob(f"{app['id']}/*/stderr")), f"no executor ran on worker {worker}"
    # The incremental run's early tasks, on the executors, waited for their plan and were handed it.
    assert "the run's plan is handed to its early reading tasks" in log
    assert "stopped waiting for their plan" not in log
    # The throttled run's task still reading took the share of the one that ended: the whole budget.
    assert f"reads at {float(CAP)} bytes per second from now" in log
    assert not seen, f"control files under the ledger root: {seen}"


def _daemon_conf(broker: Any, cluster: StandaloneCluster, topic: str, port: int, token: str,
                 **keys: str) -> dict[str, str]:
    """broker.conf of a daemon whose compactions of ``topic`` run on ``cluster`` (one executor a worker), and
    ``keys``."""
    return {
        "kafkaBootstrapServers": broker.bootstrap,
        "httpPort": str(port),
        "httpAuthToken": token,
        "sparkMaster": cluster.master_url,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.memory": "1g",
        "spark.executor.memory": "1g",
        "spark.cores.max": "2",
        "compactionTopicsPattern": topic,
        "brokerServiceCompactionThresholdInBytes": "0",
        "compactionDriverRunMaxRecords": "0",  # every run a Spark job on the executors, however small its topic
        **keys,
    }


def test_compaction_on_a_standalone_cluster_into_an_s3_root(kafka: Any, broker: Any, s3_server: Any, tmp_path: Path,
                                                            cluster: StandaloneCluster,
                                                            request: pytest.FixtureRequest) -> None:
    topic = kafka.topic(partitions=PARTITIONS, prefix="cluster-s3")
    produce_mixed(kafka, topic)
    prefix = f"cluster-{uuid.uuid4().hex[:12]}"
    driver_dir = tmp_path / "driver"  # the daemon's working directory: no worker's
    driver_dir.mkdir()
    port = free_port()
    token = "cluster-token"
    conf = write_conf(tmp_path / "broker.conf", _daemon_conf(
        broker, cluster, topic, port, token, compactedLedgerRoot=f"s3://{BUCKET}/{prefix}", **s3_server.daemon_conf()))
    daemon = DaemonProcess(conf, tmp_path / "daemon.log", port, driver_dir / "ledgers", token, workdir=driver_dir)
    try:
        daemon.start()
        local_horizon, local_rows = local_mode_ledger(request.getfixturevalue("make_factory"),
                                                      tmp_path / "local-ledgers", topic)
        daemon.wait_ready()
        app = _application(cluster)
        compact(daemon, topic)
        cluster_horizon, cluster_rows = ledger_over_http(daemon, topic)
        cancelled = cancel_mid_run(kafka, daemon)
        store = s3_server.store(prefix)
        # The cancelled run's partial ledger is removed once its work has stopped.
        wait_for(lambda: not [n for n in store.children(f"{cancelled}/") if n.startswith("ledger-")],
                 TASK_TIMEOUT_S, "the cancelled run's ledger to be removed", daemon)
    finally:
        code = daemon.stop()

    assert code == 0, f"SIGTERM should stop the daemon and its cluster application cleanly (exit code {code})"
    assert "must be a path every executor and this daemon can reach" not in daemon.log_text()
    assert cluster_horizon == local_horizon
    assert cluster_rows == local_rows
    keys = [info.key for info in store.list(f"{topic}/")]
    assert f"{topic}/CURRENT" in keys and any(k.endswith(".parquet") for k in keys)
    for worker in range(WORKERS):
        work = cluster.work_dir(worker)
        assert not work.is_relative_to(driver_dir) and not driver_dir.is_relative_to(cluster.workdir)
        assert list(work.glob(f"{app['id']}/*/stderr")), f"no executor ran on worker {worker}"
    # The parts went to the bucket: none is left on a worker's disk, nor any root folder beside the driver.
    assert not list(cluster.workdir.rglob("*.parquet")), "a part was left on a worker's disk"
    assert not (driver_dir / "ledgers").exists() and not (driver_dir / "s3:").exists()


def _application(cluster: StandaloneCluster) -> dict[str, Any]:
    """The daemon's application on the cluster, with executor cores."""
    (app,) = [a for a in cluster.status()["activeapps"] if a["name"] == "compactord"]
    assert app["cores"] >= 1, f"the daemon's application got no executor cores: {app}"
    return app  # type: ignore[no-any-return]


def cancel_mid_run(kafka: Any, daemon: DaemonProcess) -> str:
    """A throttled compaction of a new topic, cancelled while its tasks read; the topic's name."""
    throttled = kafka.topic(partitions=2, prefix="cancelled")
    kafka.produce(throttled, THROTTLED)
    policy = daemon.http.put(f"/v1/topics/{throttled}/policies", json={"maxReadBytesPerSecond": CAP})
    assert policy.status_code == 200, policy.text
    assert daemon.http.put(f"/v1/topics/{throttled}/compaction").status_code == 202
    wait_for(lambda: status(daemon, throttled)["progress"]["records_read"] > 0, TASK_TIMEOUT_S,
             "the throttled run to read", daemon, interval=0.05)
    cancel = daemon.http.delete(f"/v1/topics/{throttled}/compaction")
    assert cancel.status_code in (200, 202), cancel.text
    final = watch(daemon, throttled, None, [], "Succeed", "Failed", "Cancelled")
    assert final["state"] == "Cancelled", final
    assert final["progress"]["records_read"] < len(THROTTLED), "the run had read everything: not mid-run"
    return throttled


def watch(daemon: DaemonProcess, topic: str, root: Path | None, seen: list[Path], *states: str) -> dict[str, Any]:
    """The topic's status once it is in one of ``states``, noting any control file under ``root`` (if any)
    meanwhile."""
    def reached() -> dict[str, Any] | None:
        if root is not None:
            seen.extend(control_files(root))
        found = status(daemon, topic)
        return found if found["state"] in states else None

    found: dict[str, Any] = wait_for(reached, TASK_TIMEOUT_S, f"topic {topic} to reach {states}", daemon,
                                     interval=0.05)
    return found


def over_the_channel(kafka: Any, daemon: DaemonProcess, topic: str, root: Path) -> list[Path]:
    """An incremental run (its tasks launched early), a throttled run, a cancelled one; the control files seen
    under ``root`` meanwhile (none: the driver and the executors talk over the channel)."""
    seen: list[Path] = []
    produce_mixed(kafka, topic)
    assert daemon.http.put(f"/v1/topics/{topic}/compaction").status_code == 202
    final = watch(daemon, topic, root, seen, "Succeed", "Failed", "Cancelled")
    assert final["status"] == "SUCCESS" and not final["full_rebuild"], f"{final}\n{daemon.log_tail()}"

    throttled = kafka.topic(partitions=2, prefix="throttled")
    kafka.produce(throttled, THROTTLED)
    policy = daemon.http.put(f"/v1/topics/{throttled}/policies", json={"maxReadBytesPerSecond": CAP})
    assert policy.status_code == 200, policy.text
    assert daemon.http.put(f"/v1/topics/{throttled}/compaction").status_code == 202
    final = watch(daemon, throttled, root, seen, "Succeed", "Failed", "Cancelled")
    assert final["status"] == "SUCCESS", f"{final}\n{daemon.log_tail()}"
    assert final["read_throttle"]["bytes_read"] == sum(len(k) + len(v) for k, v, _ in THROTTLED)

    # A cancel while the throttled tasks read (a rebuild reads the whole topic again, for seconds).
    assert daemon.http.put(f"/v1/topics/{throttled}/compaction", params={"rebuild": "true"}).status_code == 202
    def reading() -> bool:
        seen.extend(control_files(root))
        return status(daemon, throttled)["progress"]["records_read"] > 0

    wait_for(reading, TASK_TIMEOUT_S, "the throttled rebuild to read", daemon, interval=0.05)
    cancel = daemon.http.delete(f"/v1/topics/{throttled}/compaction")
    assert cancel.status_code in (200, 202), cancel.text
    final = watch(daemon, throttled, root, seen, "Succeed", "Failed", "Cancelled")
    assert final["state"] == "Cancelled", final
    assert final["progress"]["records_read"] < len(THROTTLED), "the rebuild had read everything: not mid-run"
    return seen
