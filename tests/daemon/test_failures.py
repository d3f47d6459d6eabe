"""The daemon when parts of its world misbehave: a corrupt topic among healthy ones, a broker that
does not answer, a Spark JVM that hangs. Error bodies and probes name what is wrong without echoing
ledger paths, broker addresses or exception texts (those stay in the log)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from compactord.embedded import free_port
from compactord.ledger.store import LedgerStore
from tests.support.daemon import DaemonProcess, compact
from tests.support.processes import descendants, executable
from tests.support.waiting import wait_for
from tests.unit.ledger.test_store import make_ledger

from .conftest import Launcher, assert_error

pytestmark = pytest.mark.slow

TOKEN = "failures-token"
HUNG_JVM_EXIT_BOUND_S = 120.0  # the watchdog's 30 s liveness timeout, its 2 s period, the exit itself


def test_a_corrupt_topic_is_listed_with_its_error_and_the_others_normally(launch: Launcher, kafka: Any,
                                                                         tmp_path: Path) -> None:
    broken, healthy = kafka.topic(prefix="corrupt"), kafka.topic(prefix="healthy")
    for topic in (broken, healthy):
        kafka.produce(topic, [(f"k{i % 3}", f"v{i}") for i in range(6)])
    # The broken topic's ledger, current on the root before the daemon starts (so the daemon reads it from disk,
    # as a restart does), its manifest then edited by hand.
    root = tmp_path / "ledgers"
    with LedgerStore(root) as store:
        ledger_id = make_ledger(store, broken)
        store.switch(broken, ledger_id)
        ledger = store.ledger_path(broken, ledger_id)
    (ledger / "manifest.json").write_text("{edited by hand")
    daemon = launch("corrupt", root=root, token=TOKEN)
    compact(daemon, healthy)

    response = daemon.http.get("/v1/topics")
    assert response.status_code == 200, response.text
    listed = {t["topic"]: t for t in response.json()["topics"]}
    assert listed[healthy]["last_compaction"]["status"] == "SUCCESS"
    assert listed[broken]["error"]["error"] == "ledger_corrupt"
    assert str(daemon.root) not in response.text and "JSONDecodeError" not in response.text

    # the topic's own endpoints say what is wrong, not where
    body = assert_error(daemon.http.get(f"/v1/topics/{broken}/horizon"), 500, "ledger_corrupt")
    assert str(daemon.root) not in body["message"] and "manifest" not in body["message"]
    assert "rebuild" in body["message"]
    assert str(daemon.root) in daemon.log_text()  # the detail is in the log


@pytest.fixture(scope="module")
def brokerless(launch: Launcher) -> DaemonProcess:
    """A daemon whose broker address answers nothing (a port nobody listens on); Spark starts anyway."""
    daemon = launch.prepare("brokerless", token=TOKEN, kafkaBootstrapServers=f"127.0.0.1:{free_port()}",
                            kafkaRequestTimeoutMs=2000).start()
    wait_for(lambda: "Spark is warm" in daemon.log_text(), 240, "the Spark session to warm up", daemon)
    return daemon


def test_readyz_names_the_broker_without_its_address(brokerless: DaemonProcess) -> None:
    bootstrap = next(line.split("=", 1)[1].strip() for line in brokerless.config.read_text().splitlines()
                     if line.startswith("kafkaBootstrapServers"))
    with brokerless.client(token=None) as c:
        # degraded, not 503: ledger reads go on while the broker is away
        response = wait_for(lambda: (r := c.get("/readyz")).status_code == 200
                            and r.json()["problems"] == ["the broker does not answer"] and r, 60,
                            "/readyz to blame the broker alone (Spark warm)", brokerless)
    assert response.json()["status"] == "degraded" and response.json()["compactions"] is False
    assert bootstrap not in response.text and bootstrap.split(":")[1] not in response.text, response.text
    assert "Error" not in response.text and "(" not in response.text, response.text
    assert bootstrap in brokerless.log_text()  # the detail is in the log


def test_a_hung_spark_jvm_makes_the_daemon_exit_non_zero(brokerless: DaemonProcess) -> None:
    jvms = [pid for pid in descendants(brokerless.pid) if (executable(pid) or "").endswith("/java")]
    assert jvms, f"no java child of the daemon {brokerless.pid}"
    try:
        for pid in jvms:
            os.kill(pid, signal.SIGSTOP)  # every py4j call now waits forever
        code = brokerless.wait_exit(HUNG_JVM_EXIT_BOUND_S)
        assert code is not None, f"the daemon did not exit with its JVM hung\n{brokerless.log_tail()}"
        assert code != 0, brokerless.log_tail()
        assert "does not answer" in brokerless.log_text()
    finally:
        for pid in jvms:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
