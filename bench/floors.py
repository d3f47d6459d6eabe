"""The floor of a compaction: the topic's offset ranges read outside Spark, only counting the records, one
process per Spark core: by the data source's own consumer (librdkafka) and, for comparison, by kafka-python
(the driver's consumer, ``kafka.client.consumer``, with no offset reset)."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["FLOOR_CLIENTS", "floor_range", "warm_worker"]


FLOOR_CLIENTS = ("kafka-python", "librdkafka")


def floor_range(args: tuple[str, dict[str, Any], str, int, int, int, int]) -> int:
    """Read one offset range with the consumer of ``client_name``, only counting the records."""
    client_name, client, topic, partition, start, end, batch_records = args
    if client_name == "librdkafka":
        return _floor_range_librdkafka(client, topic, partition, start, end, batch_records)
    from kafka import TopicPartition

    from compactord.kafka.client import consumer

    cons = consumer(client, max_poll_records=batch_records, auto_offset_reset="none")
    try:
        tp = TopicPartition(topic, partition)
        cons.assign([tp])
        cons.seek(tp, start)
        n = 0
        position = start
        while position < end:
            for r in cons.poll(timeout_ms=500, max_records=max(1, min(batch_records, end - position))).get(tp, ()):
                if r.offset >= end:
                    break
                n += 1
            position = cons.position(tp)
        return n
    finally:
        cons.close()


def _floor_range_librdkafka(client: dict[str, Any], topic: str, partition: int, start: int, end: int,
                            batch_records: int) -> int:
    from confluent_kafka import TopicPartition

    from compactord.engine.kafka_fetch.librdkafka import range_consumer

    cons = range_consumer(client)
    try:
        cons.assign([TopicPartition(topic, partition, start)])
        tp = TopicPartition(topic, partition)
        n = 0
        position = start
        while position < end:
            for m in cons.consume(num_messages=max(1, min(batch_records, end - position)), timeout=0.5):
                if m.error() is not None:
                    raise RuntimeError(f"the librdkafka floor read failed: {m.error()}")
                if m.offset() >= end:
                    break
                n += 1
            position = max(position, cons.position([tp])[0].offset)
        return n
    finally:
        cons.close()


def warm_worker(_: int) -> int:
    import confluent_kafka  # noqa: F401
    import kafka  # noqa: F401

    import compactord.engine.kafka_source  # noqa: F401

    return os.getpid()
