"""librdkafka (confluent-kafka) where both sides of the daemon use it: the broker settings in librdkafka's
names, a consumer's base settings (the reading tasks' too: ``engine/kafka_fetch/librdkafka.py``), and the
driver's reads of a partition's end (``read_ends``) and log-identity probe (``first_records``), which the driver
runs in processes of their own (``probe_process.py``). Nothing here imports confluent-kafka until a function
needs it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from functools import cache
from typing import Any

from compactord.model import RecordFingerprint

__all__ = ["close_in_background", "consumer_config", "first_records",
           "librdkafka_config", "out_of_range_errors", "read_ends", "read_ends_many", "transient_errors"]

_PROBE_FETCH_BYTES = 1 << 20  # a fetch returns at least one whole batch, whatever its size
# The log-identity probe wants one record per partition, at the previous horizon: a fetch there of 1 MB
# also brought the new tail's first ~1 MB of every partition, which librdkafka checked and decoded (an
# incremental run's planning: 25-31 ms with it, 16-24 ms with 64 KB fetches; medians 28 and 20).
_FIRST_RECORD_FETCH_BYTES = 64 << 10
_MANY_FETCH_MAX_BYTES = 32 << 20  # a fetch's bound for the ends of many partitions (librdkafka's default: 50 MiB)
_MESSAGE_MAX_BYTES = 1_000_000  # librdkafka's default message.max.bytes (a consumer sends none)
_PROBE_FETCH_WAIT_MS = 10  # how long the broker may hold a probe's fetch at a log's end
_PROBE_WAIT_S = 0.01  # one wait of the probe for its records (it waits again until its deadline)
# A partition whose read got nothing for this long after the broker's answer is at its end (an open
# transaction holds its position below the high watermark).
_QUIET_S = 0.4


# kafka-python's names (``Settings.kafka_client_config``) -> librdkafka's. Values pass as they are, but
# for the lists and flags below.
_NAMES = {
    "client_id": "client.id",
    "request_timeout_ms": "socket.timeout.ms",
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanisms",
    "sasl_plain_username": "sasl.username",
    "sasl_plain_password": "sasl.password",
    "ssl_cafile": "ssl.ca.location",
    "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location",
    "ssl_password": "ssl.key.password",
}


def librdkafka_config(client_config: Mapping[str, Any]) -> dict[str, Any]:
    """librdkafka's settings for the broker settings that ``Settings.kafka_client_config`` gives kafka-python.

    :raises ValueError: a setting without a mapping here (a new one must be mapped, never dropped: a
        dropped security setting would connect in a way the operator did not configure).
    """
    out: dict[str, Any] = {}
    for name, value in client_config.items():
        if name == "bootstrap_servers":
            out["bootstrap.servers"] = value if isinstance(value, str) else ",".join(value)
        elif name == "ssl_check_hostname":
            out["ssl.endpoint.identification.algorithm"] = "https" if value else "none"
        elif name in _NAMES:
            out[_NAMES[name]] = value
        else:
            raise ValueError(f"the Kafka client setting {name!r} has no librdkafka equivalent here; "
                             "map it in compactord/kafka/librdkafka.py")
    return out


def consumer_config(client_config: Mapping[str, Any]) -> dict[str, Any]:
    """A reading consumer's settings: no group membership (``assign`` only; librdkafka's Python binding
    requires a ``group.id`` all the same, which nothing joins or commits to), read_committed, no offset
    reset (``error``: a start the log no longer holds fails), CRCs checked, no topic auto-created."""
    cfg = librdkafka_config(client_config)
    cfg.update({
        "group.id": f"{cfg.get('client.id', 'compactord')}-range-reader",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "auto.offset.reset": "error",
        "allow.auto.create.topics": False,
        "check.crcs": True,
        "enable.partition.eof": False,
    })
    return cfg


@cache
def transient_errors() -> frozenset[int]:
    """Errors a poll may carry that librdkafka recovers from on its own (it reconnects and fetches again);
    a read that never recovers ends on its caller's time limit."""
    from confluent_kafka import KafkaError

    return frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._PARTITION_EOF,
                      KafkaError._TIMED_OUT, KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                      KafkaError.REQUEST_TIMED_OUT, KafkaError._MSG_TIMED_OUT})


@cache
def out_of_range_errors() -> frozenset[int]:
    """Errors a read at an offset carries when the offset is out of the log's range: retention, a broker's
    cleaner or a truncation moved the log since the offset was known."""
    from confluent_kafka import KafkaError

    return frozenset({KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE})


