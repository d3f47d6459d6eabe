"""The local-root suites' end-to-end behaviours on an S3 root (``s3://BUCKET/PREFIX`` on the session's SeaweedFS):
event-time deletion markers (test_strategies_e2e.py), a throttled run (test_read_throttle.py), the exact
preview (test_preview.py), a topic's deletion and one a restart interrupted, the quarantine of ledgers that lost
their pointer (tests/unit/ledger/test_recovery.py), a corrupt part (test_ledger_safety.py) and reads pinned to a
retired ledger (tests/unit/ledger/test_retired_reads.py). Each asserts what its local-root counterpart does, and
what the bucket holds after it, listed through the root's store. A restart is the factory closed (its lease
given back) and another opened on the same root."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from compactord.errors import LedgerCorrupt, LedgerRetired
from compactord.ledger.layout import CURRENT
from tests.inprocess.engine.test_ledger_safety import damage_ledger, not_served_then_rebuilt
from tests.inprocess.engine.test_preview import preview_counts_without_writing_and_is_cancellable
from tests.inprocess.engine.test_read_throttle import throttled_run
from tests.inprocess.engine.test_strategies_e2e import produce_et
from tests.support.channel import control_keys
from tests.support.s3_server import BUCKET, s3_factory
from tests.support.service import compact, last_value_model, pinned, view

QUARANTINE = "@compactord/quarantine"


def keys(factory: Any, prefix: str) -> list[str]:
    """The keys under ``prefix`` in the factory's bucket, sorted."""
    return sorted(info.key for info in factory.store.objects.list(prefix))


def restart(make_factory: Any, s3_server: Any, factory: Any, **overrides: Any) -> Any:
    """Close ``factory`` and open another on its root: nothing of the first is left in memory."""
    root = factory.store.location
    factory.close()
    return s3_factory(make_factory, s3_server, root=root, **overrides)


# -- event time: deletion markers ---------------------------------------------------------------------


def test_deletion_markers_block_a_late_resurrection_across_runs(kafka, make_factory, s3_server):
    topic = kafka.topic()
    produce_et(kafka, topic, [("a", "v", 10), ("a", None, 20), ("keep", "k", 1)])
    factory = s3_factory(make_factory, s3_server, compaction_strategy="event-time",
                         compaction_event_time_source="header:et")
    service = factory.new_topic_compaction_service(topic)
    compact(service)
    assert view(service) == {b"keep": b"k"}  # markers are never returned by the read API
    assert service.ledger_info().markers == 1
    produce_et(kafka, topic, [("a", "late", 15)])  # older than the deletion: must stay deleted
    ctx = compact(service)  # the marker is read back from the previous ledger's parts in the bucket
    assert ctx.stats.full_rebuild is False
    assert view(service) == {b"keep": b"k"}
    produce_et(kafka, topic, [("a", "newer", 25)])  # newer than the deletion: comes back
    last = compact(service)
    assert view(service) == {b"keep": b"k", b"a": b"newer"}
    assert service.ledger_info().markers == 0
    # The replaced ledgers are gone from the bucket (no grace): the pointer and the current ledger remain.
    assert factory.store.ledger_ids(topic) == [last.ledger_id]
    manifest = factory.store.verify(topic, last.ledger_id)
    assert keys(factory, f"{topic}/") == sorted(
        [f"{topic}/{CURRENT}", f"{topic}/ledger-{last.ledger_id}/manifest.json"]
        + [f"{topic}/ledger-{last.ledger_id}/{f['name']}" for f in manifest.files])


# -- a throttled run ----------------------------------------------------------------------------------

# ~1 MB in 2 partitions (3:1) at 400 kB/s: >= 2.5 s; partition 1 ends first.
S3_CAP = 400_000
S3_RECORDS = [(f"k{i}", b"x" * 500, int(i % 4 == 0)) for i in range(2000)]


