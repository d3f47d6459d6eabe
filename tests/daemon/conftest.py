"""The daemon tier: the real daemon, as ``compactord run --config FILE`` in a subprocess
(``tests.support.daemon.DaemonProcess``), driven over HTTP.

A daemon start costs 15-25 s (Spark start and warm-up on the 2-core CI machine), so each test module
starts the daemons it needs once (``launch``, module-scoped), the modules that read, fuzz, run
the CLI and watch the backlog monitor share one package-scoped daemon with a token (``shared_daemon``),
those that need a daemon without one share another (``open_daemon``), those that hang or stop their
broker share a broker of their own and its daemon (``isolated_broker``, ``isolated_daemon``), and those of
an S3 root share a daemon whose store is reached through a fault-injecting proxy (``s3_daemon``). Every
daemon is stopped by PID in teardown, also when a test fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from compactord.embedded import EmbeddedBroker, free_port
from tests.support.daemon import DaemonProcess, write_conf
from tests.support.fault_proxy import FaultProxy
from tests.support.probes import GATE_ENV, PAUSES_ENV
from tests.support.s3_server import BUCKET

PAUSING_FACTORY = "tests.support.probes:PausingFactory"

NEVER = "(?!)"  # a compactionTopicsPattern that matches no topic: the monitor compacts nothing
SHARED_TOKEN = "s3cret-shared-token"
# The shared daemon's monitor: every second, over the topics kafka.topic(prefix="mon") makes only;
# broker-wide, only the messages trigger is on (test_monitor.py turns triggers on per topic).
MONITOR_PATTERN = "mon-[0-9]+-[0-9a-f]{6}"
SHARED_THRESHOLD_MESSAGES = 1000
# A strategy plug-in the shared daemon lists: a topic that chooses it fails every compaction.
FAILING_STRATEGY = "tests.support.plugins.failing:FailingOrder"
# The open daemon answers to these host names only (it listens on every address).
OPEN_HOST = "compactord.example"
# The open daemon's pages of the compacted view (4 MiB of values and some keys, a page of ~5.6 MB of JSON), the
# buffer for answers still being sent (two such pages, not three), and the time a client may take none of one.
OPEN_PAGE_RAW = 4 * 1024 * 1024
OPEN_READ_MAX_BYTES = OPEN_PAGE_RAW + 4096
OPEN_BUFFER_BYTES = 12 * 1024 * 1024
OPEN_SEND_TIMEOUT_S = 8


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
            # A replaced ledger is deleted at once (once no read holds it), as the tests of the
            # ledger's life expect; pinned reads and their grace period are tested in-process.
            "compactionRetiredLedgerGraceSeconds": 0,
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
        write_conf(config, values)
        daemon = DaemonProcess(config, workdir / "daemon.log", port, root, token=token, workdir=workdir,
                               env=env)
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
    """One daemon with a bearer token (given as file:/path), null keys retained, a one-second monitor
    over the ``mon-*`` topics, and a strategy plug-in that fails (``FAILING_STRATEGY``)."""
    launcher = Launcher(broker, tmp_path_factory.mktemp("shared"))
    try:
        yield launcher(
            "shared", token=SHARED_TOKEN, topicCompactionRetainNullKey="true",
            brokerServiceCompactionMonitorIntervalInSeconds=1,
            compactionThresholdInMessages=SHARED_THRESHOLD_MESSAGES,
            compactionTopicsPattern=MONITOR_PATTERN,
            compactionMaxConcurrentTasks=2,
            compactionStrategyPlugins=FAILING_STRATEGY,
        )
    finally:
        launcher.stop_all()


@pytest.fixture(scope="package")
def open_gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The open daemon's gate: while this file is missing, its runs wait in Running (a test removes it and
    touches it again, also when it fails)."""
    gate = tmp_path_factory.mktemp("open-gate") / "open"
    gate.touch()
    return gate


@pytest.fixture(scope="package")
def open_daemon(broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory,
                open_gate: Path) -> Iterator[DaemonProcess]:
    """One daemon without a token on purpose: on every address (``httpAllowUnauthenticated``), answering to
    ``OPEN_HOST`` and the loopback names only; every request is allowed, state-changing ones must say JSON. Its
    runs pass ``open_gate`` (at Running) while that file exists. Its answers share a buffer of
    ``OPEN_BUFFER_BYTES``, pages of up to ``OPEN_READ_MAX_BYTES`` (test_response_budget.py)."""
    launcher = Launcher(broker, tmp_path_factory.mktemp("open"))
    try:
        daemon = launcher.prepare("open", httpBindAddress="0.0.0.0", httpAllowUnauthenticated="true",
                                  httpAllowedHosts=f"{OPEN_HOST},127.0.0.1,localhost",
                                  httpReadMaxBytes=OPEN_READ_MAX_BYTES, httpResponseBufferBytes=OPEN_BUFFER_BYTES,
                                  httpRequestBodyTimeoutSeconds=OPEN_SEND_TIMEOUT_S,
                                  compactionServiceFactoryClassName=PAUSING_FACTORY)
        daemon.env[GATE_ENV] = f"running:{open_gate}"
        yield daemon.start().wait_ready()
    finally:
        launcher.stop_all()


