"""CompactedReader: ledger up to the horizon, then the live tail; event-time apply_strategy.

A real broker, a real Spark session and the daemon's real HTTP API (uvicorn in a thread).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from compactord.compacted_reader import CompactedReader
from compactord.daemon.core import Daemon
from compactord.errors import InvalidArgument, TopicRecreated
from compactord.kafka.admin import KafkaAdmin
from compactord.model import Position
from compactord.server import ThreadedServer
from compactord.task import TaskState
from tests.conftest import settings_for
from tests.support.brokers import Answers
from tests.support.service import succeeded
from tests.support.timeouts import READY_TIMEOUT_S
from tests.support.waiting import wait_for


@pytest.fixture
def daemon_api(broker, spark_manager, tmp_path: Path):
    started: list[tuple[Daemon, ThreadedServer]] = []

    def start(metadata: Any = None, **overrides: Any) -> tuple[Daemon, ThreadedServer]:
        """``metadata`` wraps the real broker metadata (``tests.support.brokers.Answers``)."""
        settings = settings_for(broker, tmp_path / f"root{len(started)}", threshold_bytes=0, **overrides)
        daemon = Daemon(settings, spark=spark_manager,
                        broker=metadata(KafkaAdmin(settings)) if metadata is not None else None)
        daemon.start()
        server = ThreadedServer(daemon).start()
        started.append((daemon, server))
        wait_for(lambda: not daemon.health.readiness_problems(), READY_TIMEOUT_S,
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
    def et(n: int) -> list[tuple[str, bytes]]:
        return [("et", str(n).encode())]
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


@pytest.mark.parametrize("strategy", ["publishing-order", "first-value"])
def test_reader_apply_strategy_with_the_ledger_s_deletion_markers(kafka, daemon_api, strategy):
    """A key deleted in the ledger (a marker there) and given a value in the tail: the value is yielded, under
    publishing-order (the later record) and first-value (the first value after the deletion) alike; the
    marker itself is never yielded."""
    daemon, server = daemon_api(compaction_strategy=strategy)
    topic = kafka.topic()
    kafka.produce(topic, [("a", "1"), ("gone", "x"), ("gone", None)])
    compact(daemon, topic)
    service = daemon.registry.existing_service(topic)
    assert [(e.offset, e.key) for e in service.read_compacted_entries(Position(0, 0), 10, include_markers=True)
            if e.marker] == [(2, b"gone")]
    kafka.produce(topic, [("gone", "back"), ("gone", "again"), ("a", "2")])
    applied = read_all(CompactedReader(kafka.bootstrap, topic, url=server.url, apply_strategy=True))
    if strategy == "publishing-order":
        assert applied == [(0, 0, b"a", b"1"), (0, 3, b"gone", b"back"), (0, 4, b"gone", b"again"),
                           (0, 5, b"a", b"2")]
    else:
        assert applied == [(0, 0, b"a", b"1"), (0, 3, b"gone", b"back")]
    assert _state(applied) == ({b"a": b"2", b"gone": b"again"} if strategy == "publishing-order"
                               else {b"a": b"1", b"gone": b"back"})


def _state(entries: list[tuple[int, int, bytes | None, bytes | None]]) -> dict[bytes | None, bytes]:
    state: dict[bytes | None, bytes] = {}
    for _, _, key, value in entries:
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


def test_reader_stays_on_its_ledger_across_a_switch(kafka, daemon_api):
    """A compaction completes between two pages: the reader finishes on the ledger it pinned (readable
    for the grace period), takes the tail from that ledger's horizon, and yields nothing twice."""
    daemon, server = daemon_api(compaction_retired_ledger_grace_seconds=300)
    topic = kafka.topic()
    first = [(f"k{i}", f"v{i}") for i in range(10)]
    kafka.produce(topic, first)
    compact(daemon, topic)
    pinned = daemon.registry.service(topic).ledger_info().ledger_id
    second = [("k1", "new"), ("k2", None), ("k10", "v10")]
    kafka.produce(topic, second)

    reader = CompactedReader(kafka.bootstrap, topic, url=server.url, page_size=3)
    it = iter(reader)
    got = [next(it) for _ in range(4)]
    compact(daemon, topic)  # the switch: the ledger the reader pinned is replaced
    assert daemon.registry.service(topic).ledger_info().ledger_id != pinned
    got += list(it)

    rows = [(e.partition, e.offset, e.key, e.value) for e in got]
    assert reader.ledger_id == pinned and reader.restarts == 0
    assert len({(p, o) for p, o, *_ in rows}) == len(rows), rows  # nothing twice
    assert [o for _, o, *_ in rows[:10]] == list(range(10))  # the pinned ledger whole, then its tail
    assert [o for _, o, *_ in rows[10:]] == [10, 11, 12]
    expected = {f"k{i}".encode(): f"v{i}".encode() for i in range(11)} | {b"k1": b"new"}
    del expected[b"k2"]
    assert _state(rows) == expected


