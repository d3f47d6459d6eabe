"""The listener's Fetch answers (``Handlers.fetch``) against the real test broker, the daemon's ledgers a stand-in
(``tests/support/ledger_host.py``): a fetch past the horizon of the current ledger, once the view knows it, is
relayed with no call to the listener's executor and no look-up of the ledger; a switch is seen by the next fetch,
which the new ledger answers; a relayed partition's answer is the broker's (its records byte for byte, its error
code, offsets and aborted transactions), at every Fetch version the listener serves; a ledger's answer that
reaches the horizon carries the live log after it, and relays nothing when the broker has nothing after it."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from kafka.protocol.api_key import ApiKey
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.record.memory_records import MemoryRecords

from compactord.daemon.metrics import Metrics
from compactord.listener.batches import BatchCache
from compactord.listener.handlers import Handlers, Session
from compactord.listener.protocol import SERVED, decode_request, item
from compactord.listener.relay import BrokerRelay
from compactord.listener.view import TopicView
from compactord.model import Entry
from tests.conftest import Kafka
from tests.support.ledger_host import LedgerHost, Ledgers

_SIZE = struct.Struct(">i")
VERSIONS = sorted({*SERVED[ApiKey.Fetch], 7, 11})  # the lowest and highest served, and between


class CountingExecutor(ThreadPoolExecutor):
    """The listener's executor, counting what is handed to it."""

    def __init__(self) -> None:
        super().__init__(max_workers=2, thread_name_prefix="test-listener")
        self.calls = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.calls += 1
        return super().submit(fn, *args, **kwargs)


@pytest.fixture
def executor() -> Iterator[CountingExecutor]:
    pool = CountingExecutor()
    try:
        yield pool
    finally:
        pool.shutdown(wait=True)


def _request(topic: str, offset: int, version: int) -> bytes:
    """A Fetch of partition 0 of ``topic`` from ``offset``, framed."""
    request = FetchRequest(replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                           session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
                           topics=[item(FetchRequest, "topics", topic=topic, partitions=[
                               item(FetchRequest, "topics.partitions", partition=0, fetch_offset=offset,
                                    partition_max_bytes=1 << 20, log_start_offset=-1, current_leader_epoch=-1,
                                    last_fetched_epoch=-1)])])
    request.with_header(correlation_id=7, client_id="test")
    return bytes(request.encode(version=version, header=True, framed=True))


def _partition(frame: bytes, version: int) -> Any:
    """The one partition of a Fetch answer (framed)."""
    answer = FetchResponse.decode(frame[_SIZE.size:], version=version, header=True)
    ((partition,),) = [t.partitions for t in answer.responses]
    return partition


def _from_broker(bootstrap: str, topic: str, offset: int, version: int) -> Any:
    host, _, port = bootstrap.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock, sock.makefile("rb") as stream:
        sock.sendall(_request(topic, offset, version))
        (size,) = _SIZE.unpack(stream.read(_SIZE.size))
        return _partition(_SIZE.pack(size) + stream.read(size), version)


def _offsets_values(records: bytes | None) -> list[tuple[int, bytes | None]]:
    batches, found = MemoryRecords(records or b""), []
    while (batch := batches.next_batch()) is not None:
        found += [(r.offset, r.value) for r in batch]
    return found


class CountingRelay(BrokerRelay):
    """The real broker, counting the relayed fetches."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(bootstrap, "test-listener", 30.0)
        self.fetches = 0

    async def fetch(self, *args: Any, **kwargs: Any) -> Any:
        self.fetches += 1
        return await super().fetch(*args, **kwargs)


class Listener:
    """``Handlers`` over the stand-in ledgers and the real broker, one client connection's session."""

    def __init__(self, bootstrap: str, ledgers: Ledgers, executor: CountingExecutor) -> None:
        self.relay = CountingRelay(bootstrap)
        self.handlers = Handlers(TopicView(LedgerHost(ledgers), BatchCache()),  # type: ignore[arg-type]
                                 self.relay, executor, Metrics())
        self.session = Session("127.0.0.1", 9092)

    async def fetch(self, topic: str, offset: int, version: int) -> Any:
        answer = await self.handlers.answer(decode_request(_request(topic, offset, version)[_SIZE.size:]),
                                            self.session)
        return _partition(answer, version)

    def close(self) -> None:
        self.session.close()
        self.relay.close()


def _topic(kafka: Kafka) -> str:
    """A topic of 10 records (keys ``k<offset>``, values ``log-<offset>``), each a batch of its own: a fetch from
    an offset is answered from that offset's batch on."""
    topic = kafka.topic(prefix="lfetch")
    with kafka.producer() as producer:
        for i in range(10):
            producer.send(topic, key=f"k{i}".encode(), value=f"log-{i}".encode(), partition=0)
            producer.flush()
    return topic


def _run(bootstrap: str, ledgers: Ledgers, executor: CountingExecutor,
         scenario: Callable[[Listener], Any]) -> None:
    async def main() -> None:
        listener = Listener(bootstrap, ledgers, executor)
        try:
            await scenario(listener)
        finally:
            listener.close()

    asyncio.run(main())


