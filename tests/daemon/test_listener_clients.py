"""The Kafka listener (kafkaListeners) read by clients no one here wrote, each as its users run it, against the
real daemon and the test broker: Debian's kcat (librdkafka 2.0.2), KafkaJS in a consumer group, kafka-python and
aiokafka. Each reads one compacted topic from its beginning to its end in one read: the compacted view record for
record (as GET /compacted pages it), then the records produced after the compaction, relayed from the broker.

The clients negotiate different versions of the protocol: kcat ApiVersions v3, Metadata v4, ListOffsets v2, Fetch
v11; KafkaJS its own group protocol with the coordinator; kafka-python the flexible versions (ApiVersions v4,
Metadata v12, ListOffsets v7, Fetch v12); aiokafka the older ones (ApiVersions v0, Metadata v5, ListOffsets v3,
Fetch v11).

The topic's view holds a record with no key (``topicCompactionRetainNullKey``) and an empty value, and ends in a
gap: its last record below the horizon, a tombstone, is dropped, and the live records after it hold a tombstone
and a record with no key.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaPythonTopicPartition

from compactord.embedded import free_port
from tests.support.daemon import DaemonProcess, compact
from tests.support.listener import compacted_view, decoded
from tests.support.timeouts import TASK_TIMEOUT_S

from .conftest import Launcher

PREFIX = "lcl"
PATTERN = f"{PREFIX}-[0-9]+-[0-9a-f]{{6}}"
KEYS = 20
BEFORE: list[tuple[str | None, str | None]] = [(f"k{i % KEYS}", f"v{i}") for i in range(200)] + [
    (None, "no key"), ("k5", ""), ("k3", None)]
AFTER: list[tuple[str | None, str | None]] = [("k0", "after-0"), ("k7", None), (None, "after, no key"),
                                              ("k99", "after-1")]
END = len(BEFORE) + len(AFTER)  # the topic's end offset: one producer, no transactions, offsets without gaps
KAFKAJS = "kafkajs@2.2.4"
KAFKAJS_SCRIPT = Path(__file__).resolve().parent.parent / "support" / "kafkajs_consume.js"

Record = tuple[int, bytes | None, bytes | None]


@pytest.fixture(scope="module")
def daemon(launch: Launcher) -> DaemonProcess:
    port = free_port()
    # No tombstone retention: a deletion leaves the ledger at once, so the view ends in a gap that the listener's
    # answer must carry a client past (test_listener_deletes.py reads the retained ones).
    started = launch("listener-clients", compactionTopicsPattern=PATTERN, topicCompactionRetainNullKey="true",
                     kafkaListeners=f"PLAINTEXT://127.0.0.1:{port}", compactionTombstoneRetentionMs=0)
    started.kafka_port = port  # type: ignore[attr-defined]  # the listener's port, for the tests below
    return started


def _bootstrap(daemon: DaemonProcess) -> str:
    return f"127.0.0.1:{daemon.kafka_port}"  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Compacted:
    """A topic compacted once, with records produced after: what a read from its beginning to its end gives."""

    topic: str
    view: list[Record]
    expected: list[Record]


@pytest.fixture(scope="module")
def compacted(daemon: DaemonProcess, kafka: Any) -> Compacted:
    topic = kafka.topic(prefix=PREFIX)
    kafka.produce(topic, BEFORE)
    compact(daemon, topic)
    view = compacted_view(daemon, topic, markers=True, page=50)
    assert (None, b"no key") in [(key, value) for _, key, value in view]  # kept in place
    assert view[-1][0] < len(BEFORE) - 1  # the view ends in a gap
    kafka.produce(topic, AFTER)
    after = [(len(BEFORE) + i, _bytes(key), _bytes(value)) for i, (key, value) in enumerate(AFTER)]
    return Compacted(topic, view, view + after)


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


# -- kcat -----------------------------------------------------------------------------------------

# Offset, key length, value length (-1 for null), key, value; the lengths tell a null from an empty field.
KCAT_FORMAT = r"%o\t%K\t%S\t%k\t%s\n"


def _kcat_record(line: bytes) -> Record:
    offset, key_len, value_len, key, value = line.split(b"\t", 4)

    def field(length: bytes, text: bytes) -> bytes | None:
        size = int(length)
        if size <= 0:
            return None if size < 0 else b""
        assert len(text) == size, line
        return text

    return int(offset), field(key_len, key), field(value_len, value)


def test_kcat_reads_the_view_then_the_live_log_to_the_end(daemon: DaemonProcess, compacted: Compacted) -> None:
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed on this machine (Debian: apt-get install kcat)")
    done = subprocess.run([kcat, "-C", "-b", _bootstrap(daemon), "-t", compacted.topic, "-p", "0", "-o", "beginning",
                           "-e", "-Z", "-f", KCAT_FORMAT], capture_output=True, timeout=TASK_TIMEOUT_S, check=False)

    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert [_kcat_record(line) for line in done.stdout.splitlines()] == compacted.expected
    assert f"at offset {END}".encode() in done.stderr  # "Reached end of topic ... at offset END"


# -- KafkaJS --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kafkajs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """KafkaJS installed by npm into a folder of this session: its node_modules."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed on this machine (Debian: apt-get install nodejs npm)")
    prefix = tmp_path_factory.mktemp("kafkajs")
    done = subprocess.run(["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error",
                           KAFKAJS], capture_output=True, timeout=TASK_TIMEOUT_S, check=False, text=True)
    assert done.returncode == 0, f"npm install {KAFKAJS} failed:\n{done.stderr}"
    return prefix / "node_modules"


