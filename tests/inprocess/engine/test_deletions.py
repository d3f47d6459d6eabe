"""The deletion rules, written for Spark SQL and for Arrow (``engine/deletions.py``), give the same rows on
every kind of winner: a value, a tombstone, a marker young and old, a null key, an old key by timestamp or
by event time, a missing timestamp; with markers kept or not, with key expiry or not. Through real runs, a
winning deletion kept as a marker for its retention under the built-in strategies, on both write paths."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pyarrow as pa
import pytest

from compactord.engine.deletions import DeletionRules
from compactord.model import RECORD_DDL, RECORD_SCHEMA, Entry, Position
from tests.support.service import compact, view
from tests.support.timeouts import TASK_TIMEOUT_S
from tests.support.waiting import wait_for

NOW = 1_000_000


def winners() -> pa.Table:
    rows: list[dict[str, Any]] = []

    def add(key: bytes | None, value: bytes | None, timestamp: int | None, event_time: int | None = None,
            marker: bool = False, marker_at: int | None = None) -> None:
        rows.append({"partition": 0, "offset": len(rows), "timestamp": timestamp, "key": key, "value": value,
                     "headers": [{"key": "h", "value": b"x"}] if len(rows) % 3 == 0 else [],
                     "event_time": event_time, "marker": marker, "marker_at": marker_at})

    add(b"live", b"v", NOW - 10)
    add(b"old", b"v", NOW - 5_000, NOW - 10)  # old by timestamp, young by event time
    add(b"old-event", b"v", NOW - 10, NOW - 5_000)  # young by timestamp, old by event time
    add(b"no-time", b"v", None)
    add(b"tombstone", None, NOW - 10)
    add(b"young-marker", None, NOW - 10, NOW - 10, marker=True, marker_at=NOW - 100)
    add(b"old-marker", None, NOW - 10, NOW - 10, marker=True, marker_at=NOW - 50_000)
    add(b"", b"empty-key", NOW - 10)
    add(None, b"null-key", NOW - 5_000)
    add(None, None, NOW - 10)
    add(b"empty-value", b"", NOW - 10)
    return pa.Table.from_pylist(rows, RECORD_SCHEMA)


RULES = [DeletionRules(NOW, 20_000, keeps_markers=markers, key_ttl_ms=ttl, ttl_by_event_time=by_event)
         for markers, ttl, by_event in itertools.product((False, True), (0, 1_000), (False, True))
         if ttl or not by_event]


@pytest.mark.parametrize("rules", RULES, ids=lambda r: f"markers={r.keeps_markers},ttl={r.key_ttl_ms},"
                                                      f"by_event={r.ttl_by_event_time}")
def test_spark_and_arrow_apply_the_same_rules(spark_manager, rules: DeletionRules) -> None:
    table = winners()
    frame = spark_manager.spark.createDataFrame(table.to_pylist(), RECORD_DDL)
    by_spark = sorted((row.asDict(recursive=True) for row in rules.apply_sql(frame).collect()),
                      key=lambda r: r["offset"])
    by_arrow = rules.apply_arrow(table)
    assert by_arrow.schema == RECORD_SCHEMA
    assert by_arrow.to_pylist() == by_spark
    kept = {r["key"] for r in by_spark if not r["marker"]}
    markers = {r["key"] for r in by_spark if r["marker"]}
    assert {b"live", b"", None, b"empty-value"} <= kept and b"tombstone" not in kept
    assert b"old-marker" not in markers and b"young-marker" not in kept
    assert markers == ({b"tombstone", b"young-marker"} if rules.keeps_markers else set()) | (
        {b"old" if not rules.ttl_by_event_time else b"old-event"} if rules.keeps_markers and rules.key_ttl_ms else set())
    assert (b"old" in kept) == (rules.key_ttl_ms == 0 or rules.ttl_by_event_time)
    assert (b"old-event" in kept) == (rules.key_ttl_ms == 0 or not rules.ttl_by_event_time)
    assert b"no-time" in kept
    if rules.keeps_markers:
        marker = next(r for r in by_spark if r["key"] == b"tombstone")
        assert marker["marker"] and marker["value"] is None and marker["marker_at"] == NOW
        assert next(r for r in by_spark if r["key"] == b"young-marker")["marker_at"] == NOW - 100


@pytest.mark.parametrize("rules", [r for r in RULES if not r.keeps_markers],
                         ids=lambda r: f"ttl={r.key_ttl_ms},by_event={r.ttl_by_event_time}")
def test_winners_the_rules_keep_every_one_of_come_back_as_the_same_table(rules: DeletionRules) -> None:
    """A filter copies every column, keys and values included, also when it drops nothing: the rules hand
    back the very table when they keep every row (their own answer, applied again), and filter it when not."""
    table = winners()
    kept = rules.apply_arrow(table)
    assert kept.num_rows < table.num_rows
    assert rules.apply_arrow(kept) is kept
    assert rules.apply_arrow(RECORD_SCHEMA.empty_table()).num_rows == 0


def _never(*_: Any, **__: Any) -> bool:
    return False


def _markers(service: Any) -> list[Entry]:
    return [e for e in service.read_compacted_entries(Position(0, 0), 100, include_markers=True) if e.marker]


@pytest.mark.parametrize(("strategy", "grouped"), [("publishing-order", False), ("publishing-order", True),
                                                   ("first-value", True)],
                         ids=["publishing-order-tasks", "publishing-order-grouped", "first-value"])
def test_a_winning_deletion_stays_a_marker_for_its_retention(kafka: Any, make_factory: Any,
                                                              monkeypatch: pytest.MonkeyPatch, strategy: str,
                                                              grouped: bool) -> None:
    """A winning tombstone stays in the ledger as a marker (read only with ``include_markers``, never in the
    view or the live count), written by the reading tasks or by the grouping job alike; a value after it wins
    (first-value: it is the key's first value again); the marker leaves once its retention has passed."""
    from compactord.engine import job
    from compactord.ledger.parts import part_name

    if grouped:
        monkeypatch.setattr(job, "reads_are_final", _never)  # the grouping job
    topic = kafka.topic()
    kafka.produce(topic, [("a", "v1"), ("gone", "x"), ("a", "v2"), ("gone", None), ("b", "b"), ("b", None)])
    factory = make_factory(compaction_strategy=strategy, compaction_tombstone_retention_ms=86_400_000)
    service = factory.new_topic_compaction_service(topic)
    compact(service)
    first_a = b"v1" if strategy == "first-value" else b"v2"
    assert view(service) == {b"a": first_a}
    assert [(m.offset, m.key, m.value, m.timestamp is not None) for m in _markers(service)] == \
        [(3, b"gone", None, True), (5, b"b", None, True)]
    manifest = service.ledger_info()
    assert (manifest.records_kept, manifest.markers) == (1, 2)
    assert ([f["name"] for f in manifest.files] == [part_name(0)]) is not grouped  # the path the run took
    first_at = {m.key: m.marker_at for m in _markers(service)}

    kafka.produce(topic, [("gone", "back")])
    ctx = compact(service)
    assert not ctx.stats.full_rebuild
    assert view(service) == {b"a": first_a, b"gone": b"back"}
    assert [(m.offset, m.key, m.marker_at) for m in _markers(service)] == [(5, b"b", first_at[b"b"])]

    # The same root under a retention the marker has outlived: the next incremental run drops it.
    expiring = make_factory(store=factory.store, compaction_strategy=strategy, compaction_tombstone_retention_ms=1)
    wait_for(lambda: time.time() * 1000 > first_at[b"b"] + 1, TASK_TIMEOUT_S, "the marker's retention to pass")
    kafka.produce(topic, [("c", "c")])
    service = expiring.new_topic_compaction_service(topic)
    ctx = compact(service)
    assert not ctx.stats.full_rebuild
    assert view(service) == {b"a": first_a, b"gone": b"back", b"c": b"c"}
    assert _markers(service) == [] and service.ledger_info().markers == 0
