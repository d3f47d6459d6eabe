"""The answers to the requests the listener serves: Metadata (the listener as every partition's leader),
ListOffsets (earliest from the ledger, the rest from the broker), Fetch (at or below the horizon from the
ledger, past it relayed to the partition's leader) and the consumer groups' requests (``groups``). Each handler takes a decoded request and gives its encoded
answer; the blocking parts (the broker's topic list, ledger reads) run in the listener's executor, but a fetch past
the horizon that the view knows from memory (``TopicView.relays``: the tail of the log) is relayed from the event
loop.

A ledger's answer that reaches the horizon is followed, in the same answer, by the live log after it, relayed:
a client that does not move past a batch of no records (KafkaJS) still reads on from the records after it. Not
when the broker's latest offset (kept ``LATEST_TTL_S``) shows nothing after the horizon: the relayed fetch would
wait out its ``NO_WAIT_MS`` for nothing; a record produced since is read by the next fetch. The broker's latest
offsets are asked while the ledger is read.

A fetch's partitions of one topic are read from one ledger, in one call to the executor
(``TopicView.read_partitions``), within the fetch's bytes: a partition left once they are spent is answered
with no records and the log's end, as a broker leaves out what does not fit, never relayed (the broker would
answer with the log below the horizon).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kafka.protocol.api_key import ApiKey
from kafka.record.memory_records import MemoryRecords

from compactord.errors import BrokerUnavailable, CompactordError, TopicNotFound
from compactord.listener.fetch_frames import FetchedPartition, encode_fetch
from compactord.listener.groups import GroupLinks, GroupRelay
from compactord.listener.protocol import ERRORS, GROUPS, Request, encode_response, item
from compactord.listener.relay import BrokerRelay, FetchLinks, Leg, TopicPartition
from compactord.listener.view import LedgerAnswer, ListenerMetrics, PartitionRead, TopicView

__all__ = ["CLUSTER_ID", "NODE_ID", "Handlers", "Session"]

T = TypeVar("T")

log = logging.getLogger(__name__)

NODE_ID = 0
CLUSTER_ID = "compactord"
# A fetch's answer holds at most this many bytes of records, whatever the client asks (at least one record).
MAX_FETCH_BYTES = 64 * 1024 * 1024
# How long the broker's latest offsets, the high watermark of an answer from a ledger, are kept.
LATEST_TTL_S = 1.0
_EARLIEST, _LATEST = -2, -1
# The wait of a relayed fetch that goes with a ledger's answer (which is not held back for it): 1 ms, not 0, which
# the test broker (Tansu) answers with no partitions at all; Kafka answers either at once with what it has.
NO_WAIT_MS = 1


@dataclass
class Session:
    """One connection's state: the address it reached the listener at, the ledger each topic is pinned to
    until the client reads past the horizon (a switch mid-read never mixes two ledgers), and its own connections
    to the broker for its group requests and its fetches."""

    host: str
    port: int
    pins: dict[str, int] = field(default_factory=dict)
    groups: GroupLinks = field(default_factory=GroupLinks)
    fetches: FetchLinks = field(default_factory=FetchLinks)

    def close(self) -> None:
        self.groups.close()
        self.fetches.close()


class Handlers:
    def __init__(self, view: TopicView, relay: BrokerRelay, executor: Executor, metrics: ListenerMetrics) -> None:
        self._view = view
        self._metrics = metrics
        self._relay = relay
        self._groups = GroupRelay(relay)
        self._executor = executor
        self._latest: dict[tuple[TopicPartition, int], tuple[float, int]] = {}

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def answer(self, request: Request, session: Session) -> bytes:
        if request.api_key in GROUPS:
            return await self._groups.answer(request, session.groups, session.host, session.port)
        if request.api_key == ApiKey.Fetch:
            with self._metrics.listener_fetch_seconds.time():
                return await self.fetch(request, session)
        served = {ApiKey.Metadata: self.metadata, ApiKey.ListOffsets: self.list_offsets}
        return await served[ApiKey(request.api_key)](request, session)

    # -- Metadata ---------------------------------------------------------------------------------

    async def metadata(self, request: Request, session: Session) -> bytes:
        body, rc = request.body, request.response_class
        wanted: list[str] | None = None if body.topics is None else [t.name for t in body.topics]
        if request.version == 0 and not wanted:  # v0: an empty list asks for every topic
            wanted = None
        errors: dict[str, int] = {}
        names: list[str] = wanted or []
        if wanted is None:
            try:
                names = await self._call(self._view.topics)
            except BrokerUnavailable:
                names = []
        topics = []
        for name in names:
            partitions: list[int] = []
            try:
                partitions = await self._call(self._view.partitions, name)
            except TopicNotFound:
                errors[name] = ERRORS["UNKNOWN_TOPIC_OR_PARTITION"]
            except BrokerUnavailable:
                errors[name] = ERRORS["LEADER_NOT_AVAILABLE"]
            topics.append(item(rc, "topics", error_code=errors.get(name, 0), name=name, is_internal=False,
                               partitions=[
                item(rc, "topics.partitions", error_code=0, partition_index=p, leader_id=NODE_ID, leader_epoch=-1,
                     replica_nodes=[NODE_ID], isr_nodes=[NODE_ID], offline_replicas=[]) for p in partitions]))
        response = rc(throttle_time_ms=0, brokers=[item(rc, "brokers", node_id=NODE_ID, host=session.host,
                                                        port=session.port, rack=None)],
                      cluster_id=CLUSTER_ID, controller_id=NODE_ID, topics=topics)
        return encode_response(request, response)

    # -- ListOffsets ------------------------------------------------------------------------------

    async def list_offsets(self, request: Request, session: Session) -> bytes:
        body, rc = request.body, request.response_class
        wanted = {(t.name, p.partition_index): p.timestamp for t in body.topics for p in t.partitions}
        admitted = {tp: ts for tp, ts in wanted.items() if self._view.admits(tp[0])}
        answers = await self._relay.list_offsets(admitted, body.isolation_level or 0) if admitted else {}
        topics = []
        for topic in body.topics:
            partitions = []
            for p in topic.partitions:
                tp = (topic.name, p.partition_index)
                answer = answers.get(tp)
                if answer is None:
                    error, timestamp, offset = ERRORS["UNKNOWN_TOPIC_OR_PARTITION"], -1, -1
                else:
                    error, timestamp, offset = answer.error_code, answer.timestamp, answer.offset
                if error == 0 and p.timestamp == _EARLIEST:
                    first = await self._call(self._view.first_offset, *tp)
                    offset = first if first is not None else offset
                partitions.append(item(rc, "topics.partitions", partition_index=p.partition_index, error_code=error,
                                       timestamp=timestamp, offset=offset, leader_epoch=-1))
            topics.append(item(rc, "topics", name=topic.name, partitions=partitions))
        return encode_response(request, rc(throttle_time_ms=0, topics=topics))

    # -- Fetch ------------------------------------------------------------------------------------

    async def fetch(self, request: Request, session: Session) -> bytes:
        body = request.body
        isolation = body.isolation_level or 0
        unknown: set[TopicPartition] = set()
        legs: dict[TopicPartition, Leg] = {}
        below: list[tuple[str, PartitionRead]] = []  # at or below the horizon, or not known to be past it
        for topic in body.topics:
            if not self._view.admits(topic.topic):
                unknown.update((topic.topic, p.partition) for p in topic.partitions)
                continue
            for p in topic.partitions:
                # Past the horizon as known from memory (the tail of the log, fetched again and again): relayed
                # without a trip through the executor.
                if self._view.relays(topic.topic, p.partition, p.fetch_offset, session.pins.get(topic.topic)):
                    legs[(topic.topic, p.partition)] = Leg(p.fetch_offset, p.partition_max_bytes)
                else:
                    below.append((topic.topic, PartitionRead(p.partition, p.fetch_offset, p.partition_max_bytes)))
        # The broker's latest offsets (the high watermark of a ledger's answer) are asked while the ledger is read.
        latest_task = asyncio.ensure_future(self._latest_offsets([(t, r.partition) for t, r in below], isolation)) \
            if below else None
        try:
            served, failed, skipped, budget = await self._read_ledgers(below, session, legs,
                                                                       max(1, min(body.max_bytes, MAX_FETCH_BYTES)))
        except BaseException:
            if latest_task is not None:
                latest_task.cancel()
            raise
        for topic in body.topics:
            if all((topic.topic, p.partition) in legs for p in topic.partitions):
                session.pins.pop(topic.topic, None)  # past the horizon everywhere: the next read takes the current
        latest = await latest_task if latest_task is not None else {}
        # The live log after a ledger's answer that reaches the horizon, unless the broker shows nothing after it.
        tails: dict[TopicPartition, Leg] = {}
        for tp, (answer, partition_max_bytes) in served.items():
            left = min(partition_max_bytes - len(answer.records), budget)
            if left > 0 and _end_offset(answer.records) == answer.horizon + 1 \
                    and (tp not in latest or latest[tp] > answer.horizon + 1):
                tails[tp] = Leg(answer.horizon + 1, left)
        relayed: dict[TopicPartition, FetchedPartition] = {}
        if legs or tails:
            relayed = await self._relay.fetch({**legs, **tails}, max_wait_ms=NO_WAIT_MS if served else body.max_wait_ms,
                                              min_bytes=0 if served else body.min_bytes,
                                              max_bytes=max(1, budget), isolation_level=isolation,
                                              links=session.fetches)
        self._metrics.listener_bytes.labels(source="ledger").inc(sum(len(a.records) for a, _ in served.values()))
        self._metrics.listener_bytes.labels(source="relay").inc(sum(len(a.records or b"") for a in relayed.values()))
        responses = []
        for topic in body.topics:
            partitions = []
            for p in topic.partitions:
                tp = (topic.topic, p.partition)
                if tp in served:
                    partitions.append(_from_ledger(p.partition, served[tp][0], latest.get(tp), isolation,
                                                   relayed.get(tp)))
                elif tp in relayed:
                    partitions.append(relayed[tp])  # as the broker answered it, its record set spliced in
                elif tp in skipped and tp in latest:
                    # No room left in the answer (as a broker leaves a partition out past a fetch's bytes): no
                    # records, the log's end, so the client asks again.
                    partitions.append(FetchedPartition(p.partition, 0, latest[tp], latest[tp], -1,
                                                       () if isolation else None, b""))
                else:
                    error = "UNKNOWN_TOPIC_OR_PARTITION" if tp in unknown \
                        else "KAFKA_STORAGE_ERROR" if tp in failed else "LEADER_NOT_AVAILABLE"
                    partitions.append(FetchedPartition(p.partition, ERRORS[error]))
            responses.append((topic.topic, partitions))
        return encode_fetch(request.version, request.correlation_id, responses)

    async def _read_ledgers(self, below: list[tuple[str, PartitionRead]], session: Session,
                            legs: dict[TopicPartition, Leg], budget: int
                            ) -> tuple[dict[TopicPartition, tuple[LedgerAnswer, int]], set[TopicPartition],
                                       set[TopicPartition], int]:
        """The ledgers' answers to the partitions of ``below`` (in the request's order, a topic's from one
        ledger), within ``budget`` bytes; a partition the ledger does not serve joins ``legs`` (relayed). Returns
        the answers (each with the request's ``partition_max_bytes``), the partitions that failed, those left out
        for want of room in the answer, and the budget left."""
        served: dict[TopicPartition, tuple[LedgerAnswer, int]] = {}
        failed: set[TopicPartition] = set()
        skipped: set[TopicPartition] = set()
        by_topic: dict[str, list[PartitionRead]] = {}
        for topic, read in below:
            by_topic.setdefault(topic, []).append(read)
        for topic, reads in by_topic.items():
            if budget <= 0:
                skipped.update((topic, read.partition) for read in reads)
                continue
            try:
                found = await self._call(self._view.read_partitions, topic, reads, session.pins.get(topic), budget)
            except CompactordError as exc:  # the store down: the topic's ledger could not be looked up; retried
                log.warning("Kafka listener: %s not read: %s", topic, exc)
                failed.update((topic, read.partition) for read in reads)
                continue
            budget -= found.spent
            skipped.update((topic, partition) for partition in found.unread)
            for read in reads:
                tp = (topic, read.partition)
                answer = found.answers.get(read.partition)
                if isinstance(answer, CompactordError):  # the store down, a ledger failing its check: retried
                    log.warning("Kafka listener: partition %d of %s not read: %s", read.partition, topic, answer)
                    failed.add(tp)
                elif answer is not None:
                    served[tp] = (answer, read.max_bytes)
                    session.pins[topic] = answer.ledger_id
                elif tp not in skipped:
                    legs[tp] = Leg(read.offset, read.max_bytes)
        return served, failed, skipped, budget

    async def _latest_offsets(self, tps: list[TopicPartition], isolation: int) -> dict[TopicPartition, int]:
        """The broker's latest offsets of ``tps`` (kept ``LATEST_TTL_S``); a partition the broker did not answer
        for is left out."""
        now = time.monotonic()
        found = {tp: kept[1] for tp in tps if (kept := self._latest.get((tp, isolation))) and now - kept[0] < LATEST_TTL_S}
        missing = [tp for tp in tps if tp not in found]
        if missing:
            answers = await self._relay.list_offsets(dict.fromkeys(missing, _LATEST), isolation)
            for tp, answer in answers.items():
                if answer.error_code == 0:
                    found[tp] = answer.offset
                    self._latest[(tp, isolation)] = (now, answer.offset)
        return found


def _from_ledger(partition: int, answer: LedgerAnswer, latest: int | None, isolation: int,
                 tail: FetchedPartition | None) -> FetchedPartition:
    # The high watermark is the broker's (a consumer's lag and end of partition are the log's); at least the offset
    # after the horizon, which the ledger's answer carries the consumer to.
    end = max(latest if latest is not None else -1, answer.horizon + 1)
    stable = end
    aborted: tuple[tuple[int, int], ...] | None = () if isolation else None
    records = answer.records
    # The live log after the horizon, as the broker answered it, unless it failed or starts at or below the horizon
    # (a batch across it would give the ledger's records again).
    if tail is not None and tail.error_code == 0 and _base_offset(tail.records) > answer.horizon:
        records += tail.records or b""
        end, stable, aborted = tail.high_watermark, tail.last_stable_offset, tail.aborted_transactions
    return FetchedPartition(partition, 0, end, stable, answer.log_start, aborted, records)


def _base_offset(records: bytes | None) -> int:
    """The base offset of the first batch of ``records``; -1 for none."""
    batch = MemoryRecords(records or b"").next_batch()
    return -1 if batch is None else int(batch.base_offset)


def _end_offset(records: bytes) -> int:
    """The offset after the last batch of ``records`` (a ledger's answer, a few batches); -1 for none."""
    batches, end = MemoryRecords(records), -1
    while (batch := batches.next_batch()) is not None:
        end = batch.next_offset
    return end
