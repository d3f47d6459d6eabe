"""The real daemon, as ``compactord run --config FILE`` in a subprocess, driven over HTTP.

A daemon start costs 15-25 s (Spark start and warm-up on the 2-core CI machine), so each test module
starts the daemons it needs once (``launch``, module-scoped), and the modules that read, fuzz, run
the CLI and watch the backlog monitor share one package-scoped daemon (``shared_daemon``). Every
daemon is stopped by PID in teardown, also when a test fails: SIGTERM, a wait, then SIGKILL to its
process group (the Spark JVM and its Python workers are in it).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from compactord.embedded import EmbeddedBroker, free_port
from tests.support.probes import PAUSES_ENV

PAUSING_FACTORY = "tests.support.probes:PausingFactory"

READY_TIMEOUT_S = 180.0  # ~25 s on an idle 2-core machine; several times that when it is shared
STOP_TIMEOUT_S = 60.0
TASK_TIMEOUT_S = 120.0  # a small topic's compaction, pauses included, on a busy 2-core machine
NEVER = "(?!)"  # a compactionTopicsPattern that matches no topic: the monitor compacts nothing
SHARED_TOKEN = "s3cret-shared-token"
# The shared daemon's monitor: every second, over the topics kafka.topic(prefix="mon") makes only;
# broker-wide, only the messages trigger is on (test_monitor.py turns triggers on per topic).
MONITOR_PATTERN = "mon-[0-9]+-[0-9a-f]{6}"
SHARED_THRESHOLD_MESSAGES = 1000
OWN_TOKEN = object()  # DaemonProcess.client(): send the daemon's own token


def _escape(value: str) -> str:
    """A value as java.util.Properties.load reads it back (a backslash is doubled)."""
    return value.replace("\\", "\\\\")


@dataclass
class DaemonProcess:
    """One ``compactord run`` subprocess and the files around it."""

    workdir: Path
    root: Path
    port: int
    config: Path
    log_path: Path
    token: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # added to every start's environment
    process: subprocess.Popen[bytes] | None = None
    _http: httpx.Client | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    # -- HTTP -----------------------------------------------------------------------------------

    @property
    def http(self) -> httpx.Client:
        """A client that sends the daemon's token (if it has one)."""
        if self._http is None:
            self._http = self.client()
        return self._http

    def client(self, token: object = OWN_TOKEN, **kwargs: Any) -> httpx.Client:
        """A new client; ``token=None`` sends no Authorization header, a string sends that token."""
        token = self.token if token is OWN_TOKEN else token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60.0, **kwargs)

    def raw(self, method: str, raw_path: str, token: object = OWN_TOKEN) -> tuple[int, dict[str, Any]]:
        """Send ``raw_path`` byte for byte (httpx normalises ``..`` segments); return status and JSON body."""
        token = self.token if token is OWN_TOKEN else token
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            connection.putrequest(method, raw_path, skip_accept_encoding=True)
            if token:
                connection.putheader("Authorization", f"Bearer {token}")
            connection.endheaders()
            response = connection.getresponse()
            return response.status, json.loads(response.read())
        finally:
            connection.close()

    # -- the log --------------------------------------------------------------------------------

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        tail = "\n".join(self.log_text().splitlines()[-lines:])
        return f"--- last {lines} lines of {self.log_path} ---\n{tail}"

    # -- life -----------------------------------------------------------------------------------

    def start(self, env: dict[str, str] | None = None) -> DaemonProcess:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTORD_")}
        environment.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                           SPARK_LOCAL_IP="127.0.0.1")
        environment.update(self.env)
        environment.update(env or {})
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "compactord", "run", "--config", str(self.config)],
                cwd=self.workdir, env=environment, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> DaemonProcess:
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        with httpx.Client(base_url=self.url, timeout=5.0) as c:
            while time.monotonic() < deadline:
                assert self.process is not None
                if self.process.poll() is not None:
                    pytest.fail(f"compactord exited with code {self.process.returncode} before it was ready\n"
                                f"{self.log_tail()}")
                try:
                    response = c.get("/readyz")
                    if response.status_code == 200:
                        return self
                    last = f"{response.status_code} {response.text}"
                except httpx.HTTPError as exc:
                    last = repr(exc)
                time.sleep(0.5)
        self.stop()
        pytest.fail(f"compactord was not ready within {timeout:.0f}s (last /readyz: {last})\n"
                    f"{self.log_tail()}")

    def wait_exit(self, timeout: float) -> int | None:
        assert self.process is not None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL whatever is left of the process group."""
        if self._http is not None:
            self._http.close()
            self._http = None
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            self.wait_exit(timeout)
        self.kill_group()
        return process.wait(10)

    def kill_group(self) -> None:
        """SIGKILL the daemon's process group (the daemon, its JVM and Spark's Python workers)."""
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)


def write_config(path: Path, conf: dict[str, object]) -> None:
    lines = [f"{key}={_escape(str(value))}" for key, value in conf.items() if value is not None]
    path.write_text("\n".join(lines) + "\n", encoding="latin-1")


class Launcher:
    """Starts daemons in fresh folders and stops every one of them at the end of its scope."""

    def __init__(self, broker: EmbeddedBroker, base: Path) -> None:
        self._broker = broker
        self._base = base
        self._started: list[DaemonProcess] = []

    def prepare(self, name: str, *, root: Path | None = None, token: str | None = None,
                pauses: str | None = None, **conf: object) -> DaemonProcess:
        """Write the config of a daemon (not started). ``conf`` keys are broker.conf keys; ``pauses``
        (``point:seconds[,...]``) holds its tasks at checkpoints, through the test factory
        ``tests.support.probes:PausingFactory``."""
        workdir = self._base / f"{name}-{len(self._started)}"
        workdir.mkdir(parents=True)
        root = root or workdir / "ledgers"
        port = free_port()
        values: dict[str, object] = {
            "kafkaBootstrapServers": self._broker.bootstrap,
            "kafkaRequestTimeoutMs": 10000,
            "compactedLedgerRoot": root,
            "httpPort": port,
            "sparkMaster": "local[2]",
            "spark.driver.memory": "1g",
            "brokerServiceCompactionThresholdInBytes": 0,
            "compactionTopicsPattern": NEVER,
        }
        if token is not None:
            token_file = workdir / "token"
            token_file.write_text(token + "\n")
            values["httpAuthToken"] = f"file:{token_file}"
        env = {}
        if pauses is not None:
            values["compactionServiceFactoryClassName"] = PAUSING_FACTORY
            env[PAUSES_ENV] = pauses
        values.update(conf)
        config = workdir / "broker.conf"
        write_config(config, values)
        daemon = DaemonProcess(workdir, root, port, config, workdir / "daemon.log", token=token, env=env)
        self._started.append(daemon)
        return daemon

    def __call__(self, name: str, *, root: Path | None = None, token: str | None = None,
                 pauses: str | None = None, **conf: object) -> DaemonProcess:
        """Start a daemon and wait until it is ready."""
        return self.prepare(name, root=root, token=token, pauses=pauses, **conf).start().wait_ready()

    def stop_all(self) -> None:
        for daemon in reversed(self._started):
            if daemon.process is not None:
                daemon.stop()


@pytest.fixture(scope="module")
def launch(broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    launcher = Launcher(broker, tmp_path_factory.mktemp("daemons"))
    try:
        yield launcher
    finally:
        launcher.stop_all()


@pytest.fixture(scope="package")
def shared_daemon(broker: EmbeddedBroker,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """One daemon with a bearer token (given as file:/path), null keys retained and a one-second
    monitor over the ``mon-*`` topics."""
    launcher = Launcher(broker, tmp_path_factory.mktemp("shared"))
    try:
        yield launcher(
            "shared", token=SHARED_TOKEN, topicCompactionRetainNullKey="true",
            brokerServiceCompactionMonitorIntervalInSeconds=1,
            compactionThresholdInMessages=SHARED_THRESHOLD_MESSAGES,
            compactionTopicsPattern=MONITOR_PATTERN,
            compactionMaxConcurrentTasks=2,
        )
    finally:
        launcher.stop_all()


# -- helpers --------------------------------------------------------------------------------------


def wait_for(condition: Callable[[], Any], timeout: float, what: str,
             daemon: DaemonProcess | None = None, interval: float = 0.1) -> Any:
    """Poll ``condition`` until it returns something truthy; fail naming ``what`` (and the daemon's log)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}" +
                        (f"\n{daemon.log_tail()}" if daemon is not None else ""))
        time.sleep(interval)