def _probe_consumer(client_config: Mapping[str, Any], fetch_bytes: int = _PROBE_FETCH_BYTES,
                    request_bytes: int | None = None) -> Any:
    """A consumer for the driver's small reads at known offsets (``first_records``, ``read_ends``): the first
    batch at each offset is all they need, so small fetches (a broker answers with the first batch whole
    whatever the limit). (Its prefetch queue stays unbounded: past a bound librdkafka waits
    ``fetch.queue.backoff.ms``, 1 s, before it fetches again; with a bound of 1 MB the probe took 1.0-2.0 s.)"""
    from confluent_kafka import Consumer

    cfg = consumer_config(client_config)
    cfg.update({"max.partition.fetch.bytes": fetch_bytes, "fetch.max.bytes": request_bytes or fetch_bytes,
                # librdkafka wants fetch.max.bytes >= message.max.bytes (a producer's limit: unused here).
                "message.max.bytes": min(fetch_bytes, _MESSAGE_MAX_BYTES),
                # A read at a log's end is answered when this wait ends (librdkafka's default: 500 ms); the
                # answer's high watermark is what the probe wanted to know.
                "fetch.wait.max.ms": _PROBE_FETCH_WAIT_MS})
    return Consumer(cfg)


def _arrived(consumer: Any, most: int) -> list[Any]:
    """The messages (and errors) ``consumer`` holds, at most ``most``, once the first has come or
    ``_PROBE_WAIT_S`` passed. ``consume`` returns when it has ``most`` or its timeout passed, so that each
    of the probes' waits was waited out in full (a partition read at its last record gives one message): a
    wait of 0.2 s cost 0.2 s a probe, one of 10 ms put 10-20 ms on each of an incremental run's two reads."""
    first = consumer.poll(_PROBE_WAIT_S)
    if first is None:
        return []
    return [first, *consumer.consume(num_messages=most - 1, timeout=0)] if most > 1 else [first]


def first_records(client_config: Mapping[str, Any], topic: str, at: Mapping[int, int],
                  ends: Mapping[int, int] | None, timeout_s: float) -> dict[int, RecordFingerprint]:
    """Per partition ``p``, the fingerprint of the first data record at or after offset ``at[p]`` and below
    ``ends[p]``; a partition is left out when there is none (only transaction markers or aborted records,
    or the record is gone) or when none came within ``timeout_s``. ``ends`` None: below the high watermark
    the broker gives, or nothing once the read got no record for ``_QUIET_S`` after the broker's first
    answer (an open transaction holds the position below the high watermark); the caller, which fixes
    the ends meanwhile, holds the answer to them.

    The driver's log-identity probe (``BrokerMetadata.first_records``). The broker answers with the whole
    batch that holds the offset, and the fingerprinted offset is usually the last of a producer's batch:
    librdkafka decodes the batch in C, where kafka-python decoded every record before it in Python (a
    1 MB batch holds ~8,000 records here: 0.14-0.22 s per run for 4 partitions, a third of an incremental
    run of 100,000 records).

    :raises RuntimeError: the broker refused the read (unknown topic, auth).
    """
    from confluent_kafka import TopicPartition

    found: dict[int, RecordFingerprint] = {}
    consumer = _probe_consumer(client_config, _FIRST_RECORD_FETCH_BYTES)
    try:
        consumer.assign([TopicPartition(topic, p, offset) for p, offset in at.items()])
        pending = set(at)
        answered: dict[int, float] = {}  # when the broker's first answer for a partition was seen
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for message in _arrived(consumer, 500):
                p, err = message.partition(), message.error()
                if err is not None:
                    if err.code() in out_of_range_errors():  # the record is gone
                        pending.discard(p)
                    elif err.code() not in transient_errors():
                        raise RuntimeError(f"reading {topic}[{p}] at offset {at.get(p)} failed: {err.str()}")
                elif p in pending:
                    pending.discard(p)
                    if ends is None or message.offset() < ends[p]:
                        found[p] = RecordFingerprint.of(message.offset(), message.timestamp()[1], message.key(),
                                                        message.value())
                    consumer.pause([TopicPartition(topic, p)])
            for p in list(pending):
                tp = TopicPartition(topic, p)
                position = consumer.position([tp])[0].offset
                position = position if position >= 0 else at[p]  # nothing consumed yet: at its start
                end = ends[p] if ends is not None else consumer.get_watermark_offsets(tp, cached=True)[1]
                if 0 <= end <= position:
                    pending.discard(p)  # only transaction markers or aborted records were left
                elif ends is None and end >= 0 and time.monotonic() - answered.setdefault(p, time.monotonic()) \
                        >= _QUIET_S:
                    pending.discard(p)  # at an open transaction (or its aborted records): nothing to read
    finally:
        consumer.close()
    return found


def close_in_background(consumer: Any) -> threading.Thread:
    """Close ``consumer`` on a thread of its own, returned started: librdkafka's close joins its threads
    (0.5-7 ms here, more on a busy machine), which the caller need not wait for."""
    closer = threading.Thread(target=consumer.close, name="probe-close", daemon=True)
    closer.start()
    return closer