def test_reader_starts_over_when_its_ledger_is_retired_and_yields_nothing_twice(kafka, daemon_api):
    """No grace period: the pinned ledger goes at the switch, its next page answers 410 ledger_retired,
    and the reader starts over on the new ledger: what it yielded is not yielded again, a key the new
    ledger no longer holds comes as a deletion, and the state equals the view."""
    daemon, server = daemon_api(compaction_retired_ledger_grace_seconds=0)
    topic = kafka.topic()
    kafka.produce(topic, [(f"k{i}", f"v{i}") for i in range(10)])
    compact(daemon, topic)
    reader = CompactedReader(kafka.bootstrap, topic, url=server.url, page_size=2)
    it = iter(reader)
    got = [next(it) for _ in range(4)]  # k0..k3, from the first ledger
    kafka.produce(topic, [("k1", "new"), ("k2", None), ("k8", "v8b")])
    compact(daemon, topic)
    got += list(it)

    rows = [(e.partition, e.offset, e.key, e.value) for e in got]
    assert reader.restarts == 1
    assert (0, 12, b"k2", None) in rows  # k2 was yielded, then deleted: a deletion at the new horizon
    real = [r for r in rows if r != (0, 12, b"k2", None)]
    assert len({(p, o) for p, o, *_ in real}) == len(real), rows
    expected = {f"k{i}".encode(): f"v{i}".encode() for i in range(10)} | {b"k1": b"new", b"k8": b"v8b"}
    del expected[b"k2"]
    assert _state(rows) == expected


def test_reader_applies_the_ledger_s_own_strategy(kafka, daemon_api):
    daemon, server = daemon_api(compaction_strategy="first-value")
    topic = kafka.topic()
    kafka.produce(topic, [("a", "1"), ("a", "2")])
    compact(daemon, topic)
    kafka.produce(topic, [("a", "3"), ("b", "1"), ("b", "2"), ("b", None), ("b", "4")])
    applied = read_all(CompactedReader(kafka.bootstrap, topic, url=server.url, apply_strategy=True))
    assert applied == [(0, 0, b"a", b"1"), (0, 3, b"b", b"1"), (0, 5, b"b", None), (0, 6, b"b", b"4")]


def test_reader_needs_a_custom_strategy_s_object_to_apply_it(kafka, daemon_api):
    from tests.inprocess.engine.strategies import LongestValue

    daemon, server = daemon_api(compaction_strategy="tests.inprocess.engine.strategies:LongestValue")
    topic = kafka.topic()
    kafka.produce(topic, [("a", "long value")])
    compact(daemon, topic)
    kafka.produce(topic, [("a", "short"), ("a", "a longer value")])
    with pytest.raises(InvalidArgument, match="custom strategy"):
        list(CompactedReader(kafka.bootstrap, topic, url=server.url, apply_strategy=True))
    applied = read_all(CompactedReader(kafka.bootstrap, topic, url=server.url, apply_strategy=True,
                                       strategy=LongestValue()))
    assert [v for *_, v in applied] == [b"long value", b"a longer value"]