def status(daemon: DaemonProcess, topic: str) -> dict[str, Any]:
    response = daemon.http.get(f"/v1/topics/{topic}/compaction")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def wait_state(daemon: DaemonProcess, topic: str, *states: str,
               timeout: float = TASK_TIMEOUT_S) -> dict[str, Any]:
    """Wait until the topic's status reports one of ``states``; return that status."""
    found: dict[str, Any] = wait_for(
        lambda: (s := status(daemon, topic))["state"] in states and s, timeout,
        f"topic {topic} to reach state {' or '.join(states)}", daemon, interval=0.05)
    return found


def compact(daemon: DaemonProcess, topic: str, timeout: float = TASK_TIMEOUT_S) -> dict[str, Any]:
    """Trigger a compaction and wait for it to succeed; return the final status."""
    response = daemon.http.put(f"/v1/topics/{topic}/compaction")
    assert response.status_code == 202, response.text
    task_id = response.json()["task_id"]
    final = wait_state(daemon, topic, "Succeed", "Failed", "Cancelled", timeout=timeout)
    assert final["task_id"] == task_id
    assert final["status"] == "SUCCESS", f"{final}\n{daemon.log_tail()}"
    return final


def assert_error(response: httpx.Response, status_code: int, code: str | None = None) -> dict[str, Any]:
    """The response is an error of the API's one shape: ``{"error", "message"}`` (409 adds ``task``)."""
    assert response.status_code == status_code, f"{response.status_code} {response.text}"
    body: dict[str, Any] = response.json()
    allowed = {"error", "message", "task"} if status_code == 409 else {"error", "message"}
    assert {"error", "message"} <= set(body) <= allowed, body
    assert isinstance(body["error"], str) and isinstance(body["message"], str) and body["message"], body
    if code is not None:
        assert body["error"] == code, body
    return body


