"""What the listener asks of the daemon, in the daemon's own terms: the topics it compacts (those on the broker
that ``compactionTopicsPattern`` admits), their partitions, and pages of each topic's current (or pinned)
ledger, read as the HTTP API's ``/compacted`` route reads them (``TopicCompactionService.read_compacted_rows``: the
page's Arrow columns; above the partition's log start), each read's record batches kept (``BatchCache``: a ledger
never changes). Every method blocks (broker requests, ledger reads): the listener calls them in its executor, never on
its event loop; but ``relays``, which answers from memory, on the loop, whether a fetch lies past the horizon of the
topic's current ledger as the last read learnt it (its horizon kept while no write of the topic's pointer by this
process came since, ``LedgerStore.pointer_generation``, and for at most ``CURRENT_TTL_S``, within which another
process's switch is seen: a cluster's other members'). A fetch's partitions of a topic are read together
(``read_partitions``: one ledger, one identity check, within the fetch's bytes); ``warm`` (``listener/warm.py``'s
thread) keeps a new ledger's first pages before a client asks for them.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import Counter, Gauge, Histogram

from compactord.errors import (
    BrokerUnavailable,
    CompactordError,
    LedgerRetired,
    NotCompacted,
    StorageUnavailable,
    TopicNotFound,
    TopicRecreated,
)
from compactord.listener.batches import MAX_DELTA, BatchCache, empty_batch, rows_batches
from compactord.model import LedgerManifest, Position

if TYPE_CHECKING:
    from compactord.config import Settings
    from compactord.interfaces import BrokerMetadata, TopicCompactionService

__all__ = ["LedgerAnswer", "ListenerHost", "ListenerMetrics", "PartitionAnswers", "PartitionRead", "TopicView"]

log = logging.getLogger(__name__)

# How long the broker's topic list and a topic's partitions are kept: a Metadata request every few seconds per
# client asks the broker at most this often.
TOPICS_TTL_S = 5.0
# Entries read per page: the page's bytes bound it first, for all but tiny records.
PAGE_ENTRIES = 10_000
# How long the current ledger's horizon a read learnt answers ``relays`` (a switch by this process is seen at
# once, by the pointer's generation; another process's within this).
CURRENT_TTL_S = 1.0
# A partition's bytes a fetch asks by default: librdkafka's, the Java client's, kafka-python's and KafkaJS's
# max.partition.fetch.bytes. ``warm`` keeps pages of that size.
WARM_BYTES = 1024 * 1024
# The share of the batch cache one topic's ``warm`` fills at most.
WARM_SHARE = 0.25
_BASE_OFFSET = struct.Struct(">q")  # a record batch's first field


class _Registry(Protocol):
    def existing_service(self, topic: str) -> TopicCompactionService | None: ...


class _Store(Protocol):
    def topics(self) -> list[str]: ...

    def pointer_generation(self, topic: str) -> int: ...


class _Monitor(Protocol):
    def watches(self, topic: str) -> bool: ...

    @property
    def ignored(self) -> frozenset[str]: ...

    def log_starts(self, topic: str) -> dict[int, int]: ...


class _Identities(Protocol):
    def check(self, topic: str, manifest: LedgerManifest) -> object: ...


class ListenerMetrics(Protocol):
    """The daemon's metrics the listener keeps (``compactord.daemon.metrics.Metrics`` has them)."""

    listener_connections: Gauge
    listener_requests: Counter
    listener_bytes: Counter
    listener_fetch_seconds: Histogram


