"""The real daemon, ``python -m compactord run --config broker.conf`` in a subprocess, as the daemon
tier and the deployment tier start it (and as systemd, Docker and Kubernetes run it).

A ``DaemonProcess`` stops what it started by PID: SIGTERM to the daemon alone (as ``KillMode=mixed``
and tini do: the daemon stops its Spark JVM itself), a wait, then SIGKILL to whatever is left of its
process group (the Spark JVM and its Python workers are in it); also when a test fails.
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from compactord.embedded import dies_with
from tests.support.timeouts import READY_TIMEOUT_S, STOP_TIMEOUT_S, TASK_TIMEOUT_S
from tests.support.waiting import wait_for

__all__ = ["OWN_TOKEN", "DaemonProcess", "compact", "metric", "metric_samples", "status", "wait_state", "write_conf"]

OWN_TOKEN = object()  # DaemonProcess.client(): send the daemon's own token


def _escape(value: str) -> str:
    """A value as java.util.Properties.load reads it back (a backslash is doubled)."""
    return value.replace("\\", "\\\\")


def write_conf(path: Path, values: Mapping[str, object]) -> Path:
    """A broker.conf (Java properties) with ``values`` (a None value is left out)."""
    lines = [f"{key}={_escape(str(value))}" for key, value in values.items() if value is not None]
    path.write_text("\n".join(lines) + "\n", encoding="latin-1")
    return path


@dataclass
class DaemonProcess:
    """One ``compactord run`` subprocess, in its own session, and the files around it."""

    config: Path
    log_path: Path
    port: int
    root: Path  # the ledger root its config names
    token: str | None = None
    workdir: Path | None = None  # its working directory (None: the test process's)
    env: dict[str, str] = field(default_factory=dict)  # added to every start's environment
    args: tuple[str, ...] = ()  # added to ``run --config FILE`` (e.g. ``--embedded-broker``)
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
        # What the CLI's client sends too: without a token, a POST needs it (else 415).
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return httpx.Client(base_url=self.url, headers=headers, timeout=60.0, **kwargs)

    def raw(self, method: str, raw_path: str, token: object = OWN_TOKEN) -> tuple[int, dict[str, Any]]:
        """Send ``raw_path`` byte for byte (httpx normalises ``..`` segments); return status and JSON body."""
        token = self.token if token is OWN_TOKEN else token
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            connection.putrequest(method, raw_path, skip_accept_encoding=True)
            if token:
                connection.putheader("Authorization", f"Bearer {token}")
            connection.putheader("Content-Type", "application/json")
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
        """Start it, with no COMPACTORD_* variable of the test process's but those in ``self.env`` and
        ``env``."""
        environment = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTORD_")}
        environment.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                           SPARK_LOCAL_IP="127.0.0.1")
        environment.update(self.env)
        environment.update(env or {})
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "compactord", "run", "--config", str(self.config), *self.args],
                cwd=self.workdir, env=environment, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=dies_with(os.getpid()),  # noqa: PLW1509 - prctl and getppid only: safe after fork
            )
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> DaemonProcess:
        """Wait for /readyz to say that compactions can run (``"compactions": true``: Spark is warm and the
        broker answers; reads are served before that); if the daemon exits first or it never does, stop
        it and fail with the end of its log."""
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
                    if response.status_code == 200 and response.json()["compactions"] is True:
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
        """SIGTERM, wait up to ``timeout``, then SIGKILL whatever is left of the process group; the exit
        code (negative if it had to be killed), None if it was never started."""
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


# -- a topic's compaction over HTTP -------------------------------------------------------------------


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
