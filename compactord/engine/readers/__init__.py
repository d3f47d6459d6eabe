"""The Kafka clients that read one offset range inside a Spark task (``compactionReaderClient``).

The data source's own logic (``range_read.RangeReadTask``: Arrow batches, loser dropping, the CANCEL
file, progress, event times, tombstones, the end reached by position) is written once; a backend only
opens a consumer on one partition at an offset and hands over what each poll returned, column by column
(``base.RangeReader``). Two backends:

- ``librdkafka``: confluent-kafka, whose wheels bundle librdkafka (C); the default when it imports;
- ``kafka-python``: pure Python (with C CRC-32C), the daemon's driver-side client too (but for the
  log-identity probe, which reads with the readers' client: ``kafka.librdkafka.first_records``).

Which client ``auto`` means, and librdkafka's names for the broker settings, live in ``kafka/librdkafka.py``
(the driver uses them too).

Both read the same way: assigned (no group, nothing committed), read_committed, no offset reset (a range
whose start the log no longer holds fails the task), CRCs checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from compactord.engine.readers.base import Polled, RangeReader
from compactord.kafka.librdkafka import AUTO, CLIENTS, KAFKA_PYTHON, LIBRDKAFKA, resolve_client

__all__ = ["AUTO", "CLIENTS", "KAFKA_PYTHON", "LIBRDKAFKA", "Polled", "RangeReader", "open_range_reader",
           "resolve_client"]


def open_range_reader(client: str, client_config: Mapping[str, Any], topic: str, partition: int, start: int,
                      batch_records: int, rate: float = 0) -> RangeReader:
    """A reader of ``topic[partition]`` from offset ``start`` with the backend ``client`` (any of ``CLIENTS``),
    its fetches sized to ``rate``, its read budget in bytes per second (0: unlimited; ``engine/throttle.py``).

    :raises RuntimeError: the backend's library does not import here (e.g. on an executor without it).
    """
    resolved = resolve_client(client)
    if resolved == LIBRDKAFKA:
        try:
            from compactord.engine.readers.librdkafka import LibrdkafkaRangeReader
        except ImportError as exc:
            raise RuntimeError(f"compactionReaderClient={client}: confluent-kafka does not import in this "
                               f"Python ({exc}); install it on every executor or set "
                               "compactionReaderClient=kafka-python") from exc
        return LibrdkafkaRangeReader(client_config, topic, partition, start, batch_records, rate)
    from compactord.engine.readers.kafka_python import KafkaPythonRangeReader

    return KafkaPythonRangeReader(client_config, topic, partition, start, batch_records, rate)
