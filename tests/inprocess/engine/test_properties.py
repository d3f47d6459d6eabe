"""Property test: random produce/compact sequences against an in-Python reference model of each strategy.

The model is written here, independently of ``compactord.engine.strategies`` (a model that reuses the code under
test would check nothing): it folds every record up to the horizon, per (partition, key), in offset
order. After each compaction the ledger, read through the read API over every partition, must equal the
model; the horizons must be the offsets produced - 1; the entries must be a subsequence of the log, in
offset order, with each record unchanged; the deletion markers (read only on request)
must be exactly the model's winning tombstones (the default retention keeps every marker).

The operations follow what production brokers do between two compactions: the topic deleted and
recreated under its name, retention moving a log start (the test broker cannot: its answer is given at
the metadata boundary), empty values (Kafka's rule; Pulsar's in the ``empty-deletes`` mode), and reads of
every earlier ledger by its id after the switches that replaced it.

Each example uses a fresh topic and a fresh ledger root. Examples are derandomized (no example database)
so that a failure reproduces in CI; each compaction costs 1-2 s on the warm session, which bounds them.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

from compactord.model import Entry, Position
from tests.support.brokers import Answers
from tests.support.service import compact, entries, pinned

PARTITIONS = 2
HEADER = "et"

# -- the generated operations ----------------------------------------------------------------------


@dataclass(frozen=True)
class Produce:
    key: bytes | None
    value: bytes | None  # None deletes (Kafka's rule); b"" too only under Pulsar's rule
    event_time: tuple[str, int] | None  # (encoding, value): "decimal", "long" or "junk"; None: no header
    partition: int

    def headers(self) -> list[tuple[str, bytes]]:
        if self.event_time is None:
            return []
        encoding, number = self.event_time
        if encoding == "decimal":
            return [(HEADER, str(number).encode())]
        if encoding == "long":
            return [(HEADER, struct.pack(">q", number))]
        return [(HEADER, b"t" + str(number).encode())]  # neither decimal nor 8 bytes: no event time

    @property
    def parsed_event_time(self) -> int | None:
        if self.event_time is None or self.event_time[0] == "junk":
            return None
        return self.event_time[1]


produces = st.builds(
    Produce,
    # Few keys, so that keys repeat; b"" is an ordinary key; a null key is dropped.
    key=st.sampled_from([b"", b"a", b"b", b"c"]) | st.just(None),
    value=st.sampled_from([None, b""]) | st.binary(min_size=1, max_size=3),
    # Small event times, so that ties happen.
    event_time=st.none() | st.tuples(st.sampled_from(["decimal", "long", "junk"]), st.integers(-2, 3)),
    partition=st.integers(0, PARTITIONS - 1),
).map(lambda r: replace(r, value=b"") if r.key is None and r.value is None else r)  # the client refuses both null
# Retention between two compactions: the log start of a partition moves up by a few records (the test
# broker cannot move it; the answer is given at the metadata boundary, ``Answers``).
retention = st.none() | st.tuples(st.integers(0, PARTITIONS - 1), st.integers(1, 4))
# Each step maybe deletes and recreates the topic (nothing tells compactord), produces a few records
# (possibly none), maybe moves a log start, then compacts: at most 3 compactions per example.
recreate = st.sampled_from([False, False, False, True])
steps = st.lists(st.tuples(recreate, st.lists(produces, max_size=8), retention), min_size=1, max_size=3)

# -- the reference model ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Logged:
    """A produced record at the offset the broker gave it."""

    offset: int
    record: Produce
    empty_deletes: bool = False  # Pulsar's rule (compactionEmptyValueIsTombstone)

    @property
    def deletes(self) -> bool:
        return self.record.value is None or (self.empty_deletes and self.record.value == b"")


def publishing_order(records: list[Logged]) -> Logged | None:
    return records[-1]


def event_time(records: list[Logged]) -> Logged | None:
    # Having an event time beats not having one; then the higher event time; a tie goes to the higher
    # offset. A tombstone competes like any record.
    best = None
    for cur in records:
        et = cur.record.parsed_event_time
        rank = (et is not None, et or 0, cur.offset)
        if best is None or rank > best[0]:
            best = (rank, cur)
    return best[1] if best else None


def first_value(records: list[Logged]) -> Logged | None:
    # The first value after the key's last deletion; with no value after it, that deletion (kept as a marker).
    kept: Logged | None = None
    for cur in records:
        if cur.deletes or kept is None or kept.deletes:
            kept = cur
    return kept


@dataclass(frozen=True)
class Mode:
    strategy: str
    settings: dict[str, Any]
    winner: Callable[[list[Logged]], Logged | None]
    markers: bool  # a winning tombstone stays in the ledger as a marker (never read)
    empty_deletes: bool = False


MODES = {
    "publishing-order": Mode("publishing-order", {}, publishing_order, True),
    "event-time": Mode("event-time", {"compaction_event_time_source": f"header:{HEADER}"}, event_time, True),
    "first-value": Mode("first-value", {}, first_value, True),
    "first-value/empty-deletes": Mode("first-value", {"compaction_empty_value_is_tombstone": True}, first_value,
                                      True, empty_deletes=True),
}


def expected(mode: Mode, log: dict[int, list[Logged]], log_start: dict[int, int]
             ) -> tuple[dict[int, list[Logged]], dict[int, list[Logged]]]:
    """Per partition, in offset order: the live winners among the records the log still holds (at or
    after its log start), and the winning tombstones kept as markers."""
    live: dict[int, list[Logged]] = {}
    markers: dict[int, list[Logged]] = {}
    for partition, records in log.items():
        by_key: dict[bytes, list[Logged]] = {}
        for rec in records:
            if rec.offset < log_start.get(partition, 0):
                continue
            rec = replace(rec, empty_deletes=mode.empty_deletes)
            if rec.record.key is not None:
                by_key.setdefault(rec.record.key, []).append(rec)
        winners = sorted((w for w in map(mode.winner, by_key.values()) if w is not None), key=lambda w: w.offset)
        live[partition] = [w for w in winners if not w.deletes]
        markers[partition] = [w for w in winners if w.deletes] if mode.markers else []
    return live, markers


# -- the property ----------------------------------------------------------------------------------


def with_markers(service: Any, partition: int) -> list[Entry]:
    """Every entry of a partition, deletion markers included, page by page."""
    out: list[Entry] = []
    start = 0
    while page := service.read_compacted_entries(Position(partition, start), 5, include_markers=True):
        out.extend(page)
        start = page[-1].offset + 1
    return out


def as_tuple(e: Entry) -> tuple[Any, ...]:
    return (e.offset, e.key, e.value, tuple(e.headers))


def logged_tuple(rec: Logged) -> tuple[Any, ...]:
    return (rec.offset, rec.record.key, rec.record.value, tuple(rec.record.headers()))


_roots = itertools.count()


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(MODES))
@settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    database=None,
    # No "explain" phase: it reruns the failing example many times (seconds each) for a hint.
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(program=steps)
def test_ledger_equals_the_reference_model(kafka, make_factory, tmp_path, strategy, program):
    mode = MODES[strategy]
    note(f"{strategy}: {len(program)} steps of recreate, produce, retention, compact: {program!r}")
    topic = kafka.topic(partitions=PARTITIONS, prefix="prop")
    answers: list[Answers] = []
    factory = make_factory(
        root=tmp_path / f"root-{next(_roots)}", compaction_strategy=mode.strategy,
        metadata=lambda real: answers.append(Answers(real)) or answers[0],
        compaction_retired_ledger_grace_seconds=600, **mode.settings
    )
    log_start: dict[int, int] = {}
    views: dict[int, dict[int, list[tuple[Any, ...]]]] = {}  # ledger id -> its view when it was made
    try:
        service = factory.new_topic_compaction_service(topic)
        log: dict[int, list[Logged]] = {p: [] for p in range(PARTITIONS)}
        for recreated, batch, moved in program:
            if recreated:
                kafka.recreate(topic, PARTITIONS)
                log = {p: [] for p in range(PARTITIONS)}
                log_start = {}
                answers[0].log_start.pop(topic, None)
            with kafka.producer() as producer:
                futures = [
                    (rec, producer.send(topic, key=rec.key, value=rec.value, partition=rec.partition,
                                        headers=rec.headers() or None))
                    for rec in batch
                ]
                producer.flush()
                for rec, future in futures:
                    offset = future.get(timeout=30).offset  # the broker's offset, not an assumed one
                    log[rec.partition].append(Logged(offset, rec))
            for records in log.values():
                records.sort(key=lambda r: r.offset)
            if moved is not None:
                partition, by = moved
                log_start[partition] = min(len(log[partition]), log_start.get(partition, 0) + by)
                answers[0].log_start[topic] = dict(log_start)

            compact(service)

            live, markers = expected(mode, log, log_start)
            by_offset = {p: {r.offset: r for r in records} for p, records in log.items()}
            # Offsets produced - 1 (the topic has no transactions, so no markers occupy offsets).
            assert service.get_last_compacted_position() == {p: len(records) - 1 for p, records in log.items()}
            for p in range(PARTITIONS):
                got = entries(service, p)
                offsets = [e.offset for e in got]
                # A subsequence of the log, in offset order, each record as it was produced.
                assert offsets == sorted(set(offsets)), f"partition {p}: offsets out of order {offsets}"
                for e in got:
                    assert e.offset in by_offset[p], f"partition {p}: offset {e.offset} is not in the log"
                    assert as_tuple(e) == logged_tuple(by_offset[p][e.offset])
                    assert e.partition == p
                assert [as_tuple(e) for e in got] == [logged_tuple(r) for r in live[p]], f"partition {p}"
                if mode.strategy == "event-time":
                    assert [e.event_time for e in got] == [r.record.parsed_event_time for r in live[p]]
                # Markers: never read by default (above); asked for, exactly the model's deletions.
                # (Event times are the header's under event-time only: else the source is the timestamp.)
                by_et = mode.strategy == "event-time"
                got_markers = [(e.offset, e.key, e.event_time if by_et else None)
                               for e in with_markers(service, p) if e.marker]
                assert got_markers == [(r.offset, r.record.key, r.record.parsed_event_time if by_et else None)
                                       for r in markers[p]]
            manifest = service.ledger_info()
            assert manifest.records_kept == sum(len(v) for v in live.values())
            assert manifest.markers == sum(len(v) for v in markers.values())
            # Reads interleaved with switches: every ledger a switch replaced is still readable by its id
            # in its grace period, exactly as it was.
            views[manifest.ledger_id] = {p: [logged_tuple(r) for r in live[p]] for p in range(PARTITIONS)}
            for ledger_id, view in views.items():
                for p in range(PARTITIONS):
                    assert [as_tuple(e) for e in pinned(service, p, ledger_id)] == view[p], (ledger_id, p)
    finally:
        factory.close()