@pytest.fixture(scope="package")
def isolated_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A broker of its own, so that a test that hangs (SIGSTOP) or stops it stops no other test; resumed
    (SIGCONT) and stopped in teardown, also when a test fails. The module that stops it runs last of those
    using it (test_recreate.py)."""
    broker = EmbeddedBroker(log_path=tmp_path_factory.mktemp("isolated-broker") / "tansu.log").start()
    try:
        yield broker
    finally:
        if broker.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(broker.pid, signal.SIGCONT)
        broker.stop()


# The isolated daemon's kafkaRequestTimeoutMs: longer than any wait of its tests, so that a stalled broker is
# seen by the watch's own deadline on a ping, and a listing's own deadline on the broker, not after a request's
# timeout (test_probes.py).
ISOLATED_REQUEST_TIMEOUT_MS = 300_000


@pytest.fixture(scope="package")
def isolated_daemon(isolated_broker: EmbeddedBroker,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """A daemon of ``isolated_broker``, its monitor's pass an hour away (whatever answers 410 in
    test_recreate.py is the reads' own check)."""
    launcher = Launcher(isolated_broker, tmp_path_factory.mktemp("isolated"))
    try:
        yield launcher("isolated", kafkaRequestTimeoutMs=ISOLATED_REQUEST_TIMEOUT_MS,
                       brokerServiceCompactionMonitorIntervalInSeconds=3600)
    finally:
        launcher.stop_all()


# The S3 daemon's storageWriteRetrySeconds: a store down longer fails a compaction's writes soon.
S3_WRITE_BUDGET_S = 3


@pytest.fixture(scope="package")
def s3_proxy(s3_server: Any) -> Iterator[FaultProxy]:
    """The fault-injecting proxy in front of the session's S3 server that ``s3_daemon`` reaches it through (it
    relays all until a test sets a fault; the tests that do heal it at their end, also when they fail)."""
    with FaultProxy(int(s3_server.endpoint.rsplit(":", 1)[1])) as proxy:
        yield proxy


@pytest.fixture(scope="package")
def s3_gates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``s3_daemon``'s gate files, at the run's start (``running``) and once its ledger is written (``written``):
    a test removes one to hold the next run there (and touches it again, also when it fails)."""
    folder = tmp_path_factory.mktemp("s3-gates")
    found = {point: folder / point for point in ("running", "written")}
    for gate in found.values():
        gate.touch()
    return found


@pytest.fixture(scope="package")
def s3_daemon(broker: EmbeddedBroker, s3_server: Any, s3_proxy: FaultProxy, s3_gates: dict[str, Path],
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """A daemon on a fresh S3 root, through ``s3_proxy``, its runs passing ``s3_gates``; the monitor's pass an hour
    away and no periodic sweep (a pass lists the root: the requests test_s3_root.py counts are the reads' own). A
    test may stop it and start it again (the same ``DaemonProcess``)."""
    launcher = Launcher(broker, tmp_path_factory.mktemp("s3"))
    try:
        root: Any = f"s3://{BUCKET}/daemon-{uuid.uuid4().hex[:12]}"
        daemon = launcher.prepare("s3", root=root, pauses="", storageWriteRetrySeconds=S3_WRITE_BUDGET_S,
                                  brokerServiceCompactionMonitorIntervalInSeconds=3600, storageSweepIntervalSeconds=0,
                                  **s3_server.daemon_conf(s3_proxy.endpoint))
        daemon.env[GATE_ENV] = ",".join(f"{point}:{gate}" for point, gate in s3_gates.items())
        yield daemon.start().wait_ready()
    finally:
        launcher.stop_all()


# -- helpers --------------------------------------------------------------------------------------


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


def run_cli(*args: str, env: dict[str, str] | None = None,
            timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    """``compactord ARGS`` as a subprocess, with no COMPACTORD_* variable but those in ``env``."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTORD_")}
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "compactord", *args], check=False, capture_output=True,
                          text=True, timeout=timeout, env=environment, stdin=subprocess.DEVNULL)
