"""The listener's way to the real broker: what lies past a topic's horizon is fetched from the partition's leader
and its record batches returned as they are (compression, transaction markers and the aborted-transactions list
included; the answer read by ``fetch_frames``, its record sets never decoded), as are the offsets the broker alone
knows (ListOffsets).

One connection per broker node, requests pipelined on it (a broker answers a connection's requests in order, so
the answers are matched to the requests first in, first out); a connection that fails fails its requests in
flight and is opened again by the next one. A client's fetches go on connections of the client connection's own
(``FetchLinks``, at most one per leader: ``kafkaMaxConnections`` bounds them): a fetch the broker holds for its
``max_wait_ms`` (a client at the end of the log) would hold every request behind it on a shared connection, other
clients' fetches and the listener's offsets included. The partitions' leaders come from a Metadata request, kept
until a leader is refused or for ``LEADERS_TTL_S``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import struct
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kafka.protocol.api_key import ApiKey
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)

from compactord.errors import BrokerUnavailable
from compactord.listener.fetch_frames import FetchedPartition, MalformedAnswer, parse_fetch
from compactord.listener.protocol import ERRORS, item

__all__ = ["BrokerRelay", "FetchLinks", "Leg", "Link", "TopicPartition"]

log = logging.getLogger(__name__)

LEADERS_TTL_S = 30.0
# The versions asked of the broker (the highest below these that it supports): Fetch by topic name with the
# aborted transactions, ListOffsets with leader epochs, Metadata with leader epochs, FindCoordinator of one key.
_WANTED = {ApiKey.Fetch: 12, ApiKey.ListOffsets: 7, ApiKey.Metadata: 9, ApiKey.FindCoordinator: 3}
_MIN = {ApiKey.Fetch: 4, ApiKey.ListOffsets: 1, ApiKey.Metadata: 1, ApiKey.FindCoordinator: 0}
_SIZE = struct.Struct(">i")
_MAX_ANSWER_BYTES = 256 * 1024 * 1024

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Leg:
    """One partition's part of a relayed fetch."""

    offset: int
    max_bytes: int


