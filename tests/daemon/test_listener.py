"""The Kafka listener (kafkaListeners) read by clients no one here wrote, against the real daemon and the test
broker: librdkafka (confluent-kafka) reads a compacted topic from offset 0 through the listener, the compacted
view record for record (as GET /compacted pages it), then, in the same read, the records produced after the
compaction, relayed from the broker; a consumer group reads the view and commits its offsets on the broker; a
produce through the listener is refused and the topic unchanged; a topic the daemon does not compact is unknown;
a malformed or oversized frame closes its own connection only; /metrics counts what the listener served.
"""

from __future__ import annotations

import base64
import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from compactord.embedded import free_port
from tests.support.daemon import DaemonProcess, compact
from tests.support.timeouts import TASK_TIMEOUT_S

from .conftest import Launcher, metric

PREFIX = "lsn"
PATTERN = f"{PREFIX}-[0-9]+-[0-9a-f]{{6}}"


@pytest.fixture(scope="module")
def daemon(launch: Launcher) -> DaemonProcess:
    port = free_port()
    started = launch("listener", compactionTopicsPattern=PATTERN, kafkaListeners=f"PLAINTEXT://127.0.0.1:{port}")
    started.kafka_port = port  # type: ignore[attr-defined]  # the listener's port, for the tests below
    return started


def _bootstrap(daemon: DaemonProcess) -> str:
    return f"127.0.0.1:{daemon.kafka_port}"  # type: ignore[attr-defined]


def _model(daemon: DaemonProcess, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    """The compacted view of partition 0 as the HTTP API pages it, with the deletion markers the listener serves as
    tombstones: (offset, key, value) in order."""
    entries: list[tuple[int, bytes | None, bytes | None]] = []
    start: int | None = 0
    while start is not None:
        response = daemon.http.get(f"/v1/topics/{topic}/compacted", params={"partition": 0, "start": start,
                                                                           "limit": 7, "include_markers": "true"})
        assert response.status_code == 200, response.text
        body = response.json()
        entries += [(e["offset"], _decoded(e["key"]), _decoded(e["value"])) for e in body["entries"]]
        start = body["next_start"]
    return entries


def _decoded(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


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
    return _poll_to_end(consumer)


def test_a_consumer_reads_the_compacted_view_then_the_live_log_in_one_read(daemon: DaemonProcess, kafka: Any,
                                                                         consumer: Consumer) -> None:
    topic = kafka.topic(prefix=PREFIX)
    # The last record below the horizon has no key: the ledger drops it, and an empty batch carries the consumer
    # from the last entry the ledger keeps past the horizon.
    records = [(f"k{i % 5}", f"v{i}") for i in range(20)] + [("k1", None), ("k7", ""), (None, "no key")]
    kafka.produce(topic, records)
    compact(daemon, topic)
    view = _model(daemon, topic)
    assert view and len(view) < len(records) and view[-1][0] < len(records) - 1  # compacted, its end a gap
    kafka.produce(topic, [("k0", "after-0"), ("k9", "after-1")])

    read = _read_to_end(consumer, topic)

    assert read[:len(view)] == view
    assert read[len(view):] == [(23, b"k0", b"after-0"), (24, b"k9", b"after-1")]


def _group_consumer(daemon: DaemonProcess, group: str) -> Consumer:
    return Consumer({"bootstrap.servers": _bootstrap(daemon), "group.id": group, "enable.auto.commit": False,
                     "enable.partition.eof": True, "auto.offset.reset": "earliest",
                     "topic.metadata.refresh.interval.ms": 1000})


def _poll_to_end(consumer: Consumer) -> list[tuple[int, bytes | None, bytes | None]]:
    """What a subscribed consumer reads until the end of its one partition."""
    read: list[tuple[int, bytes | None, bytes | None]] = []
    for _ in range(int(TASK_TIMEOUT_S)):  # each poll waits up to a second
        message = consumer.poll(1.0)
        if message is None:
            continue
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                return read
            raise KafkaException(error)
        read.append((message.offset(), message.key(), message.value()))
    raise AssertionError(f"no end of partition reached within {TASK_TIMEOUT_S} s; read {read}")


def test_a_consumer_group_reads_the_view_and_commits_its_offsets_on_the_broker(daemon: DaemonProcess,
                                                                              kafka: Any) -> None:
    topic = kafka.topic(prefix=PREFIX)
    kafka.produce(topic, [(f"k{i % 3}", f"v{i}") for i in range(10)])
    compact(daemon, topic)
    view = _model(daemon, topic)
    group = f"{topic}-group"
    first = _group_consumer(daemon, group)
    try:
        first.subscribe([topic])
        read = _poll_to_end(first)
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
        assert _poll_to_end(second) == [(10, b"k9", b"after")]
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