def test_a_throttled_compaction_reads_within_its_budget(kafka, make_factory, s3_server, monkeypatch):
    factory = s3_factory(make_factory, s3_server, compaction_max_read_bytes_per_second=S3_CAP)
    # No progress, cancel, rate or plan object appears in the bucket: the tasks use the run's channel.
    throttled_run(kafka, factory, monkeypatch, S3_RECORDS, S3_CAP, lambda: control_keys(factory.store.objects))


# -- the exact preview --------------------------------------------------------------------------------


def test_a_preview_task_counts_without_writing_and_is_cancellable(kafka, make_factory, s3_server):
    preview_counts_without_writing_and_is_cancellable(
        kafka, lambda **overrides: s3_factory(make_factory, s3_server, **overrides))


# -- deleting a topic ---------------------------------------------------------------------------------


def test_a_deletion_a_restart_interrupted_completes_at_the_next_open(kafka, make_factory, s3_server):
    kept, marked, half = kafka.topic(), kafka.topic(), kafka.topic()
    records = [("a", "1"), ("b", "2"), ("a", "3")]
    factory = s3_factory(make_factory, s3_server)
    for topic in (kept, marked, half):
        kafka.produce(topic, records)
        compact(factory.new_topic_compaction_service(topic))
    store = factory.store
    store.mark_deleting(marked)  # the daemon dies here: nothing of the topic was removed yet
    assert store.deletion_pending(marked) and not store.deletion_pending(kept)
    store.mark_deleting(half)
    store.objects.delete(f"{half}/{CURRENT}")  # as if the crash came after the pointer went

    factory = restart(make_factory, s3_server, factory)
    store = factory.store
    # each topic is recovered at its first touch (or when the paced recovery pass reaches it): a pending
    # deletion is completed before anything of the topic is answered
    assert not store.deletion_pending(marked) and not store.deletion_pending(half)
    assert keys(factory, f"{marked}/") == [] and keys(factory, f"{half}/") == []
    assert store.quarantined() == []  # a deletion, not a lost pointer
    assert store.topics() == [kept]
    service = factory.new_topic_compaction_service(kept)
    assert store.verify(kept, store.current_ledger_id(kept) or 0)
    assert view(service) == last_value_model(records)

    # A deletion that runs to its end (the daemon's: the mark, then the service's ledgers and the rest).
    assert store.mark_deleting(kept)
    service.delete()
    assert keys(factory, f"{kept}/") == [] and store.topics() == []


# -- a ledger that lost its pointer -------------------------------------------------------------------


def test_finalized_ledgers_without_current_are_quarantined_not_wiped(kafka, make_factory, s3_server, caplog):
    topic = kafka.topic()
    kafka.produce(topic, [("a", "1"), ("b", "2")])
    factory = s3_factory(make_factory, s3_server, compaction_retired_ledger_grace_seconds=600)
    service = factory.new_topic_compaction_service(topic)
    first = compact(service).ledger_id
    kafka.produce(topic, [("a", "3")])
    second = compact(service).ledger_id  # the first stays, retired
    ledgers = [k.removeprefix(f"{topic}/") for k in keys(factory, f"{topic}/") if k.startswith(f"{topic}/ledger-")]
    assert {k.split("/")[0] for k in ledgers} == {f"ledger-{first}", f"ledger-{second}"}
    factory.store.objects.put(f"{topic}/policies.json", b"{}")
    factory.store.objects.delete(f"{topic}/{CURRENT}")  # the pointer is lost

    with caplog.at_level(logging.WARNING, logger="compactord.ledger.store"):
        factory = restart(make_factory, s3_server, factory)
    store = factory.store
    assert store.current_ledger_id(topic) is None
    assert keys(factory, f"{topic}/") == [f"{topic}/policies.json"]  # policies stay
    [folder] = store.quarantined()
    assert folder.startswith(f"{topic}/")
    moved = [k.removeprefix(f"{QUARANTINE}/{folder}/") for k in keys(factory, f"{QUARANTINE}/{folder}/")]
    assert moved == ledgers  # every object of both ledgers, manifests included
    assert f"ledger-{second}/manifest.json" in moved
    assert "quarantine" in caplog.text and "no CURRENT" in caplog.text
    again = restart(make_factory, s3_server, factory)  # a second start leaves the quarantine alone
    assert again.store.quarantined() == [folder]
    assert [k.removeprefix(f"{QUARANTINE}/{folder}/") for k in keys(again, f"{QUARANTINE}/{folder}/")] == ledgers