class Link:
    """One connection to one broker node, with requests pipelined (or, for a consumer group's requests, which the
    coordinator may hold for a rebalance, one client connection's requests in the order it sent them)."""

    def __init__(self, host: str, port: int, client_id: str, timeout_s: float) -> None:
        self.host, self.port = host, port
        self._client_id = client_id
        self._timeout_s = timeout_s
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._pending: collections.deque[tuple[asyncio.Future[Any], Any, int]] = collections.deque()
        self._lock = asyncio.Lock()
        self._correlation = 0
        self.versions: dict[int, int] = {}

    async def _connect(self) -> None:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), self._timeout_s)
        self._writer = writer
        self._reader_task = asyncio.get_running_loop().create_task(self._read(reader, writer))
        answer = await self._send(ApiVersionsRequest[0](), ApiVersionsResponse, 0)
        self.versions = {k.api_key: k.max_version for k in answer.api_keys}

    def version(self, key: ApiKey) -> int:
        """The version of ``key`` to send: the highest the broker and the listener both speak.

        :raises BrokerUnavailable: the broker speaks none that the listener does."""
        version = min(_WANTED[key], self.versions.get(int(key), -1))
        if version < _MIN[key]:
            raise BrokerUnavailable(f"the broker at {self.host}:{self.port} does not serve {key.name} "
                                    f"v{_MIN[key]} or later")
        return version

    async def request(self, message: Any, response_class: Any, key: ApiKey) -> Any:
        """Send ``message`` at the version of ``key`` the broker and the listener both speak; its response.

        :raises BrokerUnavailable: the broker did not answer, or speaks no version the listener does."""
        await self._open()
        return await self._send(message, response_class, self.version(key))

    async def exchange(self, message: Any, key: ApiKey) -> tuple[int, bytes]:
        """``request``, its answer's frame (header and body) as it is, with the version it was sent at."""
        await self._open()
        version = self.version(key)
        return version, await self._send(message, None, version)

    async def relay(self, frame: bytes, timeout_s: float) -> bytes:
        """A client's request frame (its size prefix taken off) sent as it is, under a correlation id of this
        connection; the broker's answer as it is, with the client's correlation id put back.

        :raises BrokerUnavailable: the broker did not answer within ``timeout_s``."""
        await self._open()
        own = self._next_correlation()
        future = self._enqueue(None, 0)
        assert self._writer is not None
        self._writer.write(_SIZE.pack(len(frame)) + frame[:4] + _SIZE.pack(own) + frame[8:])
        answer: bytes = await self._wait(future, timeout_s)
        return _SIZE.pack(len(answer)) + frame[4:8] + answer[4:]

    async def _open(self) -> None:
        if self._writer is None or self._writer.is_closing():
            async with self._lock:
                if self._writer is None or self._writer.is_closing():
                    try:
                        await self._connect()
                    except (TimeoutError, OSError) as exc:
                        self.close()
                        raise BrokerUnavailable(f"the broker at {self.host}:{self.port} is unreachable: "
                                                f"{exc!r}") from exc

    def _next_correlation(self) -> int:
        self._correlation = (self._correlation + 1) % 2**31
        return self._correlation

    def _enqueue(self, response_class: Any, version: int) -> asyncio.Future[Any]:
        """The future of the next answer; ``response_class`` None: the answer's frame as it is."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((future, response_class, version))
        return future

    async def _send(self, message: Any, response_class: Any, version: int) -> Any:
        writer = self._writer
        assert writer is not None
        message.with_header(correlation_id=self._next_correlation(), client_id=self._client_id)
        frame = message.encode(version=version, header=True, framed=True)
        future = self._enqueue(response_class, version)
        writer.write(frame)
        return await self._wait(future, self._timeout_s)

    async def _wait(self, future: asyncio.Future[Any], timeout_s: float) -> Any:
        assert self._writer is not None
        try:
            await self._writer.drain()
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except (TimeoutError, OSError) as exc:
            self.close()
            raise BrokerUnavailable(f"the broker at {self.host}:{self.port} did not answer: {exc!r}") from exc

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (size,) = _SIZE.unpack(await reader.readexactly(_SIZE.size))
                if not 0 < size <= _MAX_ANSWER_BYTES:
                    raise ConnectionError(f"an answer of {size} bytes")
                frame = await reader.readexactly(size)
                future, response_class, version = self._pending.popleft()
                if not future.done():
                    future.set_result(frame if response_class is None
                                      else response_class.decode(frame, version=version, header=True))
        except (OSError, asyncio.IncompleteReadError, IndexError, ValueError) as exc:
            self._fail(ConnectionError(f"the connection to {self.host}:{self.port} ended: {exc!r}"))
        finally:
            writer.close()

    def _fail(self, exc: BaseException) -> None:
        while self._pending:
            future = self._pending.popleft()[0]
            if not future.done():
                future.set_exception(exc)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
        self._fail(ConnectionError(f"the connection to {self.host}:{self.port} was closed"))
        self._writer = None


class FetchLinks:
    """One client connection's connections to the partitions' leaders for its fetches, closed with it. The client
    waits for each answer before it sends its next request (the listener answers a connection's requests in
    order), so each of these holds at most one fetch: none waits behind another client's."""

    def __init__(self) -> None:
        self.links: dict[tuple[str, int], Link] = {}

    def close(self) -> None:
        for link in self.links.values():
            link.close()
        self.links.clear()