class ListenerHost(Protocol):
    """The parts of the daemon the listener reads (``compactord.daemon.core.Daemon`` has them)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def admin(self) -> BrokerMetadata: ...

    @property
    def registry(self) -> _Registry: ...

    @property
    def monitor(self) -> _Monitor: ...

    @property
    def store(self) -> _Store: ...

    @property
    def metrics(self) -> ListenerMetrics: ...

    @property
    def identities(self) -> _Identities: ...


@dataclass(frozen=True, slots=True)
class LedgerAnswer:
    """A partition's part of a fetch served from a ledger: ``records`` (record batches) hold the entries from the
    fetch offset on and, once the ledger has nothing more, an empty batch up to the horizon."""

    ledger_id: int
    horizon: int
    records: bytes
    log_start: int


@dataclass(frozen=True, slots=True)
class PartitionRead:
    """A partition of a fetch at or below the horizon: from ``offset``, at most ``max_bytes`` of batches (at
    least one record)."""

    partition: int
    offset: int
    max_bytes: int


@dataclass
class PartitionAnswers:
    """What ``TopicView.read_partitions`` found: by partition, the ledger's answer or the error that kept it from
    reading it (a partition the ledger does not serve is not there), the partitions not read once the bytes
    were spent (``unread``), and the bytes of batches answered (``spent``)."""

    answers: dict[int, LedgerAnswer | CompactordError] = field(default_factory=dict)
    unread: list[int] = field(default_factory=list)
    spent: int = 0


@dataclass(frozen=True, slots=True)
class _Current:
    """A topic's current ledger as a read found it (``ledger_id`` None: none), with the pointer's generation
    taken before the look-up and the time."""

    generation: int
    at: float
    ledger_id: int | None
    horizon: dict[int, int]


class TopicView:
    def __init__(self, host: ListenerHost, cache: BatchCache | None = None) -> None:
        self._host = host
        self._cache = BatchCache() if cache is None else cache
        self._lock = threading.Lock()
        self._topics: tuple[float, list[str]] | None = None
        self._partitions: dict[str, tuple[float, list[int]]] = {}
        self._not_served: set[tuple[str, int]] = set()  # (topic, ledger id) of a recreated topic, logged once
        # Written by reads (the executor's threads), read by ``relays`` (the event loop): each value is replaced
        # whole, never changed, so a reader sees an old one or a new one.
        self._current: dict[str, _Current] = {}
        self._served: dict[str, float] = {}  # topic: when a ledger last answered a fetch of it (``warm``)

    def topics(self) -> list[str]:
        """The topics the daemon compacts, as the broker last listed them (at most ``TOPICS_TTL_S`` old): those
        compactionTopicsPattern admits, and those with a ledger (compacted when asked), never an ignored one.

        :raises BrokerUnavailable: the broker did not answer and no earlier answer is kept."""
        with self._lock:
            kept = self._topics
        if kept is not None and time.monotonic() - kept[0] < TOPICS_TTL_S:
            return kept[1]
        try:
            on_root = set(self._host.store.topics()) - self._host.monitor.ignored
            found = [t for t in self._host.admin.list_topics() if self._host.monitor.watches(t) or t in on_root]
        except (BrokerUnavailable, StorageUnavailable):
            if kept is None:
                raise
            return kept[1]
        with self._lock:
            self._topics = (time.monotonic(), found)
        return found

    def partitions(self, topic: str) -> list[int]:
        """The topic's partitions, if the daemon compacts it.

        :raises TopicNotFound: not on the broker, or neither admitted by compactionTopicsPattern nor with a ledger.
        :raises BrokerUnavailable: the broker did not answer and no earlier answer is kept."""
        if not self.admits(topic):
            raise TopicNotFound(topic)
        with self._lock:
            kept = self._partitions.get(topic)
        if kept is not None and time.monotonic() - kept[0] < TOPICS_TTL_S:
            return kept[1]
        try:
            found = self._host.admin.partitions(topic)
        except BrokerUnavailable:
            if kept is None:
                raise
            return kept[1]
        with self._lock:
            self._partitions[topic] = (time.monotonic(), found)
        return found

    def admits(self, topic: str) -> bool:
        """Whether the listener serves the topic: compactionTopicsPattern admits it, or it has a ledger."""
        if self._host.monitor.watches(topic):
            return True
        if topic in self._host.monitor.ignored:
            return False
        try:
            return topic in self._host.store.topics()
        except StorageUnavailable:
            return False

    def first_offset(self, topic: str, partition: int) -> int | None:
        """The first offset the topic's current ledger holds for ``partition`` at or above its log start; None
        without a ledger, or with no entry there."""
        service = self._host.registry.existing_service(topic)
        if service is None:
            return None
        start = self._host.monitor.log_starts(topic).get(partition, 0)
        try:
            page = service.read_compacted_page(Position(partition, start), 1, include_markers=True)
        except NotCompacted:
            return None
        if partition not in page.ledger.horizon or not page.entries or not self._same_log(topic, page.ledger):
            return None
        return page.entries[0].offset

    def read(self, topic: str, partition: int, offset: int, max_bytes: int, pin: int | None) -> LedgerAnswer | None:
        """The part of a fetch at ``offset`` that the ledger serves: from the pinned ledger (``pin``; the current
        one once the pinned one is retired, or without a pin), None where the ledger does not serve it (no
        ledger, the partition not in it, ``offset`` or the partition's log start past its horizon): the broker
        does.

        :raises CompactordError: the ledger could not be read (the store down, a file that fails its check)."""
        answer = self.read_partitions(topic, [PartitionRead(partition, offset, max_bytes)], pin).answers.get(partition)
        if isinstance(answer, CompactordError):
            raise answer
        return answer

    def read_partitions(self, topic: str, reads: Sequence[PartitionRead], pin: int | None,
                        budget: int | None = None, *, again: bool = True) -> PartitionAnswers:
        """``read`` of each of ``reads`` (partitions of ``topic``), in their order, all from one ledger (a switch
        between two of them never mixes two ledgers in a fetch), each within what is left of ``budget`` (bytes of
        batches, for them all; None: no bound): once it is spent, the reads left are not made. The check that the
        broker's topic is the ledger's log is made once. A ledger retired past its grace during the reads: all of
        them are made again from the current one (``again``: once)."""
        generation, at = self._host.store.pointer_generation(topic), time.monotonic()
        service = self._host.registry.existing_service(topic)
        if service is None:
            self._current[topic] = _Current(generation, at, None, {})
            return PartitionAnswers()
        current = pin is None
        try:
            manifest = service.ledger_info(pin)
        except LedgerRetired:
            manifest, current = service.ledger_info(None), True
        if current:
            self._current[topic] = _Current(generation, at, None if manifest is None else manifest.ledger_id,
                                            {} if manifest is None else dict(manifest.horizon))
        found = PartitionAnswers()
        if manifest is None:
            return found
        log_starts = self._host.monitor.log_starts(topic)
        checked = False
        for index, read in enumerate(reads):
            horizon = manifest.horizon.get(read.partition)
            log_start = log_starts.get(read.partition, 0)
            start = max(read.offset, log_start)
            # Past the horizon (or retention passed it): what is left is the live log's.
            if horizon is None or read.offset > horizon or start > horizon:
                continue
            if budget is not None and found.spent >= budget:
                found.unread = [r.partition for r in reads[index:]]
                break
            if not checked:
                if not self._same_log(topic, manifest):
                    return PartitionAnswers()
                checked = True
            size = max(1, read.max_bytes if budget is None else min(read.max_bytes, budget - found.spent))
            key = _page(topic, manifest, read.partition, start, size)
            records = self._cache.get(key)
            if records is None:
                try:
                    records = self._batches(service, manifest.ledger_id, read.partition, start, horizon, size)
                except LedgerRetired:
                    if again:
                        return self.read_partitions(topic, reads, None, budget, again=False)
                    raise
                except CompactordError as exc:
                    found.answers[read.partition] = exc
                    continue
                self._cache.put(key, records)
            found.answers[read.partition] = LedgerAnswer(manifest.ledger_id, horizon, records, log_start)
            found.spent += len(records)
        if found.answers:
            self._served[topic] = time.monotonic()
        return found

    def served_since(self, since: float) -> list[str]:
        """The topics a ledger answered a fetch of at or after ``since`` (``time.monotonic``)."""
        return [topic for topic, at in list(self._served.items()) if at >= since]

    def warm(self, topic: str) -> int:
        """Keep the batches of the first page of each partition of ``topic``'s current ledger, as a fetch from its
        log start (or its first entry) of ``WARM_BYTES`` a partition asks them, at most ``WARM_SHARE`` of the
        cache in all: the first fetches of an application that bootstraps from the new ledger find them. The bytes
        encoded (none for a page already kept).

        :raises CompactordError: the ledger could not be read."""
        service = self._host.registry.existing_service(topic)
        manifest = None if service is None else service.ledger_info(None)
        if service is None or manifest is None:
            return 0
        log_starts = self._host.monitor.log_starts(topic)
        encoded = 0
        for partition, horizon in sorted(manifest.horizon.items()):
            start = log_starts.get(partition, 0)
            key = _page(topic, manifest, partition, start, WARM_BYTES)
            if start > horizon or self._cache.get(key) is not None:
                continue
            if encoded >= self._cache.max_bytes * WARM_SHARE:
                break
            records = self._batches(service, manifest.ledger_id, partition, start, horizon, WARM_BYTES)
            self._cache.put(key, records)
            first = _BASE_OFFSET.unpack_from(records)[0] if records else start
            if first != start:  # a fetch from the first entry (the earliest offset the listener lists) is the same
                self._cache.put(_page(topic, manifest, partition, first, WARM_BYTES), records)
            encoded += len(records)
        return encoded

    def relays(self, topic: str, partition: int, offset: int, pin: int | None) -> bool:
        """Whether ``read`` would answer None because ``offset`` lies past the horizon of the topic's current
        ledger (or the topic has none, or the partition is not in it), known from memory: the current ledger a
        read learnt, while the pointer's generation is the one that read took and for at most ``CURRENT_TTL_S``,
        and a fetch unpinned or pinned to that ledger (a read pinned to another goes to ``read``, which knows
        whether it is still readable). False: not known, ``read`` answers. Never blocks: the event loop asks it."""
        current = self._current.get(topic)
        if current is None or (pin is not None and pin != current.ledger_id):
            return False
        if time.monotonic() - current.at >= CURRENT_TTL_S:
            return False
        if self._host.store.pointer_generation(topic) != current.generation:
            return False
        horizon = current.horizon.get(partition)
        return horizon is None or offset > horizon

    @staticmethod
    def _batches(service: TopicCompactionService, ledger_id: int, partition: int, start: int, horizon: int,
                 max_bytes: int) -> bytes:
        """The entries of ``partition`` from ``start`` (to at most ``max_bytes``) as record batches, and, when the
        ledger holds no more below the horizon, an empty batch up to it. Read as Arrow columns
        (``read_compacted_rows``): a first read of a view makes no Python object per entry."""
        page = service.read_compacted_rows(Position(partition, start), PAGE_ENTRIES, ledger_id=ledger_id,
                                           max_bytes=max_bytes, include_markers=True)
        rows = page.rows
        offsets = rows.column("offset")
        if rows.num_rows and pc.max(offsets).as_py() > horizon:
            rows = rows.filter(pc.less_equal(offsets, pa.scalar(horizon, pa.int64())))
        records = rows_batches(rows)
        if not page.truncated and page.rows.num_rows < PAGE_ENTRIES:
            after = rows.column("offset")[-1].as_py() + 1 if rows.num_rows else start
            if after <= horizon:
                records += empty_batch(after, min(horizon, after + MAX_DELTA))
        return records

    def _same_log(self, topic: str, manifest: LedgerManifest) -> bool:
        """Whether the broker's topic is the log ``manifest``'s ledger was made of, as the HTTP read API checks it
        (``TopicIdentities``: at most a second old, the last answer while the broker is down); a topic deleted
        and created again is served from its live log until a ledger of the new one is made."""
        try:
            self._host.identities.check(topic, manifest)
        except TopicRecreated as exc:
            with self._lock:
                first = (topic, manifest.ledger_id) not in self._not_served
                self._not_served.add((topic, manifest.ledger_id))
            if first:
                log.info("Kafka listener: %s is served from its live log, not from ledger %d: %s", topic,
                         manifest.ledger_id, exc)
            return False
        return True


def _page(topic: str, manifest: LedgerManifest, partition: int, start: int, max_bytes: int) -> tuple[object, ...]:
    """The ``BatchCache`` key of a read of ``partition`` from ``start`` within ``max_bytes``: the ledger's files
    never change, so that read gives the same batches every time (its topic, id and making time name it)."""
    return topic, manifest.ledger_id, manifest.created_at_ms, partition, start, max_bytes
