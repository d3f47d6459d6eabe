"""What the driver asks the broker: topics, partitions, log start and committed end offsets, backlog.

The end of a partition is the offset a read_committed consumer stops at (the last stable offset).
Brokers report it through ListOffsets(latest) with read_committed isolation. The test broker (Tansu
0.6) under-reports it: it answers the last batch's *base* offset + 1. So the answer of ListOffsets is
checked by reading, read_committed, from one below it until the position stops moving: on a broker
that reports correctly this reads one record and changes nothing; on Tansu it walks the last batch
to the true end. The walk is bounded by the first high watermark seen, so that a topic under
constant production still gets a fixed end.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kafka import IsolationLevel, OffsetSpec, TopicPartition

from compactord.config import Settings
from compactord.errors import BrokerUnavailable, CompactordError, TopicNotFound
from compactord.interfaces import BrokerMetadata
from compactord.kafka.client import admin_client, consumer, translate_kafka_errors
from compactord.kafka.librdkafka import (
    close_in_background,
    end_reader,
    first_records,
    librdkafka_available,
    read_ends,
    read_ends_many,
)
from compactord.model import PartitionOffsets, RecordFingerprint, TopicConfigs

__all__ = ["KafkaAdmin", "PartitionOffsets"]  # PartitionOffsets: re-exported from model

log = logging.getLogger(__name__)

_UNKNOWN_TOPIC = 3
CLOSE_WAIT_S = 1.0  # close() waits this long for an end reader's close under way
ADMIN_CLIENTS = 4  # admin clients at once, each used by one call at a time
PING_CONNECT_S = 2.0  # a TCP connection to a bootstrap address that takes longer counts as refused
_CLEANUP_CONFIGS = ("cleanup.policy", "delete.retention.ms", "min.compaction.lag.ms", "retention.ms")


class KafkaAdmin(BrokerMetadata):
    """Broker metadata and offsets for the driver, with kafka-python. Thread-safe (up to ``ADMIN_CLIENTS``
    admin clients, each used by one call at a time)."""

    def __init__(self, settings: Settings, observer: Callable[[str], None] | None = None) -> None:
        """``observer`` hears of every request to the broker by its kind (metadata, describe_configs,
        list_offsets, fetch): one call of the client, which may cover many topics (``describe_many``)."""
        self._settings = settings
        self._observer = observer
        self._bootstrap = settings.kafka_bootstrap_servers
        self._client_config = settings.kafka_client_config()
        # Admin clients, each used by one call at a time: calls from several threads (runs' planning, the
        # monitor, the API) overlap their waits for the broker; one client behind one lock made them queue.
        self._pool = threading.Condition()
        self._idle: list[Any] = []
        self._made = 0  # clients in use or idle
        self._closed = False
        # The log-identity probe and the end reads use librdkafka, as the reading tasks do; kafka-python
        # where confluent-kafka is not installed (the reading tasks then fail, saying so).
        self._librdkafka = librdkafka_available()
        self._closing: set[threading.Thread] = set()  # end readers being closed (``close_in_background``)
        self._closing_lock = threading.Lock()

    def close(self) -> None:
        # A call under way (a broker that does not answer holds one for the request timeout) keeps its
        # client, closed when the call ends; its thread is a daemon thread, and the process is stopping: do
        # not wait for it.
        with self._pool:
            self._closed = True
            idle, self._idle = self._idle, []
            self._made -= len(idle)
        for admin in idle:
            _close_quietly(admin)
        with self._closing_lock:
            closing = list(self._closing)
        for closer in closing:
            closer.join(CLOSE_WAIT_S)

    def _take(self) -> Any:
        """An idle admin client, or a new one while fewer than ``ADMIN_CLIENTS`` are made (else wait for one)."""
        with self._pool:
            while not self._idle and self._made >= ADMIN_CLIENTS:
                self._pool.wait()
            if self._idle:
                return self._idle.pop()
            self._made += 1
        try:
            return admin_client(self._client_config)
        except BaseException:
            self._give(None)
            raise

    def _give(self, admin: Any, *, broken: bool = False) -> None:
        """``admin`` back to the pool; closed instead when its call failed (it may be half-connected: the next
        call starts afresh) or the pool is closed."""
        with self._pool:
            keep = admin is not None and not broken and not self._closed
            if keep:
                self._idle.append(admin)
            else:
                self._made -= 1
            self._pool.notify()
        if not keep and admin is not None:
            _close_quietly(admin)

    def _count(self, op: str) -> None:
        if self._observer is not None:
            self._observer(op)

    def _call(self, topic: str | None, fn: Any, *, reads: bool = False, op: str = "metadata") -> Any:
        self._count("fetch" if reads else op)
        admin = cons = None
        broken = False
        try:
            with translate_kafka_errors(self._bootstrap, topic):
                admin = self._take()
                if reads:
                    # A consumer per call: kafka-python's assign([]) does not stop a consumer
                    # from tracking a topic (ClusterMetadata.set_topics ignores an empty list), so a
                    # long-lived one keeps asking for the metadata of every topic it once read; a
                    # broker that auto-creates topics (Kafka's default, and Tansu 0.6 even when
                    # asked not to) then re-creates a topic just deleted.
                    cons = consumer(self._client_config, max_poll_records=100_000)
                return fn(admin, cons)
        except TopicNotFound:
            raise
        except BaseException:
            broken = True
            raise
        finally:
            _close_quietly(cons)
            if admin is not None:
                self._give(admin, broken=broken)

    # -- topics -----------------------------------------------------------------------------------

    def list_topics(self) -> list[str]:
        return sorted(self._call(None, lambda admin, _c: admin.list_topics()))

    def ping(self) -> None:
        """Raise ``BrokerUnavailable`` unless the broker answers a metadata request. A bootstrap address
        that refuses the connection is known at once: the metadata request is not tried (kafka-python
        would retry it for the bootstrap timeout)."""
        reachable(self._bootstrap, timeout=min(PING_CONNECT_S, self._settings.kafka_request_timeout_ms / 1000))
        self.list_topics()

    def _describe(self, topic: str) -> dict[str, Any]:
        def describe(admin: Any, _c: Any) -> dict[str, Any]:
            (meta,) = admin.describe_topics([topic])
            if meta.get("error_code") == _UNKNOWN_TOPIC or not meta.get("partitions"):
                raise TopicNotFound(topic)
            return dict(meta)

        return self._call(topic, describe)

    def partitions(self, topic: str) -> list[int]:
        return _partitions_of(self._describe(topic))

    def topic_id(self, topic: str) -> str | None:
        return _topic_id_of(self._describe(topic))

    def topic_configs(self, topic: str) -> TopicConfigs:
        from kafka.admin import ConfigResource, ConfigResourceType

        def describe(admin: Any, _c: Any) -> dict[str, str]:
            # "all": a topic left at the broker's defaults has no "modified" config.
            answer = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
            configs = answer.get("topic", {}).get(topic, {}) if isinstance(answer, dict) else {}
            found: dict[str, str] = {}
            for name in _CLEANUP_CONFIGS:
                config = configs.get(name)
                value = config.get("value") if isinstance(config, dict) else config
                if value is not None:
                    found[name] = str(value)
            return found

        self.partitions(topic)  # TopicNotFound for a topic the broker does not have
        try:
            found = self._call(topic, describe, op="describe_configs")
        except TopicNotFound:
            raise
        except Exception as exc:  # noqa: BLE001 (an old broker, or one without DescribeConfigs: "unknown", not an error)
            log.debug("DescribeConfigs of %s failed: %s", topic, exc)
            found = {}
        return TopicConfigs(
            cleanup_policy=found.get("cleanup.policy"),
            delete_retention_ms=_int_or_none(found.get("delete.retention.ms")),
            min_compaction_lag_ms=_int_or_none(found.get("min.compaction.lag.ms")),
            retention_ms=_int_or_none(found.get("retention.ms")),
        )

    def describe_many(self, topics: Sequence[str], stopping: Callable[[], bool] = lambda: False
                      ) -> dict[str, tuple[str | None, dict[int, PartitionOffsets], TopicConfigs] | CompactordError]:
        """Batched: one metadata request, one DescribeConfigs, a ListOffsets per leader for the log starts and
        one for the ends, and one read confirming the ends, whatever the number of topics. A batch the broker
        refuses as a whole (a topic deleted between two requests) is asked again topic by topic."""
        from kafka.admin import ConfigResource, ConfigResourceType

        if not topics:
            return {}
        asked = list(topics)
        metas = self._call(None, lambda admin, _c: admin.describe_topics(asked))
        found: dict[str, tuple[str | None, dict[int, PartitionOffsets], TopicConfigs] | CompactordError] = {}
        partitions: dict[str, list[int]] = {}
        ids: dict[str, str | None] = {}
        for meta in metas:
            topic = meta.get("topic") or meta.get("name")
            if topic not in asked:
                continue
            if meta.get("error_code") == _UNKNOWN_TOPIC or not meta.get("partitions"):
                found[topic] = TopicNotFound(topic)
                continue
            partitions[topic] = sorted(p["partition_index"] if "partition_index" in p else p["partition"]
                                       for p in meta["partitions"])
            ids[topic] = _topic_id_of(meta)
        for topic in asked:
            if topic not in partitions and topic not in found:
                found[topic] = TopicNotFound(topic)
        if stopping() or not partitions:
            return found
        try:
            answer = self._call(None, lambda admin, _c: admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, t) for t in partitions], config_filter="all"),
                op="describe_configs")
        except Exception as exc:  # noqa: BLE001 (an old broker, or one without DescribeConfigs: "unknown", not an error)
            log.debug("DescribeConfigs of %d topics failed: %s", len(partitions), exc)
            answer = {}
        try:
            offsets = self._offsets_many(partitions)
        except CompactordError as exc:
            if isinstance(exc, BrokerUnavailable):
                raise
            log.debug("the offsets of %d topics in one batch failed (%s); asked topic by topic", len(partitions), exc)
            return {**found, **super().describe_many(list(partitions), stopping)}
        for topic in partitions:
            found[topic] = (ids[topic], offsets[topic], _configs_of(answer, topic))
        return found

    def _offsets_many(self, partitions: dict[str, list[int]]) -> dict[str, dict[int, PartitionOffsets]]:
        tps = [TopicPartition(t, p) for t, ps in partitions.items() for p in ps]
        starts, listed = self._call(None, lambda admin, _c: self._list_offsets(admin, tps), op="list_offsets")
        if not self._librdkafka:
            ends = self._call(None, lambda _a, cons: self._walk_to_end(cons, tps, starts, listed), reads=True)
        else:
            walk = {(tp.topic, tp.partition): listed[tp] for tp in tps if listed[tp] > starts[tp]}
            self._count("fetch")
            try:
                read, pending = read_ends_many(self._client_config, walk, self._settings.kafka_request_timeout_ms / 1000)
            except RuntimeError as exc:
                raise BrokerUnavailable(f"the Kafka broker at {self._bootstrap} failed a read: {exc}") from exc
            if pending:
                log.warning("end offsets of %d partitions not confirmed by a read within the request timeout",
                            len(pending))
            ends = {tp: read.get((tp.topic, tp.partition), listed[tp]) for tp in tps}
        out: dict[str, dict[int, PartitionOffsets]] = {t: {} for t in partitions}
        for tp in tps:
            out[tp.topic][tp.partition] = PartitionOffsets(tp.partition, starts[tp], max(ends[tp], starts[tp]))
        return out

    # -- offsets ----------------------------------------------------------------------------------

    def first_records(self, topic: str, at: Mapping[int, int],
                      offsets: Mapping[int, PartitionOffsets]) -> dict[int, RecordFingerprint | None]:
        if not at:
            return {}
        found: dict[int, RecordFingerprint | None] = dict.fromkeys(at)
        wanted = _in_log(at, offsets)
        if not wanted:
            return found
        if self._librdkafka:
            self._count("fetch")
            try:
                found.update(first_records(self._client_config, topic, wanted, {p: offsets[p].end for p in wanted},
                                           self._settings.kafka_request_timeout_ms / 1000))
            except RuntimeError as exc:
                raise BrokerUnavailable(f"the Kafka broker at {self._bootstrap} failed a read of {topic}: {exc}") \
                    from exc
            return found

        def fetch(_admin: Any, cons: Any) -> dict[int, RecordFingerprint | None]:
            tps = {TopicPartition(topic, p): offset for p, offset in wanted.items()}
            cons.assign(list(tps))
            for tp, offset in tps.items():
                cons.seek(tp, offset)
            pending = set(tps)
            deadline = time.monotonic() + self._settings.kafka_request_timeout_ms / 1000
            while pending and time.monotonic() < deadline:
                for tp, records in cons.poll(timeout_ms=200, max_records=500).items():
                    if tp in pending and records:
                        r = records[0]
                        found[tp.partition] = RecordFingerprint.of(r.offset, r.timestamp, r.key, r.value)
                        pending.discard(tp)
                        cons.pause(tp)
                for tp in list(pending):
                    if cons.position(tp) >= offsets[tp.partition].end:
                        pending.discard(tp)  # only transaction markers or aborted records were left
            return found

        return self._call(topic, fetch, reads=True)

    def offsets_with_records(self, topic: str, at: Mapping[int, int]
                             ) -> tuple[dict[int, PartitionOffsets], dict[int, RecordFingerprint | None]]:
        """With librdkafka, the probe of ``first_records`` reads (on librdkafka's threads) while the offsets
        are fixed, and its answer is then held to them as ``first_records`` holds it: nothing below the log
        start, at or past the end. An incremental run's planning took the probe's 27-38 ms less here. A
        probe that fails (a partition the topic no longer has: it was recreated) is asked again, after the
        offsets, of the partitions they name."""
        return self._offsets_with_records(topic, at, self.partitions(topic))

    def offsets_and_identity(self, topic: str, at: Mapping[int, int]
                             ) -> tuple[dict[int, PartitionOffsets], dict[int, RecordFingerprint | None], str | None]:
        """One metadata request names the partitions whose offsets are asked and the topic id (a run's planning
        asked for it again, a request of its own, ~1 in 6 of its broker time on a burst of small runs)."""
        meta = self._describe(topic)
        offsets, found = self._offsets_with_records(topic, at, _partitions_of(meta))
        return offsets, found, _topic_id_of(meta)

    def _offsets_with_records(self, topic: str, at: Mapping[int, int], partitions: list[int]
                              ) -> tuple[dict[int, PartitionOffsets], dict[int, RecordFingerprint | None]]:
        if not at or not self._librdkafka:
            offsets = self._offsets(topic, partitions)
            return offsets, (self.first_records(topic, at, offsets) if at else {})
        # Only partitions the topic has (one recreated with fewer would hold the read to its time limit).
        known = set(partitions)
        early: dict[str, Any] = {}

        def probe() -> None:
            try:
                early["found"] = first_records(self._client_config, topic,
                                               {p: o for p, o in at.items() if p in known}, None,
                                               self._settings.kafka_request_timeout_ms / 1000)
            except Exception as exc:  # noqa: BLE001 (whatever it was, it is asked again below, after the offsets)
                early["error"] = exc

        self._count("fetch")
        reader = threading.Thread(target=probe, name=f"first-records-{topic}", daemon=True)
        reader.start()
        offsets = self._offsets(topic, partitions)  # a failure here leaves the probe to end on its own (daemon)
        reader.join()
        if "found" not in early:
            log.debug("the early log-identity probe of %s failed (%s); asked again", topic, early.get("error"))
            return offsets, self.first_records(topic, at, offsets)
        found: dict[int, RecordFingerprint | None] = dict.fromkeys(at)
        wanted = _in_log(at, offsets)
        for p, record in early["found"].items():
            if p in wanted and record.offset < offsets[p].end:
                found[p] = record
        return offsets, found

    def offsets(self, topic: str) -> dict[int, PartitionOffsets]:
        """Log start and committed end of every partition, fixed now."""
        return self._offsets(topic, self.partitions(topic))

    def _offsets(self, topic: str, partitions: list[int]) -> dict[int, PartitionOffsets]:
        tps = [TopicPartition(topic, p) for p in partitions]
        if not self._librdkafka:  # each end is confirmed by a read_committed read, with kafka-python
            starts, listed = self._call(topic, lambda admin, _c: self._list_offsets(admin, tps), op="list_offsets")
            ends = self._call(topic, lambda _a, cons: self._walk_to_end(cons, tps, starts, listed), reads=True)
            return {tp.partition: PartitionOffsets(tp.partition, starts[tp], max(ends[tp], starts[tp])) for tp in tps}
        reader = end_reader(self._client_config)  # connects while the ends are listed
        try:
            starts, listed = self._call(topic, lambda admin, _c: self._list_offsets(admin, tps), op="list_offsets")
            found = {tp.partition: PartitionOffsets(tp.partition, starts[tp], max(listed[tp], starts[tp]))
                     for tp in tps}
            return self._read_ends(topic, found, reader)
        finally:
            closer = close_in_background(reader)
            with self._closing_lock:
                self._closing = {t for t in self._closing if t.is_alive()} | {closer}

    def _list_offsets(self, admin: Any, tps: list[TopicPartition]) -> tuple[dict[Any, int], dict[Any, int]]:
        """ListOffsets, read_committed: each partition's log start and end, as the broker lists them. The
        admin client asks over its open connection (a metadata request and a ListOffsets per leader, for
        each of the two): 2.3 ms here, against 7.2 ms for a consumer made for the call."""
        timeout = self._settings.kafka_request_timeout_ms

        def listed(spec: Any) -> dict[Any, int]:
            answer = admin.list_partition_offsets(dict.fromkeys(tps, spec), IsolationLevel.READ_COMMITTED,
                                                  timeout_ms=timeout)
            return {tp: answer[tp].offset for tp in tps}

        return listed(OffsetSpec.EARLIEST), listed(OffsetSpec.LATEST)

    def _read_ends(self, topic: str, listed: dict[int, PartitionOffsets], reader: Any) -> dict[int, PartitionOffsets]:
        """``listed`` with each end confirmed by a read_committed read with librdkafka (``read_ends``, on the
        consumer ``reader``), as ``_walk_to_end`` does with kafka-python."""
        walk = {p: o.end for p, o in listed.items() if o.end > o.log_start}
        if not walk:
            return listed
        self._count("fetch")
        try:
            ends, pending = read_ends(self._client_config, topic, walk, self._settings.kafka_request_timeout_ms / 1000,
                                      reader)
        except RuntimeError as exc:
            raise BrokerUnavailable(f"the Kafka broker at {self._bootstrap} failed a read of {topic}: {exc}") from exc
        if pending:
            log.warning("end offsets of %s partitions %s not confirmed by a read within the request timeout",
                        topic, sorted(pending))
        for p, end in ends.items():
            if end != walk[p]:
                log.debug("%s[%d]: ListOffsets said %d, a read_committed read ends at %d", topic, p, walk[p], end)
        return {p: dataclasses.replace(o, end=ends.get(p, o.end)) for p, o in listed.items()}

    def _walk_to_end(
        self, cons: Any, tps: list[TopicPartition], starts: dict[Any, int], listed: dict[Any, int]
    ) -> dict[Any, int]:
        ends = dict(listed)
        probe = [tp for tp in tps if listed[tp] > starts[tp]]
        if not probe:
            return ends
        cons.assign(probe)
        for tp in probe:
            cons.seek(tp, listed[tp] - 1)
        limit: dict[Any, int] = {}
        empty_polls: dict[Any, int] = dict.fromkeys(probe, 0)
        pending = set(probe)
        deadline = time.monotonic() + self._settings.kafka_request_timeout_ms / 1000
        while pending and time.monotonic() < deadline:
            batch = cons.poll(timeout_ms=200, max_records=100_000)
            for tp in list(pending):
                position = cons.position(tp)
                ends[tp] = max(ends[tp], min(position, limit.get(tp, position)))
                highwater = cons.highwater(tp)
                if highwater is None:
                    continue  # no fetch answered for this partition yet
                limit.setdefault(tp, highwater)
                empty_polls[tp] = 0 if batch.get(tp) else empty_polls[tp] + 1
                if position >= limit[tp] or empty_polls[tp] >= 2:
                    pending.discard(tp)
        if pending:
            log.warning("end offsets of %s not confirmed by a read within the request timeout", pending)
        cons.assign([])
        for tp in tps:
            if ends[tp] != listed[tp]:
                log.debug("%s: ListOffsets said %d, a read_committed read ends at %d", tp, listed[tp], ends[tp])
        return ends



def _in_log(at: Mapping[int, int], offsets: Mapping[int, PartitionOffsets]) -> dict[int, int]:
    """The offsets of ``at`` the log holds (at or above its log start, below its end): elsewhere there is
    nothing for the log-identity probe to compare."""
    return {p: offset for p, offset in at.items()
            if (o := offsets.get(p)) is not None and o.log_start <= offset < o.end}


def reachable(bootstrap: str, timeout: float) -> None:
    """:raises BrokerUnavailable: no address of ``bootstrap`` (``host:port,...``) accepts a TCP connection."""
    problems = []
    for address in filter(None, (a.strip() for a in bootstrap.split(","))):
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout).close()
            return
        except (OSError, ValueError) as exc:
            problems.append(f"{address}: {getattr(exc, 'strerror', None) or exc}")
    raise BrokerUnavailable(f"no broker address accepts a connection ({'; '.join(problems) or bootstrap})")


def _partitions_of(meta: Mapping[str, Any]) -> list[int]:
    return sorted(p["partition_index"] if "partition_index" in p else p["partition"] for p in meta["partitions"])


def _topic_id_of(meta: Mapping[str, Any]) -> str | None:
    value = meta.get("topic_id")
    text = str(value) if value is not None else ""
    # Brokers without topic ids answer the null UUID.
    return None if not text or set(text.replace("-", "")) <= {"0"} else text


def _configs_of(answer: Any, topic: str) -> TopicConfigs:
    """A topic's cleanup configs in a DescribeConfigs answer (every field None where it says nothing)."""
    configs = answer.get("topic", {}).get(topic, {}) if isinstance(answer, dict) else {}
    found: dict[str, str] = {}
    for name in _CLEANUP_CONFIGS:
        config = configs.get(name)
        value = config.get("value") if isinstance(config, dict) else config
        if value is not None:
            found[name] = str(value)
    return TopicConfigs(
        cleanup_policy=found.get("cleanup.policy"),
        delete_retention_ms=_int_or_none(found.get("delete.retention.ms")),
        min_compaction_lag_ms=_int_or_none(found.get("min.compaction.lag.ms")),
        retention_ms=_int_or_none(found.get("retention.ms")),
    )


def _int_or_none(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _close_quietly(client: Any) -> None:
    if client is None:
        return
    try:
        client.close()
    except Exception:  # closing a broken client must not hide the original error
        log.debug("error closing a kafka client", exc_info=True)
