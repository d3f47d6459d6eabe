"""The Kafka listener (kafkaListeners) read by clients no one here wrote, against the real daemon and the test
broker: librdkafka (confluent-kafka) reads a compacted topic from offset 0 through the listener, the compacted
view record for record (as GET /compacted pages it), then, in the same read, the records produced after the
compaction, relayed from the broker; a consumer group reads the view and commits its offsets on the broker; a
produce through the listener is refused and the topic unchanged; a topic the daemon does not compact is unknown;
a malformed or oversized frame closes its own connection only; /metrics counts what the listener served; a
compaction that switches the ledger during a read yields each key once (the read stays on its ledger until it
passes the horizon, and goes on with the new one once the old one's grace is over); the broker down during a
tail read answers the relayed fetches with the leader's unavailability while ledger fetches go on, and the
read recovers, on the same connection, once it is back; a topic deleted and created again is read from its live
log, not from the old topic's ledger. The broker-down test runs last (the tests' own clients lose their
connections to the broker with it).

The module's broker is a Tansu of its own that advertises a TCP relay (``TcpProxy``): every connection to it,
the daemon's and the tests' own, passes the relay, which a test stops (the broker down) and starts again.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from kafka import KafkaAdminClient
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.record.memory_records import MemoryRecords

from compactord.embedded import dies_with, free_port, tansu_binary
from compactord.listener.protocol import ERRORS, item
from tests.conftest import Kafka
from tests.support.daemon import DaemonProcess, compact, metric
from tests.support.fault_proxy import TcpProxy
from tests.support.listener import compacted_view, poll
from tests.support.timeouts import STOP_TIMEOUT_S, TASK_TIMEOUT_S
from tests.support.waiting import wait_for

from .conftest import Launcher

PREFIX = "lsn"
PATTERN = f"{PREFIX}-[0-9]+-[0-9a-f]{{6}}"


# A replaced ledger stays readable this long after a switch: longer than a pinned read in these tests takes,
# short enough for the test of a read that falls behind it to wait it out.
GRACE_S = 20


class ProxiedBroker:
    """A Tansu broker that advertises a ``TcpProxy``'s port: ``stop_proxy()`` takes the broker away from every
    client (connections refused), ``start_proxy()`` brings it back on the same port."""

    def __init__(self, workdir: Path) -> None:
        self.broker_port = free_port()
        self.proxy = TcpProxy(self.broker_port)
        self.port = self.proxy.port
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._log = open(workdir / "tansu.log", "ab")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [str(tansu_binary()), "broker", "--listener-url", f"tcp://127.0.0.1:{self.broker_port}",
             "--advertised-listener-url", f"tcp://127.0.0.1:{self.port}"],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=dies_with(os.getpid()))  # noqa: PLW1509 - prctl and getppid only: safe after fork
        wait_for(self._listening, 30, "the proxied broker to listen")

    def _listening(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.broker_port), 0.5):
            return True
        return False

    def stop_proxy(self) -> None:
        self.proxy.stop()

    def start_proxy(self) -> None:
        self.proxy = TcpProxy(self.broker_port, port=self.port)

    def close(self) -> None:
        self.proxy.stop()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(STOP_TIMEOUT_S)
        self._log.close()


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxiedBroker]:
    broker = ProxiedBroker(tmp_path_factory.mktemp("listener-broker"))
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="module")
def kafka(proxied: ProxiedBroker) -> Iterator[Kafka]:
    """The topic and produce helpers, on the module's broker (through its relay)."""
    own = Kafka(proxied.bootstrap, admin=KafkaAdminClient(bootstrap_servers=proxied.bootstrap))
    try:
        yield own
    finally:
        own.close()