def metric_samples(daemon: DaemonProcess) -> list[tuple[str, dict[str, str], float]]:
    """``/metrics`` (it needs no token) as (name, labels, value) samples."""
    from prometheus_client.parser import text_string_to_metric_families

    with daemon.client(token=None) as c:
        response = c.get("/metrics")
    assert response.status_code == 200, response.text
    return [(s.name, dict(s.labels), s.value) for family in text_string_to_metric_families(response.text)
            for s in family.samples]


def metric(daemon: DaemonProcess, name: str, **labels: str) -> float | None:
    """The value of one sample (None if absent)."""
    for sample_name, sample_labels, value in metric_samples(daemon):
        if sample_name == name and all(sample_labels.get(k) == v for k, v in labels.items()):
            return value
    return None


def ledger_dirs(root: Path, topic: str) -> list[str]:
    topic_dir = root / topic
    if not topic_dir.is_dir():
        return []
    return sorted(p.name for p in topic_dir.iterdir() if p.name.startswith("ledger-"))


def run_cli(*args: str, env: dict[str, str] | None = None,
            timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    """``compactord ARGS`` as a subprocess, with no COMPACTORD_* variable but those in ``env``."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTORD_")}
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "compactord", *args], check=False, capture_output=True,
                          text=True, timeout=timeout, env=environment, stdin=subprocess.DEVNULL)
