"""What the driver asks the broker: topics, partitions, log start and committed end offsets (fixed as
``end_offsets.py`` says), backlog.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kafka import TopicPartition

from compactord.config import Settings
from compactord.errors import BrokerUnavailable, CompactordError, TopicNotFound
from compactord.interfaces import BrokerMetadata
from compactord.kafka.client import admin_client, translate_kafka_errors
from compactord.kafka.end_offsets import confirm_ends, confirm_ends_many, list_offsets
from compactord.kafka.librdkafka import first_records
from compactord.kafka.probe_process import probe_processes
from compactord.model import PartitionOffsets, RecordFingerprint, TopicConfigs

__all__ = ["KafkaAdmin", "PartitionOffsets"]  # PartitionOffsets: re-exported from model

log = logging.getLogger(__name__)

_UNKNOWN_TOPIC = 3
ADMIN_CLIENTS = 4  # admin clients at once, each used by one call at a time
PING_CONNECT_S = 2.0  # a TCP connection to a bootstrap address that takes longer counts as refused
_CLEANUP_CONFIGS = ("cleanup.policy", "delete.retention.ms", "min.compaction.lag.ms", "retention.ms")


class KafkaAdmin(BrokerMetadata):
    """Broker metadata and offsets for the driver, with kafka-python's admin client (the end reads and the
    log-identity probe with librdkafka's consumer, in the processes of ``probe_process.py``). Thread-safe (up to
    ``ADMIN_CLIENTS`` admin clients, each used by one call at a time)."""

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
        # The log-identity probe and the end reads use librdkafka, as the reading tasks do, in processes of
        # their own: one is started now, so that the first read finds it.
        probe_processes().warm()

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

    def _call(self, topic: str | None, fn: Callable[[Any], Any], *, op: str = "metadata") -> Any:
        """``fn(admin)`` with an admin client of the pool, the broker's errors translated."""
        self._count(op)
        admin = None
        broken = False
        try:
            with translate_kafka_errors(self._bootstrap, topic):
                admin = self._take()
                return fn(admin)
        except TopicNotFound:
            raise
        except BaseException:
            broken = True
            raise
        finally:
            if admin is not None:
                self._give(admin, broken=broken)

    # -- topics -----------------------------------------------------------------------------------

    def list_topics(self) -> list[str]:
        return sorted(self._call(None, lambda admin: admin.list_topics()))

    def ping(self) -> None:
        """Raise ``BrokerUnavailable`` unless the broker answers a metadata request. A bootstrap address
        that refuses the connection is known at once: the metadata request is not tried (kafka-python
        would retry it for the bootstrap timeout)."""
        reachable(self._bootstrap, timeout=min(PING_CONNECT_S, self._settings.kafka_request_timeout_ms / 1000))
        self.list_topics()

    def _describe(self, topic: str) -> dict[str, Any]:
        def describe(admin: Any) -> dict[str, Any]:
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

        def describe(admin: Any) -> Any:
            # "all": a topic left at the broker's defaults has no "modified" config.
            return admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")

        self.partitions(topic)  # TopicNotFound for a topic the broker does not have
        try:
            answer = self._call(topic, describe, op="describe_configs")
        except TopicNotFound:
            raise
        except Exception as exc:  # noqa: BLE001 (an old broker, or one without DescribeConfigs: "unknown", not an error)
            log.debug("DescribeConfigs of %s failed: %s", topic, exc)
            answer = {}
        return _configs_of(answer, topic)

    def describe_many(self, topics: Sequence[str], stopping: Callable[[], bool] = lambda: False
                      ) -> dict[str, tuple[str | None, dict[int, PartitionOffsets], TopicConfigs] | CompactordError]:
        """Batched: one metadata request, one DescribeConfigs, a ListOffsets per leader for the log starts and
        one for the ends, and one read confirming the ends, whatever the number of topics. A batch the broker
        refuses as a whole (a topic deleted between two requests) is asked again topic by topic."""
        from kafka.admin import ConfigResource, ConfigResourceType

        if not topics:
            return {}
        asked = list(topics)
        metas = self._call(None, lambda admin: admin.describe_topics(asked))
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
            answer = self._call(None, lambda admin: admin.describe_configs(
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
        timeout_ms = self._settings.kafka_request_timeout_ms
        starts, listed = self._call(None, lambda admin: list_offsets(admin, tps, timeout_ms), op="list_offsets")
        found = confirm_ends_many(self._client_config, self._bootstrap, tps, starts, listed,
                                  self._settings.kafka_request_timeout_ms / 1000, self._count)
        out: dict[str, dict[int, PartitionOffsets]] = {t: {} for t in partitions}
        for tp in tps:
            out[tp.topic][tp.partition] = found[tp]
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
        self._count("fetch")
        try:
            found.update(self._first_records(topic, wanted, {p: offsets[p].end for p in wanted}))
        except RuntimeError as exc:
            raise BrokerUnavailable(f"the Kafka broker at {self._bootstrap} failed a read of {topic}: {exc}") \
                from exc
        return found

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
        if not at:
            offsets = self._offsets(topic, partitions)
            return offsets, (self.first_records(topic, at, offsets) if at else {})
        # Only partitions the topic has (one recreated with fewer would hold the read to its time limit).
        known = set(partitions)
        early: dict[str, Any] = {}

        def probe() -> None:
            try:
                early["found"] = self._first_records(topic, {p: o for p, o in at.items() if p in known}, None)
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
        return self._confirmed(topic, self._listed(topic, partitions))

    def _listed(self, topic: str, partitions: list[int]) -> dict[int, PartitionOffsets]:
        """The partitions' log starts and ends as ListOffsets lists them (an end not yet confirmed)."""
        tps = [TopicPartition(topic, p) for p in partitions]
        timeout_ms = self._settings.kafka_request_timeout_ms
        starts, listed = self._call(topic, lambda admin: list_offsets(admin, tps, timeout_ms), op="list_offsets")
        return {tp.partition: PartitionOffsets(tp.partition, starts[tp], max(listed[tp], starts[tp])) for tp in tps}

    def _confirmed(self, topic: str, listed: dict[int, PartitionOffsets]) -> dict[int, PartitionOffsets]:
        """``listed`` with each end confirmed by a read (``end_offsets.confirm_ends``)."""
        return confirm_ends(self._client_config, self._bootstrap, topic, listed,
                            self._settings.kafka_request_timeout_ms / 1000, self._count)

    def log_now(self, topic: str, horizon: Mapping[int, int]) -> tuple[str | None, dict[int, PartitionOffsets]]:
        """One metadata request for the id and the partitions, the offsets listed, and a read confirming only the
        ends at or below the horizon (a read of the topic's ends costs more than the rest together)."""
        meta = self._describe(topic)
        found = self._listed(topic, _partitions_of(meta))
        unsure = {p: o for p, o in found.items() if p in horizon and o.end - 1 < horizon[p]}
        offsets = {p: dataclasses.replace(o, end_confirmed=False) for p, o in found.items() if p not in unsure}
        if unsure:
            offsets.update(self._confirmed(topic, unsure))
        return _topic_id_of(meta), dict(sorted(offsets.items()))

    def _first_records(self, topic: str, at: Mapping[int, int], ends: Mapping[int, int] | None
                       ) -> dict[int, RecordFingerprint]:
        """``librdkafka.first_records`` in a process of the pool (``probe_process.py``)."""
        timeout_s = self._settings.kafka_request_timeout_ms / 1000
        return probe_processes().call(first_records, self._client_config, topic, dict(at),
                                      dict(ends) if ends is not None else None, timeout_s,
                                      timeout_s=timeout_s, what=f"a read of {topic}")



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