@pytest.fixture(scope="module")
def daemon(proxied: ProxiedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    launcher = Launcher(proxied, tmp_path_factory.mktemp("listener-daemons"))  # type: ignore[arg-type]
    port = free_port()
    try:
        started = launcher("listener", compactionTopicsPattern=PATTERN,
                           kafkaListeners=f"PLAINTEXT://127.0.0.1:{port}",
                           compactionRetiredLedgerGraceSeconds=GRACE_S)
        started.kafka_port = port  # type: ignore[attr-defined]  # the listener's port, for the tests below
        yield started
    finally:
        launcher.stop_all()


def _bootstrap(daemon: DaemonProcess) -> str:
    return f"127.0.0.1:{daemon.kafka_port}"  # type: ignore[attr-defined]


@pytest.fixture
def consumer(daemon: DaemonProcess) -> Iterator[Consumer]:
    consumer = Consumer({"bootstrap.servers": _bootstrap(daemon), "group.id": "listener-test-unused",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "auto.offset.reset": "error", "topic.metadata.refresh.interval.ms": 1000})
    try:
        yield consumer
    finally:
        consumer.close()


def _read_to_end(consumer: Consumer, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    """Every record from offset 0 to the end of partition 0 (librdkafka's end-of-partition event)."""
    consumer.assign([TopicPartition(topic, 0, 0)])
    return poll(consumer)


def test_a_consumer_reads_the_compacted_view_then_the_live_log_in_one_read(daemon: DaemonProcess, kafka: Any,
                                                                         consumer: Consumer) -> None:
    topic = kafka.topic(prefix=PREFIX)
    # The last record below the horizon has no key: the ledger drops it, and an empty batch carries the consumer
    # from the last entry the ledger keeps past the horizon.
    records = [(f"k{i % 5}", f"v{i}") for i in range(20)] + [("k1", None), ("k7", ""), (None, "no key")]
    kafka.produce(topic, records)
    compact(daemon, topic)
    view = compacted_view(daemon, topic, markers=True, page=7)
    assert view and len(view) < len(records) and view[-1][0] < len(records) - 1  # compacted, its end a gap
    kafka.produce(topic, [("k0", "after-0"), ("k9", "after-1")])

    read = _read_to_end(consumer, topic)

    assert read[:len(view)] == view
    assert read[len(view):] == [(23, b"k0", b"after-0"), (24, b"k9", b"after-1")]


def _group_consumer(daemon: DaemonProcess, group: str) -> Consumer:
    return Consumer({"bootstrap.servers": _bootstrap(daemon), "group.id": group, "enable.auto.commit": False,
                     "enable.partition.eof": True, "auto.offset.reset": "earliest",
                     "topic.metadata.refresh.interval.ms": 1000})


def test_a_consumer_group_reads_the_view_and_commits_its_offsets_on_the_broker(daemon: DaemonProcess,
                                                                              kafka: Any) -> None:
    topic = kafka.topic(prefix=PREFIX)
    kafka.produce(topic, [(f"k{i % 3}", f"v{i}") for i in range(10)])
    compact(daemon, topic)
    view = compacted_view(daemon, topic, markers=True, page=7)
    group = f"{topic}-group"
    first = _group_consumer(daemon, group)
    try:
        first.subscribe([topic])
        read = poll(first)
        first.commit(asynchronous=False)
    finally:
        first.close()  # leaves the group (LeaveGroup, relayed)

    assert read == view
    committed = kafka.admin.list_group_offsets(group)[group]  # the broker's own, not the listener's
    assert {(tp.topic, tp.partition): meta.offset for tp, meta in committed.items()} == {(topic, 0): view[-1][0] + 1}

    # The group's next member starts where the first committed (OffsetFetch, relayed): at the live record.
    kafka.produce(topic, [("k9", "after")])
    second = _group_consumer(daemon, group)
    try:
        second.subscribe([topic])
        assert poll(second) == [(10, b"k9", b"after")]
    finally:
        second.close()


def test_the_listener_s_metrics_count_a_read_from_the_ledger_and_the_broker(daemon: DaemonProcess, kafka: Any,
                                                                          consumer: Consumer) -> None:
    topic = kafka.topic(prefix=PREFIX)
    kafka.produce(topic, [("a", "1"), ("a", "2")])
    compact(daemon, topic)
    kafka.produce(topic, [("b", "3")])
    before = {source: metric(daemon, "compactord_listener_bytes_total", source=source) or 0.0
              for source in ("ledger", "relay")}
    fetches = metric(daemon, "compactord_listener_requests_total", api="Fetch", error="NONE") or 0.0

    assert _read_to_end(consumer, topic) == [(1, b"a", b"2"), (2, b"b", b"3")]

    for source in ("ledger", "relay"):
        assert (metric(daemon, "compactord_listener_bytes_total", source=source) or 0.0) > before[source], source
    assert (metric(daemon, "compactord_listener_requests_total", api="Fetch", error="NONE") or 0.0) > fetches
    assert (metric(daemon, "compactord_listener_fetch_seconds_count") or 0.0) > 0
    assert (metric(daemon, "compactord_listener_connections") or 0.0) >= 1  # the consumer's, still open


def test_a_produce_through_the_listener_is_refused_and_the_topic_unchanged(daemon: DaemonProcess, kafka: Any,
                                                                         consumer: Consumer) -> None:
    topic = kafka.topic(prefix=PREFIX)
    kafka.produce(topic, [("a", "1"), ("b", "2")])
    compact(daemon, topic)
    before = kafka_watermarks(kafka, topic)
    reports: list[Any] = []
    producer = Producer({"bootstrap.servers": _bootstrap(daemon), "message.timeout.ms": 30000, "retries": 0})
    producer.produce(topic, key=b"c", value=b"3", on_delivery=lambda err, _msg: reports.append(err))
    producer.flush(60)

    assert len(reports) == 1 and reports[0] is not None
    assert reports[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, reports[0]
    assert kafka_watermarks(kafka, topic) == before
    assert _read_to_end(consumer, topic) == [(0, b"a", b"1"), (1, b"b", b"2")]


def kafka_watermarks(kafka: Any, topic: str) -> tuple[int, int]:
    """The broker's own low and high watermarks of partition 0 (not the listener's)."""
    own = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "listener-test-broker"})
    try:
        low, high = own.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        return low, high
    finally:
        own.close()


def test_a_topic_the_daemon_does_not_compact_is_unknown(daemon: DaemonProcess, kafka: Any,
                                                       consumer: Consumer) -> None:
    other = kafka.topic(prefix="nolsn")  # on the broker, not admitted by compactionTopicsPattern
    for topic in (other, f"{PREFIX}-0-absent"):
        metadata = consumer.list_topics(topic, timeout=30)
        assert metadata.topics[topic].error is not None
        assert metadata.topics[topic].error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    compacted = kafka.topic(prefix=PREFIX)
    listed = consumer.list_topics(timeout=30).topics
    assert compacted in listed and other not in listed
    assert [p.leader for p in listed[compacted].partitions.values()] == [0]


# A Fetch v12 whose body is no Fetch; a size past the bound; a frame shorter than a request header.
FETCH_HEADER = struct.pack(">hhih", 1, 12, 1, -1)
MALFORMED = [struct.pack(">i", len(FETCH_HEADER) + 6) + FETCH_HEADER + b"\xff" * 6, struct.pack(">i", 2**30),
             struct.pack(">i", 4) + b"\xff" * 4]


@pytest.mark.parametrize("frame", MALFORMED, ids=["garbage", "oversized", "short"])
def test_a_malformed_frame_closes_its_connection_only(daemon: DaemonProcess, kafka: Any, consumer: Consumer,
                                                      frame: bytes) -> None:
    topic = kafka.topic(prefix=PREFIX)
    kafka.produce(topic, [("a", "1")])
    consumer.assign([TopicPartition(topic, 0, 0)])  # a connection of its own, open before and after
    with socket.create_connection(("127.0.0.1", daemon.kafka_port), timeout=30) as raw:  # type: ignore[attr-defined]
        raw.sendall(frame)
        assert raw.recv(1024) == b""  # closed by the listener, without an answer
    assert _read_to_end(consumer, topic) == [(0, b"a", b"1")]
    assert "Kafka listener: connection from" in daemon.log_text()


def _horizon(daemon: DaemonProcess, topic: str) -> dict[str, Any]:
    response = daemon.http.get(f"/v1/topics/{topic}/horizon")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _slow_consumer(daemon: DaemonProcess, **extra: Any) -> Consumer:
    """A consumer whose read of a view takes many fetches: a few KB each, with little read ahead."""
    return Consumer({"bootstrap.servers": _bootstrap(daemon), "group.id": "listener-test-unused",
                     "enable.auto.commit": False, "enable.partition.eof": True, "auto.offset.reset": "error",
                     "fetch.max.bytes": 4096, "max.partition.fetch.bytes": 4096, "message.max.bytes": 4096,
                     "queued.min.messages": 1, "queued.max.messages.kbytes": 4,
                     "fetch.queue.backoff.ms": 10, **extra})  # the next fetch as soon as the queue has room


KEYS = 2000
PAD = "x" * 100


def _switching_topic(daemon: DaemonProcess, kafka: Any) -> tuple[str, list[tuple[int, bytes | None, bytes | None]]]:
    """A topic of ``KEYS`` keys each written twice, compacted: its name and its view."""
    topic = kafka.topic(prefix=PREFIX)
    kafka.produce(topic, [(f"k{i % KEYS:05d}", f"v{i}-{PAD}") for i in range(2 * KEYS)])
    compact(daemon, topic)
    view = compacted_view(daemon, topic, markers=True, page=7)
    assert len(view) == KEYS
    return topic, view


def _switch(daemon: DaemonProcess, topic: str, ledger_id: int) -> None:
    """A compaction of ``topic``, waited for until it replaces ledger ``ledger_id`` (the read goes on at once,
    well within the replaced ledger's grace, however long the task's end takes)."""
    response = daemon.http.put(f"/v1/topics/{topic}/compaction")
    assert response.status_code == 202, response.text
    wait_for(lambda: _horizon(daemon, topic)["ledger_id"] != ledger_id, TASK_TIMEOUT_S, "the switch", daemon)


def test_a_switch_during_a_read_yields_each_key_once(daemon: DaemonProcess, kafka: Any) -> None:
    topic, view = _switching_topic(daemon, kafka)
    first = _horizon(daemon, topic)
    # Written after the first ledger: a new value of each of its last keys, which the next ledger keeps instead
    # of the first ledger's (a read that went on in the new ledger would miss those keys' first values).
    updated = [key for _, key, _ in view[-100:]]
    kafka.produce(topic, [(key, f"new-{PAD}") for key in updated])
    consumer = _slow_consumer(daemon)
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        read = poll(consumer, 200)
        _switch(daemon, topic, first["ledger_id"])  # while the read is a tenth of the way through the view
        read += poll(consumer, 10**9)
    finally:
        consumer.close()

    below = [r for r in read if r[0] < 2 * KEYS]  # at or below the first ledger's horizon
    assert below == view  # the first ledger's, whole: each key once
    assert [(k, v) for _, k, v in read[len(view):]] == [(k, f"new-{PAD}".encode()) for k in updated]


def test_a_read_that_falls_behind_the_grace_goes_on_with_the_new_ledger(daemon: DaemonProcess,
                                                                          kafka: Any) -> None:
    topic, view = _switching_topic(daemon, kafka)
    first = _horizon(daemon, topic)["ledger_id"]
    kafka.produce(topic, [("late", f"after-{PAD}")])
    consumer = _slow_consumer(daemon)
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        read = poll(consumer, 200)
        consumer.pause([TopicPartition(topic, 0)])
        compact(daemon, topic)
        wait_for(lambda: daemon.http.get(f"/v1/topics/{topic}/horizon", params={"ledger_id": first}).status_code
                 == 410, GRACE_S + TASK_TIMEOUT_S, "the replaced ledger's grace to end", daemon)
        consumer.resume([TopicPartition(topic, 0, read[-1][0] + 1)])
        read += poll(consumer, 10**9)
    finally:
        consumer.close()

    offsets = [offset for offset, _, _ in read]
    assert offsets == sorted(set(offsets))  # on, never back: nothing twice
    assert read[-1][1:] == (b"late", f"after-{PAD}".encode())
    assert {key for _, key, _ in read} == {key for _, key, _ in view} | {b"late"}


def test_a_recreated_topic_is_read_from_its_live_log(daemon: DaemonProcess, kafka: Any,
                                                    consumer: Consumer) -> None:
    topic = kafka.topic(prefix=PREFIX)
    kafka.produce(topic, [(f"old{i % 3}", f"v{i}") for i in range(9)])
    compact(daemon, topic)
    assert len(compacted_view(daemon, topic, markers=True, page=7)) == 3
    kafka.recreate(topic)
    kafka.produce(topic, [("new", "w0"), ("new", "w1")])
    # The broker's answer to the identity check may be up to a second old (as for the HTTP API's reads).
    wait_for(lambda: daemon.http.get(f"/v1/topics/{topic}/horizon").status_code == 410, 30,
             "the daemon to see the topic recreated", daemon)

    assert _read_to_end(consumer, topic) == [(0, b"new", b"w0"), (1, b"new", b"w1")]
    assert "is served from its live log, not from ledger" in daemon.log_text()


def _fetch_frame(topic: str, offset: int, max_wait_ms: int = 0, min_bytes: int = 0) -> bytes:
    """One Fetch (v4, kafka-python's protocol classes) of partition 0 at ``offset``, framed."""
    request = FetchRequest(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=1 << 20,
                           isolation_level=0, topics=[item(FetchRequest, "topics", topic=topic, partitions=[
                               item(FetchRequest, "topics.partitions", partition=0, fetch_offset=offset,
                                    partition_max_bytes=1 << 20)])])
    request.with_header(correlation_id=1, client_id="listener-test")
    return request.encode(version=4, header=True, framed=True)


def _raw_fetch(daemon: DaemonProcess, topic: str, offset: int, max_wait_ms: int = 0, min_bytes: int = 0) -> Any:
    """Partition 0's answer to one Fetch sent to the listener."""
    with socket.create_connection(("127.0.0.1", daemon.kafka_port), timeout=60) as raw:  # type: ignore[attr-defined]
        raw.sendall(_fetch_frame(topic, offset, max_wait_ms, min_bytes))
        with raw.makefile("rb") as stream:
            (size,) = struct.unpack(">i", stream.read(4))
            answer = FetchResponse.decode(stream.read(size), version=4, header=True)
    ((partition,),) = [t.partitions for t in answer.responses]
    return partition


def test_a_fetch_the_broker_holds_for_one_client_holds_no_other_client_s(daemon: DaemonProcess, kafka: Any) -> None:
    topic = kafka.topic(prefix=PREFIX)
    kafka.produce(topic, [("a", "1"), ("a", "2"), ("b", "3")])
    compact(daemon, topic)
    kafka.produce(topic, [("c", "4")])
    # A client at the end of the log: the broker holds its fetch (relayed) until a record comes or its wait
    # ends, just short of the daemon's timeout of a broker request (30 s).
    tailing = socket.create_connection(("127.0.0.1", daemon.kafka_port), timeout=60)  # type: ignore[attr-defined]
    try:
        tailing.sendall(_fetch_frame(topic, 4, max_wait_ms=25_000, min_bytes=1))
        # Meanwhile other clients are answered: the view from the ledger, with the live log after it, and a
        # fetch past the horizon that the broker answers at once.
        from_ledger = _raw_fetch(daemon, topic, 0)
        relayed = _raw_fetch(daemon, topic, 3, max_wait_ms=25_000, min_bytes=1)  # a record there: at once
        assert select.select([tailing], [], [], 0)[0] == []  # the tailing client's answer has not come yet
    finally:
        tailing.close()
    assert from_ledger.error_code == 0 and relayed.error_code == 0
    assert _records(from_ledger.records) == [(1, b"2"), (2, b"3"), (3, b"4")]
    assert _records(relayed.records) == [(3, b"4")]


def _records(data: bytes) -> list[tuple[int, bytes | None]]:
    """(offset, value) of each record of ``data``'s batches."""
    batches, found = MemoryRecords(data), []
    while (batch := batches.next_batch()) is not None:
        found += [(r.offset, r.value) for r in batch]
    return found


def _disconnects(stats: list[dict[str, Any]], port: int) -> int:
    """The disconnects librdkafka last reported from the listener's address."""
    return sum(b["disconnects"] for b in stats[-1]["brokers"].values() if b["name"].startswith(f"127.0.0.1:{port}/"))


def test_the_broker_down_during_a_tail_read_recovers(daemon: DaemonProcess, kafka: Any,
                                                     proxied: ProxiedBroker) -> None:
    tailed, compacted = kafka.topic(prefix=PREFIX), kafka.topic(prefix=PREFIX)
    kafka.produce(tailed, [("a", "1"), ("a", "2")])
    kafka.produce(compacted, [(f"k{i % 3}", f"v{i}") for i in range(9)])
    for topic in (tailed, compacted):
        compact(daemon, topic)
    view = compacted_view(daemon, compacted, markers=True, page=7)
    stats: list[dict[str, Any]] = []
    consumer = Consumer({"bootstrap.servers": _bootstrap(daemon), "group.id": "listener-test-unused",
                         "enable.auto.commit": False, "enable.partition.eof": True, "auto.offset.reset": "error",
                         "statistics.interval.ms": 500, "stats_cb": lambda text: stats.append(json.loads(text))})
    producer = Producer({"bootstrap.servers": proxied.bootstrap, "message.timeout.ms": int(TASK_TIMEOUT_S * 1000)})
    try:
        consumer.assign([TopicPartition(tailed, 0, 0)])
        assert poll(consumer) == [(1, b"a", b"2")]
        consumer.list_topics(compacted, timeout=30)  # its partitions, as the listener knows them
        proxied.stop_proxy()
        try:
            for _ in range(3):  # the broker down for the daemon too: past its horizon, the leader is unavailable
                assert _raw_fetch(daemon, tailed, 2).error_code in {ERRORS["LEADER_NOT_AVAILABLE"],
                                                                    ERRORS["NOT_LEADER_OR_FOLLOWER"]}
            assert _raw_fetch(daemon, compacted, 0).error_code == 0
            consumer.incremental_assign([TopicPartition(compacted, 0, 0)])  # a ledger read goes on meanwhile
            read = [poll(consumer, 1)[0] for _ in view]
            assert sorted(read) == view
            producer.produce(tailed, key=b"b", value=b"3")  # waits in the producer until the broker is back
            producer.poll(0)
        finally:
            proxied.start_proxy()
        assert producer.flush(TASK_TIMEOUT_S) == 0
        consumer.incremental_unassign([TopicPartition(compacted, 0)])
        assert poll(consumer, 1) == [(2, b"b", b"3")]
        wait_for(lambda: len(stats) >= 2, 30, "librdkafka's statistics")
    finally:
        consumer.close()
    assert _disconnects(stats, daemon.kafka_port) == 0  # type: ignore[attr-defined]
    log = daemon.log_text()
    assert log.count("the broker does not answer") == 1, log[-3000:]
    assert "Traceback" not in log