class BrokerRelay:
    """The real broker, as the listener's event loop reaches it (every method runs on that loop)."""

    def __init__(self, bootstrap: str, client_id: str, timeout_s: float) -> None:
        self._bootstrap = [(h, int(p)) for h, _, p in (s.rpartition(":") for s in bootstrap.split(","))]
        self._client_id = client_id
        self._timeout_s = timeout_s
        self._links: dict[tuple[str, int], Link] = {}
        self._nodes: dict[int, tuple[str, int]] = {}
        self._leaders: dict[TopicPartition, int] = {}
        self._leaders_at = 0.0
        self._coordinators: dict[str, tuple[str, int]] = {}
        self._down: str | None = None  # why relayed requests fail now (logged once until one is answered)

    def _failing(self, what: str, exc: Exception) -> None:
        """A relayed request found the broker down: one log line until one is answered again."""
        self._forget_leaders()
        if self._down is None:
            log.warning("Kafka listener: %s: the broker does not answer (%s); relayed fetches and offsets answer "
                        "LEADER_NOT_AVAILABLE or NOT_LEADER_OR_FOLLOWER, which clients retry, until it does", what,
                        exc)
        self._down = str(exc)

    def _answered(self) -> None:
        if self._down is not None:
            log.info("Kafka listener: the broker answers relayed requests again")
            self._down = None

    def _link(self, address: tuple[str, int]) -> Link:
        if address not in self._links:
            self._links[address] = Link(*address, self._client_id, self._timeout_s)
        return self._links[address]

    def close(self) -> None:
        for link in self._links.values():
            link.close()
        self._links.clear()

    def new_link(self, address: tuple[str, int]) -> Link:
        """A connection of its own to ``address``, for its caller to close."""
        return Link(*address, self._client_id, self._timeout_s)

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    async def coordinator(self, group: str) -> tuple[str, int]:
        """The address of ``group``'s coordinator, as the broker last named it (``forget_coordinator`` to ask
        again).

        :raises BrokerUnavailable: no broker answered, or none is the group's coordinator now."""
        if group not in self._coordinators:
            answer = await self._any(FindCoordinatorRequest(key=group, key_type=0), FindCoordinatorResponse,
                                     ApiKey.FindCoordinator)
            if answer.error_code != 0:
                raise BrokerUnavailable(f"the broker names no coordinator of group {group!r} "
                                        f"(error {answer.error_code})")
            self._coordinators[group] = (answer.host, answer.port)
        return self._coordinators[group]

    def any_node(self) -> tuple[str, int]:
        """The address of a broker node (one the broker named, else the first bootstrap server)."""
        return next(iter(self._nodes.values()), self._bootstrap[0])

    def forget_coordinator(self, group: str) -> None:
        self._coordinators.pop(group, None)

    async def _any(self, message: Any, response_class: Any, key: ApiKey) -> Any:
        """``message`` sent to a known node, else to each bootstrap server in turn."""
        problems = []
        for address in [*self._nodes.values(), *self._bootstrap]:
            link = self._link(address)
            try:
                return await link.request(message, response_class, key)
            except BrokerUnavailable as exc:
                problems.append(str(exc))
        raise BrokerUnavailable("; ".join(problems) or "no broker to ask")

    async def _refresh_leaders(self, topics: Iterable[str]) -> None:
        request = MetadataRequest(topics=[item(MetadataRequest, "topics", name=t) for t in sorted(set(topics))],
                                  allow_auto_topic_creation=False)
        answer = await self._any(request, MetadataResponse, ApiKey.Metadata)
        self._nodes = {b.node_id: (b.host, b.port) for b in answer.brokers}
        for topic in answer.topics:
            for partition in topic.partitions:
                self._leaders[(topic.name, partition.partition_index)] = partition.leader_id
        self._leaders_at = time.monotonic()

    async def _by_leader(self, wanted: Iterable[TopicPartition]) -> dict[int, list[TopicPartition]]:
        """``wanted`` grouped by leader (-1: no leader known)."""
        wanted = list(wanted)
        if time.monotonic() - self._leaders_at > LEADERS_TTL_S or any(tp not in self._leaders for tp in wanted):
            await self._refresh_leaders(t for t, _ in wanted)
        groups: dict[int, list[TopicPartition]] = collections.defaultdict(list)
        for tp in wanted:
            leader = self._leaders.get(tp, -1)
            groups[leader if leader in self._nodes else -1].append(tp)
        return groups

    def _forget_leaders(self) -> None:
        self._leaders_at = 0.0

    async def fetch(self, legs: Mapping[TopicPartition, Leg], *, max_wait_ms: int, min_bytes: int,
                    max_bytes: int, isolation_level: int, links: FetchLinks | None = None
                    ) -> dict[TopicPartition, FetchedPartition]:
        """Each partition's answer from its leader, as the broker gave it (its record set as the broker sent it);
        a partition whose leader is unknown or down answers ``LEADER_NOT_AVAILABLE`` or
        ``NOT_LEADER_OR_FOLLOWER``, which a client retries. Sent on ``links`` (the client connection's own), or
        without them on the connection shared with the listener's own requests."""
        answers: dict[TopicPartition, FetchedPartition] = {}
        try:
            groups = await self._by_leader(legs)
        except BrokerUnavailable as exc:
            self._failing("a relayed fetch", exc)
            groups = {-1: list(legs)}
        calls = []
        for leader, tps in groups.items():
            if leader == -1:
                answers.update({tp: FetchedPartition(tp[1], ERRORS["LEADER_NOT_AVAILABLE"]) for tp in tps})
                continue
            by_topic: dict[str, list[int]] = collections.defaultdict(list)
            for topic, partition in tps:
                by_topic[topic].append(partition)
            request = FetchRequest(
                replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
                isolation_level=isolation_level, session_id=0, session_epoch=-1, forgotten_topics_data=[],
                rack_id="", topics=[item(FetchRequest, "topics", topic=topic, partitions=[
                    item(FetchRequest, "topics.partitions", partition=p, fetch_offset=legs[(topic, p)].offset,
                         partition_max_bytes=legs[(topic, p)].max_bytes, log_start_offset=-1,
                         current_leader_epoch=-1, last_fetched_epoch=-1) for p in parts])
                    for topic, parts in by_topic.items()])
            calls.append((tps, self._leader_link(leader, links).exchange(request, ApiKey.Fetch)))
        for tps, call in calls:
            try:
                version, frame = await call
                answer = parse_fetch(frame, version)
            except (BrokerUnavailable, MalformedAnswer) as exc:
                self._failing("a relayed fetch", exc)
                answers.update({tp: FetchedPartition(tp[1], ERRORS["NOT_LEADER_OR_FOLLOWER"]) for tp in tps})
                continue
            self._answered()
            answers.update(answer)
            if any(p.error_code == ERRORS["NOT_LEADER_OR_FOLLOWER"] for p in answer.values()):
                self._forget_leaders()
        return answers

    async def list_offsets(self, wanted: Mapping[TopicPartition, int], isolation_level: int
                           ) -> dict[TopicPartition, Any]:
        """Per partition, the broker's answer for the timestamp asked (-1 latest, -2 earliest, else the first
        offset at or after that time): its ``ListOffsetsPartitionResponse``."""
        answers: dict[TopicPartition, Any] = {}
        try:
            groups = await self._by_leader(wanted)
        except BrokerUnavailable as exc:
            self._failing("relayed offsets", exc)
            groups = {-1: list(wanted)}
        for leader, tps in groups.items():
            by_topic: dict[str, list[int]] = collections.defaultdict(list)
            for topic, partition in tps:
                by_topic[topic].append(partition)
            request = ListOffsetsRequest(replica_id=-1, isolation_level=isolation_level, topics=[
                item(ListOffsetsRequest, "topics", name=topic, partitions=[
                    item(ListOffsetsRequest, "topics.partitions", partition_index=p, current_leader_epoch=-1,
                         timestamp=wanted[(topic, p)]) for p in parts]) for topic, parts in by_topic.items()])
            try:
                if leader == -1:
                    raise BrokerUnavailable("no leader known")
                answer = await self._leader_link(leader).request(request, ListOffsetsResponse, ApiKey.ListOffsets)
            except BrokerUnavailable as exc:
                self._failing("relayed offsets", exc)
                answers.update({tp: item(ListOffsetsResponse, "topics.partitions", partition_index=tp[1],
                                         error_code=ERRORS["LEADER_NOT_AVAILABLE"], timestamp=-1, offset=-1,
                                         leader_epoch=-1) for tp in tps})
                continue
            self._answered()
            for topic in answer.topics:
                for partition in topic.partitions:
                    answers[(topic.name, partition.partition_index)] = partition
        return answers

    def _leader_link(self, leader: int, links: FetchLinks | None = None) -> Link:
        """The connection to ``leader``: the client connection's own (``links``), else the shared one."""
        address = self._nodes[leader]
        if links is None:
            return self._link(address)
        return links.links.get(address) or links.links.setdefault(address, self.new_link(address))
