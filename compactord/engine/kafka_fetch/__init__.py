"""The Kafka client that reads one offset range inside a Spark task: librdkafka (confluent-kafka, whose
wheels bundle librdkafka).

The data source's own logic (``range_task.RangeReadTask``: Arrow batches, loser dropping, the CANCEL
file, progress, event times, tombstones, the end reached by position) is written once; the reader only
opens a consumer on one partition at an offset and hands over what each poll returned, column by column
(``base.RangeReader``). It reads assigned (no group, nothing committed), read_committed, with no offset
reset (a range whose start the log no longer holds fails the task), CRCs checked. librdkafka's names for
the broker settings live in ``kafka/librdkafka.py`` (the driver's reads of ends and first records use them
too); the driver's other broker calls use kafka-python (``kafka/client.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from compactord.engine.kafka_fetch.base import Polled, RangeReader

__all__ = ["Polled", "RangeReader", "open_range_reader"]


def open_range_reader(client_config: Mapping[str, Any], topic: str, partition: int, start: int,
                      batch_records: int, rate: float = 0) -> RangeReader:
    """A reader of ``topic[partition]`` from offset ``start``, its fetches sized to ``rate``, its read budget
    in bytes per second (0: unlimited; ``engine/throttle.py``).

    :raises RuntimeError: confluent-kafka does not import here (e.g. on an executor without compactord's
        dependencies).
    """
    try:
        from compactord.engine.kafka_fetch.librdkafka import LibrdkafkaRangeReader
    except ImportError as exc:
        raise RuntimeError(f"confluent-kafka does not import in this Python ({exc}): the topic is read with "
                           "librdkafka; install compactord's dependencies on every executor") from exc
    return LibrdkafkaRangeReader(client_config, topic, partition, start, batch_records, rate)