# -- a corrupt part -----------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["flip-a-byte", "delete-the-file"])
def test_corrupt_ledger_is_not_served_and_the_next_run_rebuilds_it(kafka, make_factory, s3_server, caplog, damage):
    topic = kafka.topic()
    records = [(f"k{i % 8}", f"v{i}") for i in range(50)]
    kafka.produce(topic, records)
    factory = s3_factory(make_factory, s3_server)
    corrupt_id = compact(factory.new_topic_compaction_service(topic)).ledger_id
    damage_ledger(factory.store, topic, corrupt_id, damage)
    with pytest.raises(LedgerCorrupt, match="checksum" if damage == "flip-a-byte" else "missing"):
        factory.store.verify(topic, corrupt_id)

    # The next start verifies the ledger before serving it.
    factory = restart(make_factory, s3_server, factory)
    service = factory.new_topic_compaction_service(topic)
    ctx = not_served_then_rebuilt(service, corrupt_id, records, caplog)
    # The rebuilt ledger replaced the corrupt one, whose objects are gone from the bucket.
    assert factory.store.ledger_ids(topic) == [ctx.ledger_id]
    assert keys(factory, f"{topic}/ledger-{corrupt_id}/") == []
    factory.store.verify(topic, ctx.ledger_id)


# -- reads pinned to a retired ledger -----------------------------------------------------------------


def test_a_restart_still_serves_a_pinned_retired_ledger_until_its_until(kafka, make_factory, s3_server):
    topic = kafka.topic()
    first = [(f"k{i}", f"v{i}") for i in range(3)]
    kafka.produce(topic, first)
    factory = s3_factory(make_factory, s3_server, compaction_retired_ledger_grace_seconds=600)
    service = factory.new_topic_compaction_service(topic)
    old = compact(service).ledger_id
    second = [(f"k{i}", f"w{i}") for i in range(5)]
    kafka.produce(topic, second)
    compact(service)

    def served(service: Any, ledger_id: int | None) -> dict[bytes | None, bytes | None]:
        if ledger_id is None:
            return view(service)
        return {e.key: e.value for e in pinned(service, 0, ledger_id)}

    assert served(service, old) == last_value_model(first)
    # A new daemon on the same root: no timer, no handle in memory; the pointer's retired list in the bucket.
    factory = restart(make_factory, s3_server, factory, compaction_retired_ledger_grace_seconds=600)
    service = factory.new_topic_compaction_service(topic)
    assert served(service, old) == last_value_model(first)
    assert served(service, None) == last_value_model(first + second)
    assert [r.id for r in factory.store.pointer(topic).retired] == [old]

    # Its time passes while no daemon holds the root: its ``until`` moved into the past in the bucket.
    root = factory.store.location
    factory.close()
    objects = s3_server.store(root.removeprefix(f"s3://{BUCKET}/"))
    body = json.loads(objects.get(f"{topic}/{CURRENT}"))
    for entry in body["retired"]:
        entry["until"] = "2001-01-01T00:00:00Z"
    objects.put(f"{topic}/{CURRENT}", json.dumps(body).encode())
    factory = s3_factory(make_factory, s3_server, root=root, compaction_retired_ledger_grace_seconds=600)
    service = factory.new_topic_compaction_service(topic)
    assert factory.store.pointer(topic).retired == ()
    assert keys(factory, f"{topic}/ledger-{old}/") == []  # the start swept it
    with pytest.raises(LedgerRetired, match="replaced more than") as caught:
        served(service, old)
    assert caught.value.status == 410 and caught.value.code == "ledger_retired"
    assert served(service, None) == last_value_model(first + second)
