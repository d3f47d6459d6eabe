"""Deployment tests: the packaging files, and the daemon run as its own process, the way systemd,
Docker and Kubernetes run it (``python -m compactord run --config broker.conf``).

``DaemonProcess`` is shared by ``test_packaging`` and ``test_cluster``. It stops what it started by
PID: SIGTERM to the daemon alone (as ``KillMode=mixed`` and tini do: the daemon stops its Spark JVM
itself), then SIGKILL to whatever is left in its process group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from compactord.embedded import free_port

__all__ = ["DaemonProcess", "write_conf"]

READY_TIMEOUT_S = 240.0
COMPACTION_TIMEOUT_S = 180.0


def write_conf(path: Path, values: dict[str, str]) -> Path:
    """A broker.conf (Java properties) with ``values``; backslashes are doubled as Properties needs."""
    lines = [f"{key}={value.replace(chr(92), chr(92) * 2)}" for key, value in values.items()]
    path.write_text("\n".join(lines) + "\n", encoding="latin-1")
    return path


class DaemonProcess:
    """``compactord run --config <conf>`` as a subprocess in its own session, logging to ``log_path``."""

    def __init__(self, conf: Path, log_path: Path, port: int, token: str = "") -> None:
        self.conf = conf
        self.log_path = log_path
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.token = token
        self.process: subprocess.Popen[bytes] | None = None

    @staticmethod
    def free_port() -> int:
        return free_port()

    def start(self) -> DaemonProcess:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "compactord", "run", "--config", str(self.conf)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        return self

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def _fail(self, what: str) -> None:
        tail = "\n".join(self.log_text().splitlines()[-40:])
        raise AssertionError(f"{what}; the daemon's log ends with:\n{tail}")

    def client(self, auth: bool = True) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"} if auth and self.token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30.0)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        with self.client(auth=False) as http:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    self._fail(f"the daemon exited with code {self.process.returncode} before it was ready")
                try:
                    response = http.get("/readyz", timeout=5.0)
                    if response.status_code == 200:
                        return
                    last = response.text
                except httpx.HTTPError as exc:
                    last = repr(exc)
                time.sleep(1.0)
        self._fail(f"/readyz did not answer 200 within {timeout:.0f}s (last: {last})")

    def compact(self, topic: str, timeout: float = COMPACTION_TIMEOUT_S) -> dict[str, Any]:
        """``PUT /v1/topics/{topic}/compaction``, then poll its status until it ends; insist on SUCCESS."""
        with self.client() as http:
            response = http.put(f"/v1/topics/{topic}/compaction")
            assert response.status_code == 202, response.text
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                status = http.get(f"/v1/topics/{topic}/compaction").json()
                if status["status"] != "RUNNING":
                    if status["status"] != "SUCCESS":
                        self._fail(f"the compaction of {topic} ended {status}")
                    return status
                time.sleep(1.0)
        self._fail(f"the compaction of {topic} did not end within {timeout:.0f}s")
        raise AssertionError("unreachable")

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM to the daemon, wait, then SIGKILL to its whole process group; the exit code or None."""
        if self.process is None:
            return None
        code: int | None = self.process.poll()
        if code is None:
            try:
                os.kill(self.process.pid, signal.SIGTERM)
                code = self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                code = None
            except ProcessLookupError:
                code = self.process.poll()
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the JVM or Python workers, if any are left
        except (ProcessLookupError, PermissionError):
            pass
        if code is None:  # it did not stop by itself and was killed
            self.process.wait(10)
        return code
