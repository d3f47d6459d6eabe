"""Event-time, first-value and custom strategies, end to end on the real broker and Spark."""

from __future__ import annotations

import struct

import pytest

from tests.support.service import compact, entries, view


def et(value: int | None) -> list[tuple[str, bytes]]:
    return [] if value is None else [("et", str(value).encode())]


@pytest.fixture
def event_time(make_factory):
    def make(**overrides):
        return make_factory(compaction_strategy="event-time", compaction_event_time_source="header:et", **overrides)

    return make


def produce_et(kafka, topic, rows):
    """rows: (key, value, event_time or None)."""
    kafka.produce(topic, [(k, v, 0, None, et(t)) for k, v, t in rows])


def test_event_time_out_of_order_ties_and_missing(kafka, event_time):
    topic = kafka.topic()
    produce_et(kafka, topic, [
        ("ooo", "new", 10), ("ooo", "old", 5),  # the higher event time wins although published first
        ("tie", "first", 7), ("tie", "second", 7),  # a tie goes to the higher offset
        ("none", "has", 3), ("none", "without", None),  # no event time never replaces one that has it
        ("both-none", "x", None), ("both-none", "y", None),  # among records without, the higher offset
        ("late-has", "without", None), ("late-has", "with", 1),  # having one beats not having one
    ])
    service = event_time().new_topic_compaction_service(topic)
    compact(service)
    assert view(service) == {
        b"ooo": b"new", b"tie": b"second", b"none": b"has", b"both-none": b"y", b"late-has": b"with",
    }
    assert {e.key: e.event_time for e in entries(service)}[b"ooo"] == 10


def test_event_time_header_formats(kafka, event_time):
    topic = kafka.topic()
    kafka.produce(topic, [
        ("k", "decimal-100", 0, None, [("et", b"100")]),
        ("k", "binary-200", 0, None, [("et", struct.pack(">q", 200))]),
        ("k", "garbage", 0, None, [("et", b"12x")]),  # neither decimal nor 8 bytes: no event time
        ("d", "dup-last-counts", 0, None, [("et", b"900"), ("et", b"1")]),
        ("d", "mid", 0, None, [("et", b"5")]),
    ])
    service = event_time().new_topic_compaction_service(topic)
    compact(service)
    assert view(service) == {b"k": b"binary-200", b"d": b"mid"}


def test_event_time_from_record_timestamp(kafka, make_factory):
    topic = kafka.topic()
    kafka.produce(topic, [("a", "newer", 0, 2_000), ("a", "older", 0, 1_000), ("b", "x", 0, 5), ("b", "y", 0, 5)])
    service = make_factory(compaction_strategy="event-time").new_topic_compaction_service(topic)
    compact(service)
    assert view(service) == {b"a": b"newer", b"b": b"y"}


def test_stale_tombstone_does_not_delete_a_newer_value(kafka, event_time):
    topic = kafka.topic()
    produce_et(kafka, topic, [("a", "v", 10), ("a", None, 5), ("b", "v", 10), ("b", None, 11), ("c", b"", 3)])
    service = event_time().new_topic_compaction_service(topic)
    compact(service)
    assert view(service) == {b"a": b"v", b"c": b""}


def test_deletion_marker_blocks_late_resurrection_across_runs(kafka, event_time):
    topic = kafka.topic()
    produce_et(kafka, topic, [("a", "v", 10), ("a", None, 20), ("keep", "k", 1)])
    service = event_time().new_topic_compaction_service(topic)
    compact(service)
    assert view(service) == {b"keep": b"k"}  # markers are never returned by the read API
    assert service.ledger_info().markers == 1
    produce_et(kafka, topic, [("a", "late", 15)])  # older than the deletion: must stay deleted
    ctx = compact(service)
    assert ctx.stats.full_rebuild is False
    assert view(service) == {b"keep": b"k"}
    produce_et(kafka, topic, [("a", "newer", 25)])  # newer than the deletion: comes back
    compact(service)
    assert view(service) == {b"keep": b"k", b"a": b"newer"}
    assert service.ledger_info().markers == 0


def test_expired_marker_is_forgotten(kafka, event_time):
    topic = kafka.topic()
    produce_et(kafka, topic, [("a", "v", 10), ("a", None, 20)])
    service = event_time(compaction_tombstone_retention_ms=0).new_topic_compaction_service(topic)
    compact(service)
    assert service.ledger_info().markers == 0
    produce_et(kafka, topic, [("a", "late", 15)])
    compact(service)
    assert view(service) == {b"a": b"late"}  # Kafka's delete.retention.ms semantics


def test_first_value_keeps_the_first_until_a_tombstone(kafka, make_factory):
    topic = kafka.topic()
    kafka.produce(topic, [("a", "1"), ("a", "2"), ("b", "1"), ("b", None), ("b", "3"), ("b", "4"), ("c", "1"),
                          ("c", None), ("e", b""), ("e", "later")])
    service = make_factory(compaction_strategy="first-value").new_topic_compaction_service(topic)
    compact(service)
    assert view(service) == {b"a": b"1", b"b": b"3", b"e": b""}  # an empty value is a first value
    kafka.produce(topic, [("a", "5"), ("c", "6"), ("b", None)])
    compact(service)
    assert view(service) == {b"a": b"1", b"c": b"6", b"e": b""}


def test_custom_ordered_strategy(kafka, make_factory):
    topic = kafka.topic()
    kafka.produce(topic, [("a", "5"), ("a", "30"), ("a", "7"), ("b", "1"), ("b", "2")])
    factory = make_factory(compaction_strategy="tests.inprocess.engine.strategies:NumericMax")
    service = factory.new_topic_compaction_service(topic)
    compact(service)
    assert view(service) == {b"a": b"30", b"b": b"2"}


def test_custom_general_strategy(kafka, make_factory):
    topic = kafka.topic(partitions=2)
    kafka.produce(topic, [("a", "xx", 0), ("a", "y", 0), ("a", "zzz", 0), ("b", "long", 1), ("b", None, 1),
                          ("b", "s", 1)])
    factory = make_factory(compaction_strategy="tests.inprocess.engine.strategies.LongestValue")
    service = factory.new_topic_compaction_service(topic)
    compact(service)
    assert view(service, 2) == {b"a": b"zzz", b"b": b"s"}


def test_per_topic_strategy_override(kafka, make_factory):
    factory = make_factory()
    plain, special = kafka.topic(), kafka.topic()
    for topic in (plain, special):
        kafka.produce(topic, [("a", "1"), ("a", "2")])
    factory.set_topic_strategy(special, "first-value")
    compact(factory.new_topic_compaction_service(plain))
    compact(factory.new_topic_compaction_service(special))
    assert view(factory.new_topic_compaction_service(plain)) == {b"a": b"2"}
    assert view(factory.new_topic_compaction_service(special)) == {b"a": b"1"}
    assert factory.new_topic_compaction_service(special).ledger_info().strategy.strategy == "first-value"
    factory.set_topic_strategy(special, None)  # back to the configured one: a full rebuild
    kafka.produce(special, [("a", "3")])
    ctx = compact(factory.new_topic_compaction_service(special))
    assert ctx.stats.full_rebuild is True
    assert view(factory.new_topic_compaction_service(special)) == {b"a": b"3"}