def test_kafkajs_in_a_group_reads_the_view_and_commits_its_offset_on_the_broker(
        daemon: DaemonProcess, kafka: Any, compacted: Compacted, kafkajs: Path) -> None:
    group = f"{compacted.topic}-kafkajs"
    done = subprocess.run(["node", str(KAFKAJS_SCRIPT), _bootstrap(daemon), compacted.topic, group],
                          capture_output=True, timeout=TASK_TIMEOUT_S, check=False, text=True,
                          env={**os.environ, "NODE_PATH": str(kafkajs)})

    assert done.returncode == 0, done.stderr
    read = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["offset"], decoded(r["key"]), decoded(r["value"])) for r in read] == compacted.expected
    committed, end = _on_the_broker(kafka, compacted.topic, group)
    assert committed == end == END


def _on_the_broker(kafka: Any, topic: str, group: str) -> tuple[int, int]:
    """The broker's own (not the listener's) committed offset of ``group`` on partition 0 and the partition's end:
    the high watermark of a fetch (the test broker's ListOffsets answers the last batch's base offset + 1)."""
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group, "enable.auto.commit": False,
                         "enable.partition.eof": True})
    try:
        [committed] = consumer.committed([TopicPartition(topic, 0)], timeout=30)
        consumer.assign([TopicPartition(topic, 0, END - 1)])
        for _ in range(int(TASK_TIMEOUT_S)):  # each poll waits up to a second
            message = consumer.poll(1.0)
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                return committed.offset, message.offset()
            if error is not None:
                raise KafkaException(error)
        raise AssertionError(f"no end of partition on the broker within {TASK_TIMEOUT_S} s")
    finally:
        consumer.close()


# -- kafka-python and aiokafka --------------------------------------------------------------------

def test_kafka_python_reads_the_view_then_the_live_log_to_the_end(daemon: DaemonProcess,
                                                                 compacted: Compacted) -> None:
    consumer = KafkaConsumer(bootstrap_servers=_bootstrap(daemon), enable_auto_commit=False)
    try:
        partition = KafkaPythonTopicPartition(compacted.topic, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        assert consumer.position(partition) == compacted.view[0][0]  # earliest: the ledger's first offset
        read: list[Record] = []
        for _ in range(int(TASK_TIMEOUT_S)):  # each poll waits up to a second
            if consumer.position(partition) >= END:
                break
            for records in consumer.poll(timeout_ms=1000).values():
                read += [(r.offset, r.key, r.value) for r in records]
    finally:
        consumer.close()

    assert read == compacted.expected


def test_aiokafka_reads_the_view_then_the_live_log_to_the_end(daemon: DaemonProcess,
                                                             compacted: Compacted) -> None:
    async def read_to_end() -> list[Record]:
        consumer = AIOKafkaConsumer(bootstrap_servers=_bootstrap(daemon), enable_auto_commit=False)
        await consumer.start()
        try:
            partition = AioTopicPartition(compacted.topic, 0)
            consumer.assign([partition])
            await consumer.seek_to_beginning(partition)
            assert await consumer.position(partition) == compacted.view[0][0]
            read: list[Record] = []
            for _ in range(int(TASK_TIMEOUT_S)):  # each getmany waits up to a second
                if await consumer.position(partition) >= END:
                    break
                for records in (await consumer.getmany(partition, timeout_ms=1000)).values():
                    read += [(r.offset, r.key, r.value) for r in records]
            return read
        finally:
            await consumer.stop()

    assert asyncio.run(read_to_end()) == compacted.expected
