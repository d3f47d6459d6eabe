"""Probes that answer whatever the broker does (see #10): with the broker hung (SIGSTOP) and
80 requests waiting on it, /healthz answers, /readyz says "degraded" (ledger reads go on, compactions
cannot run), requests to the broker get 503 broker_unavailable; after SIGCONT it is ready again. The
daemon's kafkaRequestTimeoutMs is longer than any wait here: a stalled broker is seen by the watch's own
deadline on a ping, and a listing's own deadline on the broker, not after a request's timeout.

The broker here is not the session's (``isolated_broker``, shared with test_recreate.py), so that hanging it
stops no other test; it is resumed (SIGCONT) at the end of the test, also when it fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from compactord.embedded import EmbeddedBroker
from tests.support.daemon import DaemonProcess, compact
from tests.support.waiting import wait_for

from .conftest import assert_error

pytestmark = pytest.mark.slow

CONCURRENT = 80


def _signal(broker: EmbeddedBroker, signum: int) -> None:
    assert broker.pid is not None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(broker.pid, signum)


@pytest.fixture(scope="module")
def own_broker(isolated_broker: EmbeddedBroker) -> EmbeddedBroker:
    return isolated_broker


@pytest.fixture(scope="module")
def daemon(isolated_daemon: DaemonProcess) -> DaemonProcess:
    return isolated_daemon


@pytest.fixture(scope="module")
def compacted(own_broker: EmbeddedBroker, daemon: DaemonProcess) -> str:
    topic = "probed"
    admin = KafkaAdminClient(bootstrap_servers=own_broker.bootstrap)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=own_broker.bootstrap)
    try:
        for i in range(5):
            producer.send(topic, key=b"k%d" % (i % 2), value=b"v%d" % i)
        producer.flush()
    finally:
        producer.close(timeout=10)
    compact(daemon, topic)
    return topic


@contextlib.contextmanager
def hung(broker: EmbeddedBroker) -> Iterator[None]:
    _signal(broker, signal.SIGSTOP)
    try:
        yield
    finally:
        _signal(broker, signal.SIGCONT)


def readyz(daemon: DaemonProcess) -> tuple[int, dict[str, Any]]:
    response = httpx.get(f"{daemon.url}/readyz", timeout=10)
    return response.status_code, response.json()


def test_probes_answer_while_the_broker_hangs(own_broker: EmbeddedBroker, daemon: DaemonProcess,
                                              compacted: str) -> None:
    assert readyz(daemon) == (200, {"status": "ready", "compactions": True, "reads": True, "problems": []})
    answers: list[Any] = []

    def list_topics() -> None:
        try:
            with httpx.Client(base_url=daemon.url, timeout=30) as client:
                response = client.get("/v1/topics")
            answers.append((response.status_code, response.json()))
        except httpx.TimeoutException:
            answers.append("client timeout")  # one of the few holding a broker slot, behind the hung broker

    with hung(own_broker):
        threads = [threading.Thread(target=list_topics, daemon=True) for _ in range(CONCURRENT)]
        for thread in threads:
            thread.start()
        # Liveness answers (within httpx's 10 s: a bound on the wait, not a measure of speed).
        assert httpx.get(f"{daemon.url}/healthz", timeout=10).status_code == 200
        code, body = wait_for(lambda: (r := readyz(daemon))[1]["status"] == "degraded" and r,
                              60, "/readyz to say degraded", daemon)
        assert code == 200 and body["compactions"] is False and body["reads"] is True, body
        assert any("broker" in problem for problem in body["problems"]), body
        # Ledger reads go on: they never call the broker.
        page = httpx.get(f"{daemon.url}/v1/topics/{compacted}/compacted", params={"partition": 0}, timeout=10)
        assert page.status_code == 200 and len(page.json()["entries"]) == 2, page.text
        # A request to the broker while it is known to be down is refused at once.
        refused = httpx.get(f"{daemon.url}/v1/topics", timeout=10)
        assert_error(refused, 503, "broker_unavailable")
        assert httpx.get(f"{daemon.url}/healthz", timeout=10).status_code == 200
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads)
    assert len(answers) == CONCURRENT
    assert "client timeout" not in answers, answers  # none waited on the broker for the request timeout
    # The listing answers from memory: 200 before the broker is known down, 503 at once after.
    assert all(code == 200 or (code == 503 and body["error"] == "broker_unavailable") for code, body in answers), \
        answers
    # The broker is back: so are compactions.
    wait_for(lambda: readyz(daemon) == (200, {"status": "ready", "compactions": True, "reads": True,
                                              "problems": []}), 120, "/readyz to say ready again", daemon)
    wait_for(lambda: httpx.get(f"{daemon.url}/v1/topics", timeout=30).status_code == 200, 180,
             "GET /v1/topics to answer again", daemon)