def test_past_the_horizon_a_fetch_is_relayed_without_the_executor_and_a_switch_is_seen_at_once(
        kafka: Kafka, executor: CountingExecutor) -> None:
    topic = _topic(kafka)
    ledgers = Ledgers(topic)
    ledgers.add(1, [Entry(0, i, f"k{i}".encode(), f"ledger-1-{i}".encode(), timestamp=1) for i in range(5)],
                horizon={0: 4})

    async def scenario(listener: Listener) -> None:
        first = await listener.fetch(topic, 5, 11)  # the view learns the current ledger: one read
        assert first.error_code == 0 and _offsets_values(first.records)[0] == (5, b"log-5")
        calls, infos = executor.calls, ledgers.infos

        tail = await listener.fetch(topic, 7, 11)

        assert (executor.calls, ledgers.infos) == (calls, infos)
        assert [o for o, _ in _offsets_values(tail.records)] == [7, 8, 9]

        ledgers.add(2, [Entry(0, i, f"k{i}".encode(), f"ledger-2-{i}".encode(), timestamp=1) for i in range(8)],
                    horizon={0: 7})
        switched = await listener.fetch(topic, 7, 11)  # past the old horizon, at the new one

        assert executor.calls > calls and listener.session.pins[topic] == 2
        assert _offsets_values(switched.records)[:3] == [(7, b"ledger-2-7"), (8, b"log-8"), (9, b"log-9")]

    _run(kafka.bootstrap, ledgers, executor, scenario)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_relayed_partition_is_answered_as_the_broker_answers_it(kafka: Kafka, executor: CountingExecutor,
                                                                   version: int) -> None:
    topic = _topic(kafka)
    ledgers = Ledgers(topic)
    ledgers.add(1, [Entry(0, 0, b"k0", b"ledger-1-0", timestamp=1)], horizon={0: 2})
    fields = ("error_code", "high_watermark", "last_stable_offset", "log_start_offset", "aborted_transactions",
              "records")

    async def scenario(listener: Listener) -> None:
        for offset in (3, 6, 9, 10):  # the first learns the ledger, the others are relayed from memory
            relayed = await listener.fetch(topic, offset, version)
            direct = _from_broker(kafka.bootstrap, topic, offset, version)
            assert {f: getattr(relayed, f) for f in fields} == {f: getattr(direct, f) for f in fields}, offset

    _run(kafka.bootstrap, ledgers, executor, scenario)


def test_at_the_horizon_the_live_log_after_it_is_relayed_only_when_the_broker_has_some(
        kafka: Kafka, executor: CountingExecutor) -> None:
    topic = _topic(kafka)  # offsets 0 to 9
    ledgers = Ledgers(topic)
    ledgers.add(1, [Entry(0, i, f"k{i}".encode(), f"ledger-1-{i}".encode(), timestamp=1) for i in range(10)],
                horizon={0: 9})

    async def scenario(listener: Listener) -> None:
        at_the_end = await listener.fetch(topic, 9, 11)

        assert _offsets_values(at_the_end.records) == [(9, b"ledger-1-9")] and at_the_end.high_watermark == 10
        assert listener.relay.fetches == 0  # nothing after the horizon: no relayed fetch waited out

        ledgers.add(2, [Entry(0, i, f"k{i}".encode(), f"ledger-2-{i}".encode(), timestamp=1) for i in range(8)],
                    horizon={0: 7})
        before_the_end = await listener.fetch(topic, 7, 11)

        assert listener.relay.fetches == 1
        assert _offsets_values(before_the_end.records) == [(7, b"ledger-2-7"), (8, b"log-8"), (9, b"log-9")]

    _run(kafka.bootstrap, ledgers, executor, scenario)


def _two_partitions(topic: str, max_bytes: int) -> bytes:
    """A Fetch v11 of partitions 0 and 1 of ``topic`` from offset 0, at most ``max_bytes`` in all, framed."""
    request = FetchRequest(replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=max_bytes, isolation_level=0,
                           session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
                           topics=[item(FetchRequest, "topics", topic=topic, partitions=[
                               item(FetchRequest, "topics.partitions", partition=p, fetch_offset=0,
                                    partition_max_bytes=1 << 20, log_start_offset=-1, current_leader_epoch=-1,
                                    last_fetched_epoch=-1) for p in (0, 1)])])
    request.with_header(correlation_id=7, client_id="test")
    return bytes(request.encode(version=11, header=True, framed=True))


def test_a_partition_past_the_fetch_s_bytes_is_answered_empty_never_with_the_log_below_the_horizon(
        kafka: Kafka, executor: CountingExecutor) -> None:
    topic = kafka.topic(partitions=2, prefix="lfetch")
    with kafka.producer() as producer:
        for i in range(10):  # each a batch of its own
            for p in (0, 1):
                producer.send(topic, key=f"k{i}".encode(), value=f"log-{p}-{i}".encode(), partition=p)
            producer.flush()
    ledgers = Ledgers(topic)
    ledgers.add(1, [Entry(p, i, f"k{i}".encode(), f"ledger-{p}-{i}".encode(), timestamp=1)
                    for p in (0, 1) for i in (4, 9)], horizon={0: 9, 1: 9})

    async def scenario(listener: Listener) -> None:
        frame = await listener.handlers.answer(decode_request(_two_partitions(topic, 1)[_SIZE.size:]),
                                               listener.session)
        answer = FetchResponse.decode(frame[_SIZE.size:], version=11, header=True)
        ((first, second),) = [t.partitions for t in answer.responses]

        # The first partition has its ledger's records (at least one whatever the bytes asked); the second has no
        # room left: no records and no error, the log's end as its high watermark, so the client asks again.
        assert (first.partition_index, _offsets_values(first.records)[0]) == (0, (4, b"ledger-0-4"))
        assert (second.partition_index, second.error_code, _offsets_values(second.records), second.high_watermark) == \
            (1, 0, [], 10)

        again = await listener.fetch(topic, 0, 11)  # with room: the ledger's records
        assert _offsets_values(again.records) == [(4, b"ledger-0-4"), (9, b"ledger-0-9")]

    _run(kafka.bootstrap, ledgers, executor, scenario)
