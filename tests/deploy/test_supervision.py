"""The daemon under a supervisor: if its Spark JVM dies it exits non-zero, so that it is restarted."""

from __future__ import annotations

import os
import signal

import pytest

from compactord.embedded import free_port
from tests.support.daemon import DaemonProcess, write_conf
from tests.support.processes import descendants, executable


def _java_descendant(pid: int) -> int | None:
    return next((p for p in descendants(pid) if (executable(p) or "").endswith("/java")), None)


@pytest.mark.slow
def test_daemon_exits_non_zero_when_the_spark_jvm_dies(broker, tmp_path):
    port = free_port()
    conf = write_conf(tmp_path / "broker.conf", {
        "kafkaBootstrapServers": broker.bootstrap,
        "compactedLedgerRoot": str(tmp_path / "ledgers"),
        "httpPort": str(port),
        "sparkMaster": "local[1]",
        "spark.ui.enabled": "false",
    })
    daemon = DaemonProcess(conf, tmp_path / "daemon.log", port, tmp_path / "ledgers").start()
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
