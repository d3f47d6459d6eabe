"""The librdkafka range reader (confluent-kafka; its wheels bundle librdkafka).

librdkafka decodes and checks batches in C on its own threads, so the Python side of a poll is only the
columns (its speed against a pure-Python client: docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from operator import itemgetter
from typing import Any, cast

from confluent_kafka import Consumer, Message, TopicPartition

from compactord.engine.kafka_fetch.base import Polled, RangeReader, RecordFields
from compactord.engine.throttle import fetch_bytes
from compactord.kafka.librdkafka import consumer_config, librdkafka_config, transient_errors

__all__ = ["LibrdkafkaRangeReader", "librdkafka_config", "range_consumer"]

_ERROR = Message.error
# Message.timestamp() is (type, milliseconds), -1 when the record has none; a Message's length is its
# value's (0 when null). A consumed message has its offset (None is a produced one's, before delivery).
_FIELDS = RecordFields(cast("Callable[[Any], int]", Message.offset), Message.timestamp, Message.key, Message.value, Message.headers,
                       timestamp_ms=itemgetter(1), value_size=len)
# What one fetch brings: librdkafka's own default for a partition (max.partition.fetch.bytes), and the whole
# request's bound too (fetch.max.bytes), as a reading consumer fetches one partition. A record reaches the
# reader only once librdkafka has the whole response that carries it and has parsed it, so that smaller
# fetches bring a new consumer's first record sooner; a pass over a whole partition is not slower for them,
# as prefetching goes on while the reader works (_QUEUED_KBYTES). Figures: docs/performance.md.
_FETCH_BYTES = 1024 * 1024
# Prefetched data a consumer may hold: 16 MiB, sixteen fetches (librdkafka's default is 64 MiB).
_QUEUED_KBYTES = 16 * 1024
_MESSAGE_MAX_BYTES = 1_000_000  # librdkafka's default message.max.bytes
_QUEUE_BACKOFF_MS = 10  # how soon a full prefetch queue is looked at again (librdkafka: 1000)


def range_consumer(client_config: Mapping[str, Any], rate: float = 0) -> Consumer:
    """The consumer a reading task uses (also the benchmark's floor): ``kafka.librdkafka.consumer_config``
    (assigned, read_committed, no offset reset, CRCs checked) with fetches of ``_FETCH_BYTES``. ``rate``: the
    task's read budget in bytes per second (0: unlimited): its fetches (at most ``_FETCH_BYTES``) and its
    prefetch queue are sized to about one and two seconds of it, so that the cap is on what is fetched.
    (librdkafka wants ``fetch.max.bytes`` >= ``message.max.bytes``.)"""
    size = fetch_bytes(rate, _FETCH_BYTES)
    cfg = consumer_config(client_config)
    cfg.update({
        "max.partition.fetch.bytes": size,
        "fetch.max.bytes": max(size, _MESSAGE_MAX_BYTES),
        # The prefetch queue is bounded by its bytes alone (queued.min.messages stays at librdkafka's
        # 100,000): once past a bound, librdkafka waits ``fetch.queue.backoff.ms`` (1 s by default)
        # before it looks again, and a queue bounded by records (a few MB) left a reader that drained
        # it waiting for the next fetch (docs/performance.md).
        "queued.max.messages.kbytes": max(64, 2 * size // 1024) if rate > 0 else _QUEUED_KBYTES,
        "fetch.queue.backoff.ms": _QUEUE_BACKOFF_MS,
    })
    return Consumer(cfg)


class LibrdkafkaRangeReader(RangeReader):
    def __init__(self, client_config: Mapping[str, Any], topic: str, partition: int, start: int,
                 batch_records: int, rate: float = 0) -> None:
        self._batch = batch_records
        self._topic, self._partition = topic, partition
        self._tp = TopicPartition(topic, partition)
        self._start = start
        self._consumer = range_consumer(client_config, rate)
        try:
            self._consumer.assign([TopicPartition(topic, partition, start)])
        except BaseException:
            self._consumer.close()
            raise

    def poll(self, timeout_s: float, max_records: int | None = None) -> Polled | None:
        # ``consume`` returns once it has ``num_messages`` or the timeout passed: asked for a whole batch, it
        # held the records that had come until the next fetch brought the rest. A poll waits for the first
        # record, then takes what else has come, up to the batch (and no more than the range holds).
        wanted = self._wanted(max_records)
        messages = self._consumer.consume(num_messages=1, timeout=timeout_s)
        if not messages:
            return None
        if wanted > 1:
            messages += self._consumer.consume(num_messages=wanted - 1, timeout=0)
        if any(map(_ERROR, messages)):
            messages = self._without_errors(messages)
            if not messages:
                return None
        return Polled(messages, _FIELDS)

    def _without_errors(self, messages: list[Message]) -> list[Message]:
        for message in messages:
            err = message.error()
            if err is not None and err.code() not in transient_errors():
                # _AUTO_OFFSET_RESET: the start is out of the log's range (``auto.offset.reset=error``).
                raise RuntimeError(f"reading {self._topic}[{self._partition}] from offset {self._start} failed: "
                                   f"{err.str()} ({err.name()})")
        return [m for m in messages if m.error() is None]

    def position(self) -> int | None:
        offset = self._consumer.position([self._tp])[0].offset
        return offset if offset >= 0 else None  # OFFSET_INVALID until a record was consumed

    def high_watermark(self) -> int | None:
        _low, high = self._consumer.get_watermark_offsets(self._tp, cached=True)
        return high if high >= 0 else None

    def close(self) -> None:
        self._consumer.close()
