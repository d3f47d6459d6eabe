"""CompactedReader: ledger up to the horizon, then the live tail; event-time apply_strategy.

A real broker, a real Spark session and the daemon's real HTTP API (uvicorn in a thread).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from compactord.client import CompactedReader
from compactord.daemon.core import Daemon
from compactord.daemon.server import ThreadedServer
from tests.conftest import settings_for
from tests.support.service import succeeded
from tests.support.timeouts import READY_TIMEOUT_S
from tests.support.waiting import wait_for


@pytest.fixture
def daemon_api(broker, spark_manager, tmp_path: Path):
    started: list[tuple[Daemon, ThreadedServer]] = []

    def start(**overrides: Any) -> tuple[Daemon, ThreadedServer]:
        settings = settings_for(broker, tmp_path / f"root{len(started)}", threshold_bytes=0, **overrides)
        daemon = Daemon(settings, spark=spark_manager)
        daemon.start()
        server = ThreadedServer(daemon).start()
        started.append((daemon, server))
        wait_for(lambda: not daemon.readiness_problems(), READY_TIMEOUT_S,
                 "the daemon to be ready", interval=0.2)
        return daemon, server

    yield start
    for daemon, server in started:
        server.stop()
        daemon.shutdown()


def compact(daemon: Daemon, topic: str) -> None:
    succeeded(daemon.registry.trigger(topic))


def read_all(reader: CompactedReader) -> list[tuple[int, int, bytes | None, bytes | None]]:
    return [(e.partition, e.offset, e.key, e.value) for e in reader]


def test_reader_yields_ledger_then_tail_with_tombstones(kafka, daemon_api):
    daemon, server = daemon_api()
    topic = kafka.topic(partitions=2)
    kafka.produce(topic, [("a", "1", 0), ("b", "1", 1), ("a", "2", 0), ("c", "1", 0), ("c", None, 0)])
    compact(daemon, topic)
    kafka.produce(topic, [("a", "3", 0), ("b", None, 1), ("d", "1", 1)])
    reader = CompactedReader(kafka.bootstrap, topic, url=server.url, page_size=1)
    got = read_all(reader)
    assert got == [
        (0, 1, b"a", b"2"),  # ledger of partition 0 (c was deleted)
        (1, 0, b"b", b"1"),  # ledger of partition 1
        (0, 4, b"a", b"3"),  # tail of partition 0
        (1, 1, b"b", None), (1, 2, b"d", b"1"),  # tail of partition 1, tombstone included
    ]
    assert reader.ledger_entries == 2 and reader.tail_records == 3
    state: dict[bytes, bytes] = {}
    for _, _, key, value in got:
        if value:
            state[key] = value
        else:
            state.pop(key, None)
    assert state == {b"a": b"3", b"d": b"1"}


def test_reader_before_any_compaction_reads_the_raw_topic(kafka, daemon_api):
    _, server = daemon_api()
    topic = kafka.topic()
    kafka.produce(topic, [("a", "1"), ("a", "2")])
    assert read_all(CompactedReader(kafka.bootstrap, topic, url=server.url)) == [(0, 0, b"a", b"1"), (0, 1, b"a", b"2")]


def test_reader_apply_strategy_event_time_respects_markers(kafka, daemon_api):
    daemon, server = daemon_api(compaction_strategy="event-time", compaction_event_time_source="header:et")
    topic = kafka.topic()
    et = lambda n: [("et", str(n).encode())]
    kafka.produce(topic, [("a", "v10", 0, None, et(10)), ("gone", "x", 0, None, et(5)), ("gone", None, 0, None, et(9))])
    compact(daemon, topic)
    kafka.produce(topic, [("a", "stale", 0, None, et(3)), ("gone", "late", 0, None, et(7)),
                          ("a", "fresh", 0, None, et(12)), ("gone", "newer", 0, None, et(11))])
    plain = read_all(CompactedReader(kafka.bootstrap, topic, url=server.url, event_time_source="header:et"))
    assert [v for *_, v in plain] == [b"v10", b"stale", b"late", b"fresh", b"newer"]
    applied = read_all(CompactedReader(kafka.bootstrap, topic, url=server.url, apply_strategy=True,
                                       event_time_source="header:et"))
    # "stale" loses to the ledger's v10; "late" loses to the ledger's deletion marker (event time 9)
    assert [v for *_, v in applied] == [b"v10", b"fresh", b"newer"]
