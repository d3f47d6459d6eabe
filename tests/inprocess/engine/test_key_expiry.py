"""Key expiry (``compactionKeyTtlMs`` / the policy field ``keyTtlMs``) through the real job: records with
old timestamps (or old event times) on the real broker, compacted by the real Spark session."""

from __future__ import annotations

import time

from compactord.model import Position
from tests.support.service import compact, view

HOUR_MS = 3_600_000


def now_ms() -> int:
    return int(time.time() * 1000)


def test_a_key_whose_latest_record_is_older_than_the_ttl_leaves_the_view(kafka, make_factory):
    topic = kafka.topic()
    old, fresh = now_ms() - 2 * HOUR_MS, now_ms()
    kafka.produce(topic, [
        ("old", "v", 0, old),  # its only record is past the TTL
        ("renewed", "v1", 0, old), ("renewed", "v2", 0, fresh),  # a fresh record keeps it
        ("aged", "v1", 0, fresh), ("aged", "v2", 0, old),  # its winner (the latest) is old
        ("fresh", "v", 0, fresh),
    ])
    service = make_factory(compaction_key_ttl_ms=HOUR_MS).new_topic_compaction_service(topic)
    ctx = compact(service)
    assert view(service) == {b"renewed": b"v2", b"fresh": b"v"}
    assert ctx.stats.records_kept == 2
    assert service.ledger_info().key_ttl_ms == HOUR_MS


def test_ledger_entries_expire_at_a_later_run_and_the_policy_overrides_the_setting(kafka, make_factory):
    topic = kafka.topic()
    kafka.produce(topic, [("a", "1", 0, now_ms() - 10 * HOUR_MS), ("b", "1", 0, now_ms())])
    factory = make_factory()  # compactionKeyTtlMs=0: keys never expire
    service = factory.new_topic_compaction_service(topic)
    compact(service)
    assert view(service) == {b"a": b"1", b"b": b"1"}
    factory.set_topic_limits(topic, key_ttl_ms=HOUR_MS)  # the topic's policy keyTtlMs
    ctx = compact(service)  # nothing new in the log: the ledger's own entries expire
    assert not ctx.stats.skipped
    assert view(service) == {b"b": b"1"}
    factory.set_topic_limits(topic)
    assert factory.key_ttl_ms_for(topic) == 0


def test_under_event_time_a_key_expires_by_its_event_time(kafka, make_factory):
    topic = kafka.topic()
    old, fresh = now_ms() - 2 * HOUR_MS, now_ms()
    def et(t: int) -> list[tuple[str, bytes]]:
        return [("et", str(t).encode())]
    kafka.produce(topic, [
        ("a", "v", 0, fresh, et(old)),  # a fresh timestamp, an old event time: expires
        ("b", "v", 0, old, et(fresh)),  # an old timestamp, a fresh event time: stays
        ("c", "new", 0, fresh, et(fresh)), ("c", "late-old", 0, fresh, et(old)),  # the winner is fresh
        ("d", "old-winner", 0, fresh, et(old + 1000)), ("d", "older", 0, fresh, et(old)),
    ])
    factory = make_factory(compaction_strategy="event-time", compaction_event_time_source="header:et",
                           compaction_key_ttl_ms=HOUR_MS)
    service = factory.new_topic_compaction_service(topic)
    compact(service)
    assert view(service) == {b"b": b"v", b"c": b"new"}
    # An expired key is a deletion: kept as a marker, so a late record ranked below it cannot come back.
    markers = {e.key for e in service.read_compacted_entries(Position(0, 0), 100, include_markers=True) if e.marker}
    assert markers == {b"a", b"d"}
    kafka.produce(topic, [("a", "late", 0, fresh, et(old - 1000)), ("d", "back", 0, fresh, et(fresh))])
    compact(service)
    assert view(service) == {b"b": b"v", b"c": b"new", b"d": b"back"}