def test_reader_reads_the_tail_under_the_ledger_s_empty_value_rule(kafka, daemon_api):
    daemon, server = daemon_api(compaction_empty_value_is_tombstone=True)
    topic = kafka.topic()
    kafka.produce(topic, [("a", "1"), ("b", "1")])
    compact(daemon, topic)
    kafka.produce(topic, [("a", b"")])
    rows = read_all(CompactedReader(kafka.bootstrap, topic, url=server.url))
    assert rows[-1] == (0, 2, b"a", None)  # Pulsar's rule, as the ledger was written: a deletion
    assert _state(rows) == {b"b": b"1"}


def test_reads_stop_below_the_log_start_the_monitor_saw(kafka, daemon_api):
    """Retention moved the log start (the broker's answer, given at the metadata boundary: Tansu cannot
    move it); the monitor's refresh sees it; reads of the ledger never return what the log no longer
    holds, before any new compaction."""
    answers: list[Answers] = []
    daemon, server = daemon_api(metadata=lambda real: answers.append(Answers(real)) or answers[0])
    topic = kafka.topic()
    kafka.produce(topic, [(f"k{i}", f"v{i}") for i in range(10)])
    compact(daemon, topic)
    answers[0].log_start[topic] = {0: 6}
    daemon.monitor.refresh(topic)
    import httpx

    page = httpx.get(f"{server.url}/v1/topics/{topic}/compacted", params={"partition": 0}).json()
    assert [e["offset"] for e in page["entries"]] == [6, 7, 8, 9]
    assert read_all(CompactedReader(kafka.bootstrap, topic, url=server.url))[0][1] == 6
    answers[0].log_start[topic] = {0: 10}
    daemon.monitor.refresh(topic)
    last = httpx.get(f"{server.url}/v1/topics/{topic}/compacted/last", params={"partition": 0})
    assert last.status_code == 404 and last.json()["error"] == "entry_not_found"


def test_a_recreated_topic_stops_the_reader_with_a_named_error(kafka, daemon_api):
    from kafka.admin import NewTopic

    from compactord.errors import TopicRecreated

    daemon, server = daemon_api()
    topic = kafka.topic()
    kafka.produce(topic, [(f"k{i}", "v") for i in range(5)])
    compact(daemon, topic)
    kafka.admin.delete_topics([topic])
    wait_for(lambda: topic not in kafka.admin.list_topics(), 30, f"{topic} to be deleted")
    kafka.admin.create_topics([NewTopic(topic, 1, 1)])
    daemon.monitor.refresh(topic)  # what the monitor's next pass does
    with pytest.raises(TopicRecreated):
        list(CompactedReader(kafka.bootstrap, topic, url=server.url))


def test_without_topic_ids_the_offsets_tell_a_recreated_topic_to_every_read(kafka, daemon_api):
    """A broker that reports no topic ids (the answer given at the metadata boundary): the reads tell the
    recreated topic by its offsets (it now ends below the horizon), with no monitor pass."""
    import httpx

    answers: list[Answers] = []
    daemon, server = daemon_api(metadata=lambda real: answers.append(Answers(real)) or answers[0],
                                monitor_interval_seconds=3600)
    topic = kafka.topic()
    answers[0].topic_ids[topic] = None
    kafka.produce(topic, [(f"k{i}", "v") for i in range(20)])
    compact(daemon, topic)
    assert daemon.registry.service(topic).ledger_info().topic_id is None
    kafka.recreate(topic)
    kafka.produce(topic, [("new", "w")])

    def page() -> httpx.Response:
        return httpx.get(f"{server.url}/v1/topics/{topic}/compacted", params={"partition": 0})

    gone = wait_for(lambda: (r := page()).status_code == 410 and r, 30, "a read of the recreated topic to answer 410")
    assert gone.json()["error"] == "topic_recreated" and "below the horizon 19" in gone.json()["message"]
    with pytest.raises(TopicRecreated):
        list(CompactedReader(kafka.bootstrap, topic, url=server.url))


