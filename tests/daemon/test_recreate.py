"""A topic deleted and recreated on the broker (Apache Kafka calls no hook), against the real daemon and a
real test broker, with the monitor's pass an hour away: every read path checks the topic's identity
against what the broker says of it (at most a second old) and answers 410 ``topic_recreated`` from the
first read, and ``CompactedReader`` raises ``TopicRecreated``; a broker that stops answering does not
fail the reads (the last answer is used, and the response says so).

The broker is not the session's (``isolated_broker``, shared with test_probes.py, which runs before), so
that stopping it stops no other test; it is stopped in teardown, also when a test fails. The broker-down
test runs last.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kafka import KafkaAdminClient

from compactord.compacted_reader import CompactedReader
from compactord.embedded import EmbeddedBroker
from compactord.errors import TopicRecreated
from tests.conftest import Kafka
from tests.support.daemon import DaemonProcess, compact
from tests.support.waiting import wait_for

from .conftest import assert_error

pytestmark = pytest.mark.slow

CHECKED_AT = "Compactord-Identity-Checked-At"


@pytest.fixture(scope="module")
def own_broker(isolated_broker: EmbeddedBroker) -> EmbeddedBroker:
    return isolated_broker


@pytest.fixture(scope="module")
def own_kafka(own_broker: EmbeddedBroker) -> Iterator[Kafka]:
    kafka = Kafka(own_broker.bootstrap, admin=KafkaAdminClient(bootstrap_servers=own_broker.bootstrap))
    try:
        yield kafka
    finally:
        kafka.close()


@pytest.fixture(scope="module")
def daemon(isolated_daemon: DaemonProcess) -> DaemonProcess:
    """The monitor's pass an hour away: whatever answers 410 here is the reads' own check."""
    return isolated_daemon


def _page(daemon: DaemonProcess, topic: str) -> Any:
    return daemon.http.get(f"/v1/topics/{topic}/compacted", params={"partition": 0, "limit": 10000})


def _reads(daemon: DaemonProcess, topic: str) -> dict[str, Any]:
    """Every read path of the daemon, answered."""
    return {
        "horizon": daemon.http.get(f"/v1/topics/{topic}/horizon"),
        "page": _page(daemon, topic),
        "last": daemon.http.get(f"/v1/topics/{topic}/compacted/last", params={"partition": 0}),
        "preview": daemon.http.get(f"/v1/topics/{topic}/compaction/preview"),
    }


def test_a_recreated_topic_answers_410_on_every_read_path_before_the_monitor_s_pass(
        daemon: DaemonProcess, own_kafka: Kafka, own_broker: EmbeddedBroker) -> None:
    topic = own_kafka.topic(prefix="recreate")
    own_kafka.produce(topic, [(f"old{i}", f"v{i}") for i in range(100)])
    compact(daemon, topic)
    assert len(_page(daemon, topic).json()["entries"]) == 100
    old_id = daemon.http.get(f"/v1/topics/{topic}/horizon").json().get("topic_id")

    own_kafka.recreate(topic)
    own_kafka.produce(topic, [(f"new{i}", f"w{i}") for i in range(10)])
    # The answer of the last read may be up to a second old: the next ones see the new topic.
    gone = wait_for(lambda: (r := daemon.http.get(f"/v1/topics/{topic}/horizon")).status_code == 410 and r,
                    30, "the horizon of the recreated topic to answer 410", daemon)
    body = assert_error(gone, 410, "topic_recreated")
    assert "PUT .../compaction" in body["message"] and f"DELETE /v1/topics/{topic}" in body["message"], body
    for path, response in _reads(daemon, topic).items():
        assert response.status_code == 410, f"{path}: {response.status_code} {response.text}"
        assert_error(response, 410, "topic_recreated")
    with pytest.raises(TopicRecreated):
        list(CompactedReader(own_broker.bootstrap, topic, url=daemon.url))
    # (The listing's backlog of a recreated topic, the whole new log, is the monitor pass's: test_monitor.py.)
    assert "compacting topic" not in daemon.log_text()  # the monitor has not run: the reads saw it

    compact(daemon, topic)  # the rebuild from the new log is served again
    entries = _page(daemon, topic).json()["entries"]
    assert {base64.b64decode(e["key"]).decode() for e in entries} == {f"new{i}" for i in range(10)}
    # The identity of the log the ledger was made of, which CompactedReader checks its tail against.
    horizon = daemon.http.get(f"/v1/topics/{topic}/horizon").json()
    assert horizon["log_start"] == {"0": 0}
    assert horizon["topic_id"] is not None and horizon["topic_id"] != old_id  # the test broker reports ids


def test_a_broker_that_stops_answering_does_not_fail_the_reads(
        daemon: DaemonProcess, own_kafka: Kafka, own_broker: EmbeddedBroker) -> None:
    """Last in the module: it stops the module's broker."""
    topic = own_kafka.topic(prefix="down")
    own_kafka.produce(topic, [(f"k{i}", f"v{i}") for i in range(5)])
    compact(daemon, topic)
    fresh = _page(daemon, topic)
    assert fresh.status_code == 200 and CHECKED_AT not in fresh.headers  # checked against a fresh answer

    own_broker.stop()
    wait_for(lambda: "the broker does not answer" in daemon.http.get("/readyz").json()["problems"], 60,
             "the daemon to see its broker gone", daemon, interval=0.2)
    def served(path: str) -> httpx.Response:
        response = daemon.http.get(f"/v1/topics/{topic}/{path}", params={"partition": 0})
        assert response.status_code == 200, f"{path}: {response.status_code} {response.text}"  # never failed
        return response

    for path in ("horizon", "compacted", "compacted/last"):
        # An answer younger than a second is still fresh; once it is not, the read says how old it is.
        response = wait_for(lambda path=path: (r := served(path)).headers.get(CHECKED_AT) and r, 30,
                            f"{path} to answer from the last identity the broker gave", daemon)
        # the last answer the daemon had, with its time
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", response.headers[CHECKED_AT]), \
            (path, dict(response.headers))
    assert len(_page(daemon, topic).json()["entries"]) == 5
