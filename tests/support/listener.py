"""What the Kafka listener's tests read and compare: a librdkafka consumer's records, polled to the end of its one
partition, and the compacted view as the HTTP API pages it."""

from __future__ import annotations

import base64
from typing import Any

from tests.support.daemon import DaemonProcess
from tests.support.timeouts import TASK_TIMEOUT_S

__all__ = ["Record", "compacted_view", "decoded", "poll"]

Record = tuple[int, bytes | None, bytes | None]  # offset, key, value


def poll(consumer: Any, most: int | None = None) -> list[Record]:
    """The records of a confluent-kafka consumer's one partition, until ``most`` of them or the partition's end
    (librdkafka's end-of-partition event: the consumer sets ``enable.partition.eof``); fails once polls have come
    back empty for ``TASK_TIMEOUT_S`` seconds."""
    from confluent_kafka import KafkaError, KafkaException

    read: list[Record] = []
    idle = 0
    while most is None or len(read) < most:
        message = consumer.poll(1.0)
        if message is None:
            idle += 1  # each empty poll waited a second
            if idle > TASK_TIMEOUT_S:
                raise AssertionError(f"no end of partition reached within {TASK_TIMEOUT_S} s; read {read}")
            continue
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                return read
            raise KafkaException(error)
        read.append((message.offset(), message.key(), message.value()))
    return read


def compacted_view(daemon: DaemonProcess, topic: str, partition: int = 0, *, markers: bool = False,
                   page: int = 1000) -> list[Record]:
    """The partition's compacted view as ``GET /compacted`` pages it (``page`` entries a page), with the deletion
    markers the ledger keeps if ``markers`` (the listener serves each as a tombstone): in offset order."""
    entries: list[Record] = []
    start: int | None = 0
    while start is not None:
        params: dict[str, Any] = {"partition": partition, "start": start, "limit": page}
        if markers:
            params["include_markers"] = "true"
        response = daemon.http.get(f"/v1/topics/{topic}/compacted", params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        entries += [(e["offset"], decoded(e["key"]), decoded(e["value"])) for e in body["entries"]]
        start = body["next_start"]
    return entries


def decoded(text: str | None) -> bytes | None:
    """A base64 text of the API (or of a client's JSON), as bytes; None stays None."""
    return None if text is None else base64.b64decode(text)