def test_the_reader_checks_the_tail_it_reads_against_the_pinned_ledger(kafka, daemon_api):
    """The daemon's broker answers still say the old topic (given at the metadata boundary), so the daemon
    serves the ledger; the reader's own check of the log it reads the tail from finds the new one."""
    answers: list[Answers] = []
    daemon, server = daemon_api(metadata=lambda real: answers.append(Answers(real)) or answers[0],
                                monitor_interval_seconds=3600)
    topic = kafka.topic()
    kafka.produce(topic, [(f"k{i}", "v") for i in range(20)])
    compact(daemon, topic)
    old = daemon.registry.service(topic).ledger_info()
    assert old.topic_id is not None  # the test broker reports topic ids
    answers[0].topic_ids[topic], answers[0].ends[topic] = old.topic_id, {0: 20}
    kafka.recreate(topic)
    kafka.produce(topic, [(f"k{i}", "new") for i in range(30)])  # longer than the old horizon
    with pytest.raises(TopicRecreated, match="topic id changed") as raised:
        list(CompactedReader(kafka.bootstrap, topic, url=server.url))
    assert "daemon answered" not in str(raised.value)


def test_a_log_start_that_moved_past_ledger_entries_triggers_a_run(kafka, daemon_api):
    """Only the log start moved (retention; the broker's answer at the metadata boundary): no new
    record, yet the monitor's pass compacts, so that the ledger drops what the log no longer holds."""
    answers: list[Answers] = []
    topic = kafka.topic()
    daemon, _ = daemon_api(metadata=lambda real: answers.append(Answers(real)) or answers[0],
                           topics_pattern=topic, monitor_interval_seconds=3600)
    kafka.produce(topic, [(f"k{i}", f"v{i}") for i in range(10)])
    compact(daemon, topic)
    daemon.monitor.run_once()
    assert daemon.registry.live(topic) is None  # nothing new: no run
    answers[0].log_start[topic] = {0: 4}
    daemon.monitor.run_once()
    task = daemon.registry.last(topic)
    assert task is not None and task.result(READY_TIMEOUT_S) is TaskState.SUCCEED, task.error
    assert daemon.registry.service(topic).ledger_info().log_start == {0: 4}
    assert [e.offset for e in daemon.registry.service(topic).read_compacted_entries(Position(0, 0), 100)] == \
        [4, 5, 6, 7, 8, 9]


def test_reader_applies_the_ledger_s_key_ttl_to_ledger_and_tail(kafka, daemon_api):
    import time

    daemon, server = daemon_api(compaction_key_ttl_ms=3_600_000)
    topic = kafka.topic()
    now = int(time.time() * 1000)
    old = now - 2 * 3_600_000
    kafka.produce(topic, [("a", "1", 0, now), ("gone", "x", 0, old), ("b", "1", 0, now)])
    compact(daemon, topic)  # "gone" expired in the run
    kafka.produce(topic, [("a", "stale", 0, old), ("c", "1", 0, now), ("b", "old-again", 0, old)])
    got = read_all(CompactedReader(kafka.bootstrap, topic, url=server.url))
    # The tail's expired records come back as tombstones of their keys.
    assert got == [(0, 0, b"a", b"1"), (0, 2, b"b", b"1"), (0, 3, b"a", None), (0, 4, b"c", b"1"),
                   (0, 5, b"b", None)]
    assert _state(got) == {b"c": b"1"}
    # key_ttl_ms=0 turns the rule off for this read: the tail as it is.
    plain = read_all(CompactedReader(kafka.bootstrap, topic, url=server.url, key_ttl_ms=0))
    assert _state(plain) == {b"a": b"stale", b"b": b"old-again", b"c": b"1"}
    # A TTL shorter than every record's age: the ledger's entries are skipped, the tail is all tombstones.
    short = CompactedReader(kafka.bootstrap, topic, url=server.url, key_ttl_ms=1)
    assert [(o, k, v) for _, o, k, v in read_all(short)] == [(3, b"a", None), (4, b"c", None), (5, b"b", None)]
    assert short.ledger_entries == 0
    # The next compaction agrees with the reader.
    compact(daemon, topic)
    assert _state(read_all(CompactedReader(kafka.bootstrap, topic, url=server.url))) == {b"c": b"1"}
