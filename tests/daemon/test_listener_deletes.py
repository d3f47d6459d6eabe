"""Deletes reach a consumer that reads through the Kafka listener (kafkaListeners) below the horizon: a consumer
(librdkafka, confluent-kafka) reads part of one ledger, a key it read is deleted and a compaction switches to the
next ledger; going on from where it was, it reads that ledger, in which the deletion is a marker kept for
``compactionTombstoneRetentionMs``, served as a tombstone (the key, a null value, the tombstone's offset), so its
state ends where the view's does. Under publishing-order and under event-time, each topic's strategy a policy.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from compactord.embedded import free_port
from tests.support.daemon import DaemonProcess, compact
from tests.support.listener import compacted_view, poll

from .conftest import Launcher

PREFIX = "lsd"
PATTERN = f"{PREFIX}-[0-9]+-[0-9a-f]{{6}}"

Read = tuple[int, bytes | None, bytes | None]


@pytest.fixture(scope="module")
def daemon(launch: Launcher) -> DaemonProcess:
    port = free_port()
    started = launch("listener-deletes", compactionTopicsPattern=PATTERN,
                     kafkaListeners=f"PLAINTEXT://127.0.0.1:{port}")
    started.kafka_port = port  # type: ignore[attr-defined]  # the listener's port, for the tests below
    return started


@pytest.fixture
def consumer(daemon: DaemonProcess) -> Iterator[Consumer]:
    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{daemon.kafka_port}",  # type: ignore[attr-defined]
                         "group.id": "listener-deletes-unused", "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "error",
                         "topic.metadata.refresh.interval.ms": 1000})
    try:
        yield consumer
    finally:
        consumer.close()


def _view(daemon: DaemonProcess, topic: str) -> dict[bytes | None, bytes | None]:
    """The live keys of partition 0's compacted view, as the HTTP API pages it."""
    return {key: value for _, key, value in compacted_view(daemon, topic)}


def _state(state: dict[bytes, bytes], records: list[Read]) -> dict[bytes, bytes]:
    """What a consumer's state is after ``records``: a tombstone deletes its key."""
    for _, key, value in records:
        assert key is not None
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


@pytest.mark.parametrize("strategy", ["publishing-order", "event-time"])
def test_a_delete_after_a_consumer_read_its_key_reaches_it_from_the_next_ledger(daemon: DaemonProcess, kafka: Any,
                                                                               consumer: Consumer,
                                                                               strategy: str) -> None:
    topic = kafka.topic(prefix=PREFIX)
    policy = daemon.http.put(f"/v1/topics/{topic}/policies", json={"strategy": strategy})
    assert policy.status_code == 200, policy.text
    kafka.produce(topic, [(f"k{i % 4}", f"v{i}") for i in range(8)])
    compact(daemon, topic)
    consumer.assign([TopicPartition(topic, 0, 0)])
    first = poll(consumer, most=2)  # part of ledger 1: k0 and k1, at offsets 4 and 5
    assert [(key, value) for _, key, value in first] == [(b"k0", b"v4"), (b"k1", b"v5")]
    position = first[-1][0] + 1

    kafka.produce(topic, [("k0", None), ("k3", "v9")])  # offsets 8 and 9
    compact(daemon, topic)
    # The consumer goes on from its position (as after a restart from its committed offset): the ledger it
    # read from is retired, the next one answers.
    consumer.seek(TopicPartition(topic, 0, position))
    rest = poll(consumer)

    assert (8, b"k0", None) in rest  # the deletion, at the tombstone's own offset, from the ledger
    assert _state(_state({}, first), rest) == _view(daemon, topic) == {b"k1": b"v5", b"k2": b"v6", b"k3": b"v9"}
