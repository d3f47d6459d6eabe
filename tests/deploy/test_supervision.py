"""The daemon under a supervisor: if its Spark JVM dies it exits non-zero, so that it is restarted."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.deploy import DaemonProcess, write_conf


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _java_descendant(pid: int) -> int | None:
    todo = [pid]
    while todo:
        current = todo.pop()
        for child in _children(current):
            try:
                exe = os.readlink(f"/proc/{child}/exe")
            except OSError:
                continue
            if exe.endswith("/java"):
                return child
            todo.append(child)
    return None


@pytest.mark.slow
def test_daemon_exits_non_zero_when_the_spark_jvm_dies(broker, tmp_path):
    port = DaemonProcess.free_port()
    conf = write_conf(tmp_path / "broker.conf", {
        "kafkaBootstrapServers": broker.bootstrap,
        "compactedLedgerRoot": str(tmp_path / "ledgers"),
        "httpPort": str(port),
        "sparkMaster": "local[1]",
        "spark.ui.enabled": "false",
    })
    daemon = DaemonProcess(conf, tmp_path / "daemon.log", port).start()
    try:
        daemon.wait_ready()
        jvm = _java_descendant(daemon.process.pid)
        assert jvm is not None, "the daemon's Spark JVM was not found among its descendants"
        os.kill(jvm, signal.SIGKILL)
        code = daemon.process.wait(60)
        assert code == 70, f"exit code {code}; log:\n{daemon.log_text()[-3000:]}"
        assert "Spark JVM died" in daemon.log_text()
    finally:
        daemon.stop()
