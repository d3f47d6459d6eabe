"""Transactional topics (read_committed, control records) and retention (the log start), on the real
broker and Spark. Two broker bugs of Tansu 0.6 make two of these xfail: they say which. Both are strict:
a broker release that fixes a bug turns its xfail into a failure, to be noticed and removed (the test
broker's version is pinned in pyproject.toml's ``test`` extra for that reason)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from compactord.engine.job import CompactionJobSpec, build_winners
from compactord.engine.kafka_source import OffsetRange
from compactord.engine.strategies import load_strategy
from tests.support.service import compact, entries, view


def transaction(producer: Any, topic: str, records: list[tuple[str, str | None]], *,
                commit: bool = True) -> None:
    producer.begin_transaction()
    for key, value in records:
        producer.send(topic, key=key.encode(), value=None if value is None else value.encode(), partition=0)
    producer.flush()  # sent before the end: an abort must leave records in the log, not in the client
    if commit:
        producer.commit_transaction()
    else:
        producer.abort_transaction()


# -- transactions -----------------------------------------------------------------------------------


def test_committed_transactions_compact_normally(kafka, make_factory, tx_producer):
    topic = kafka.topic()
    transaction(tx_producer, topic, [("a", "1"), ("b", "1")])
    kafka.produce(topic, [("c", "plain")])  # a non-transactional record in between
    transaction(tx_producer, topic, [("a", "2"), ("b", None)])
    kafka.produce(topic, [("d", "plain")])
    service = make_factory().new_topic_compaction_service(topic)
    ctx = compact(service)
    assert view(service) == {b"a": b"2", b"c": b"plain", b"d": b"plain"}
    assert ctx.stats.records_read == 6  # the commit markers are not records
    # offsets are kept: the markers occupy offsets, so the last record sits past 5
    assert [e.offset for e in entries(service)][-1] == service.get_last_compacted_position()[0] > 5


def test_transaction_markers_do_not_stall_the_read_loop(kafka, make_factory, tx_producer):
    """A topic that ends with a commit marker: the read ends on the consumer's position, which moves
    past the marker, not on the last record's offset + 1 (which would never reach the end)."""
    topic = kafka.topic()
    transaction(tx_producer, topic, [("a", "1"), ("b", "1"), ("a", "2")])
    service = make_factory().new_topic_compaction_service(topic)
    started = time.monotonic()
    first = compact(service)
    elapsed = time.monotonic() - started
    assert view(service) == {b"a": b"2", b"b": b"1"}
    horizon = service.get_last_compacted_position()[0]
    assert horizon == 3, "the horizon covers the commit marker at offset 3"
    assert first.stats.tail_records == 3
    print(f"\ncompaction of a topic ending with a commit marker: {elapsed:.1f}s")

    # The next run starts after the marker and reads only the new transaction.
    transaction(tx_producer, topic, [("b", "2")])
    second = compact(service)
    assert second.stats.full_rebuild is False and second.stats.tail_records == 1
    assert view(service) == {b"a": b"2", b"b": b"2"}
    assert service.get_last_compacted_position()[0] == 5


@pytest.mark.xfail(reason="Tansu 0.6 delivers aborted transactional records to read_committed consumers "
                          "(broker bug)", strict=True)
def test_aborted_transactions_never_reach_the_ledger(kafka, make_factory, tx_producer):
    topic = kafka.topic()
    transaction(tx_producer, topic, [("a", "committed")])
    transaction(tx_producer, topic, [("a", "ABORTED"), ("x", "ABORTED")], commit=False)
    transaction(tx_producer, topic, [("b", "committed")])
    service = make_factory().new_topic_compaction_service(topic)
    compact(service)
    assert view(service) == {b"a": b"committed", b"b": b"committed"}


# -- retention: the log start -----------------------------------------------------------------------


def test_the_job_drops_entries_below_the_log_start(kafka, make_factory, spark_manager):
    """Unit test of the log-start filter of ``build_winners``, on the real session and topic: the test
    broker's log start never moves, so the job is given one above some offsets."""
    topic = kafka.topic()
    kafka.produce(topic, [(f"k{i}", f"v{i}") for i in range(10)])
    factory = make_factory()
    service = factory.new_topic_compaction_service(topic)
    compact(service)
    manifest = service.ledger_info()
    ledger_dir = factory.store.ledger_path(topic, manifest.ledger_id)
    ledger_files = [str(ledger_dir / f["name"]) for f in manifest.files]
    kafka.produce(topic, [(f"k{i}", f"v{i}") for i in range(10, 15)] + [("k2", "v2-again")])

    def winners(log_start: int, ledger: bool = True) -> list[tuple[int, bytes]]:
        spec = CompactionJobSpec(
            topic=topic, client_config=factory.settings.kafka_client_config(),
            ranges=[OffsetRange(0, 10, 16)], ledger_files=ledger_files if ledger else [],
            output_path="unused", strategy_ref="publishing-order", event_time_source="timestamp",
            retain_null_key=False, empty_value_is_tombstone=False, tombstone_retention_ms=86_400_000, now_ms=int(time.time() * 1000),
            log_start={0: log_start}, batch_records=1000,
        )
        df = build_winners(spark_manager.spark, spec, load_strategy("publishing-order"))
        return sorted((r["offset"], r["key"]) for r in df.select("offset", "key").collect())

    every = winners(0)
    assert [o for o, _ in every] == [0, 1, *range(3, 16)]  # k2 at offset 2 lost to offset 15
    # Below the log start: the ledger's entries and the tail's alike are dropped.
    assert [o for o, _ in winners(4)] == list(range(4, 16))
    assert [o for o, _ in winners(12)] == [12, 13, 14, 15]
    assert winners(16) == []


@pytest.fixture
def own_broker(tmp_path) -> Iterator[Any]:
    """A broker of its own: Tansu's DeleteRecords panics in the broker; keep that off the shared one."""
    from compactord.embedded import EmbeddedBroker

    broker = EmbeddedBroker(log_path=tmp_path / "tansu.log").start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.mark.xfail(reason="Tansu 0.6: DeleteRecords breaks the connection and the log start never moves",
                   strict=True)
def test_records_deleted_on_the_broker_vanish_from_the_next_ledger(own_broker, make_factory):
    from kafka import KafkaAdminClient, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=own_broker.bootstrap)
    producer = KafkaProducer(bootstrap_servers=own_broker.bootstrap)
    try:
        topic = f"retention-{uuid.uuid4().hex[:6]}"
        admin.create_topics([NewTopic(topic, 1, 1)])
        for i in range(10):
            producer.send(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=0)
        producer.flush()
        factory = make_factory(kafka_bootstrap_servers=own_broker.bootstrap)
        service = factory.new_topic_compaction_service(topic)
        compact(service)
        assert len(view(service)) == 10
        admin.delete_records({TopicPartition(topic, 0): 5}, timeout_ms=5000)
        ctx = compact(service)
        assert not ctx.stats.skipped, "a moved log start must trigger a run"
        assert [e.offset for e in entries(service)] == [5, 6, 7, 8, 9]
        assert service.ledger_info().log_start == {0: 5}
    finally:
        producer.close()
        admin.close()