def read_ends(client_config: Mapping[str, Any], topic: str, listed: Mapping[int, int],
              timeout_s: float) -> tuple[dict[int, int], set[int]]:
    """Per partition ``p`` (one that holds records below ``listed[p]``, its ListOffsets end), where a
    read_committed read from ``listed[p] - 1`` ends: the consumer's position once it has read up to the
    high watermark the broker first gave (transaction markers occupy offsets, and the position moves past
    them), never below ``listed[p]``; and the partitions whose end no read confirmed: not read within
    ``timeout_s``, or quiet for ``_QUIET_S`` before any record of theirs came (an answer of many partitions
    may hold the records of some only; the others come with later fetches). A partition whose read starts at
    or past the broker's high watermark has nothing to read: its listed end stands.

    The driver's offsets (``KafkaAdmin.offsets``), with librdkafka: the broker answers with the whole batch
    that holds the offset, which kafka-python decoded record by record in Python (70-100 ms a run for four
    partitions of 1 MB batches here, the most of an incremental run's planning).

    :raises RuntimeError: the broker refused the read (unknown topic, auth).
    """
    from confluent_kafka import TopicPartition

    ends = dict(listed)
    consumer = _probe_consumer(client_config)
    try:
        consumer.assign([TopicPartition(topic, p, end - 1) for p, end in listed.items()])
        pending = set(listed)
        unread: set[int] = set()
        limit: dict[int, int] = {}  # the high watermark of the broker's first answer
        heard: dict[int, float] = {}  # when a partition last got a record, or its first answer
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            got = set()
            for message in _arrived(consumer, 100_000):
                err = message.error()
                if err is None:
                    got.add(message.partition())
                elif err.code() in out_of_range_errors():
                    # The log moved under the read: its listed end stands; the reading task then fails on a
                    # log that no longer reaches it, and the next run plans against the new log.
                    pending.discard(message.partition())
                elif err.code() not in transient_errors():
                    raise RuntimeError(f"reading {topic}[{message.partition()}] from offset "
                                       f"{listed.get(message.partition(), -1) - 1} failed: {err.str()}")
            now = time.monotonic()
            for p in list(pending):
                tp = TopicPartition(topic, p)
                position = consumer.position([tp])[0].offset
                _low, high = consumer.get_watermark_offsets(tp, cached=True)
                if high < 0:
                    continue  # no fetch answered for it yet
                limit.setdefault(p, high)
                if position >= 0:
                    ends[p] = max(ends[p], min(position, limit[p]))
                if p in got or p not in heard:
                    heard[p] = now
                if max(position, listed[p] - 1) >= limit[p]:
                    pending.discard(p)
                elif now - heard[p] >= _QUIET_S:
                    pending.discard(p)
                    if position < 0:
                        unread.add(p)  # quiet before any record came: nothing confirms its end
        return ends, pending | unread
    finally:
        close_in_background(consumer)


def read_ends_many(client_config: Mapping[str, Any], listed: Mapping[tuple[str, int], int],
                   timeout_s: float) -> tuple[dict[tuple[str, int], int], set[tuple[str, int]]]:
    """``read_ends`` for the partitions of many topics at once, keyed by ``(topic, partition)``: one consumer,
    whose fetches go to each leader for all its partitions together (the backlog monitor's pass).

    :raises RuntimeError: the broker refused a read (unknown topic, auth).
    """
    from confluent_kafka import TopicPartition

    ends = dict(listed)
    if not listed:
        return ends, set()
    # Each partition's share bounded as ``first_records``' (Kafka bounds it; the test broker answers a partition
    # with up to the request's bound), the request's large enough for every partition's share, so that one answer
    # can hold the last batch of each (a request bounded as one share holds a few partitions' only).
    consumer = _probe_consumer(client_config, _FIRST_RECORD_FETCH_BYTES,
                               min(_FIRST_RECORD_FETCH_BYTES * len(listed), _MANY_FETCH_MAX_BYTES))
    try:
        consumer.assign([TopicPartition(t, p, end - 1) for (t, p), end in listed.items()])
        pending = set(listed)
        unread: set[tuple[str, int]] = set()
        limit: dict[tuple[str, int], int] = {}
        heard: dict[tuple[str, int], float] = {}
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            got = set()
            for message in _arrived(consumer, 100_000):
                err = message.error()
                key = (message.topic(), message.partition())
                if err is None:
                    got.add(key)
                elif err.code() in out_of_range_errors():
                    pending.discard(key)
                elif err.code() not in transient_errors():
                    raise RuntimeError(f"reading {key[0]}[{key[1]}] from offset {listed.get(key, -1) - 1} "
                                       f"failed: {err.str()}")
            now = time.monotonic()
            keys = sorted(pending)
            positions = consumer.position([TopicPartition(t, p) for t, p in keys])
            for key, at in zip(keys, positions):
                _low, high = consumer.get_watermark_offsets(TopicPartition(*key), cached=True)
                if high < 0:
                    continue  # no fetch answered for it yet
                limit.setdefault(key, high)
                if at.offset >= 0:
                    ends[key] = max(ends[key], min(at.offset, limit[key]))
                if key in got or key not in heard:
                    heard[key] = now
                if max(at.offset, listed[key] - 1) >= limit[key]:
                    pending.discard(key)
                elif now - heard[key] >= _QUIET_S:
                    pending.discard(key)
                    if at.offset < 0:
                        unread.add(key)
        return ends, pending | unread
    finally:
        close_in_background(consumer)
