"""The compacted view stays right under what real brokers do: a topic deleted and recreated under its
name, retention moving the log start, Kafka's rule for empty values, a switch that fails after its
commit point, and a plug-in subclass of a built-in strategy.

Real broker, real Spark job, real ledger. Where the test broker (Tansu 0.6) cannot produce a broker's
behaviour (it cannot move a log start, and a production broker may report no topic id), the test gives
that answer at the boundary that receives it (``tests.support.brokers.Answers``) and says so.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from compactord.errors import InsufficientDiskSpace
from compactord.ledger.store import LedgerStore
from compactord.task import TaskState
from tests.support.brokers import Answers
from tests.support.service import compact, entries, view
from tests.support.timeouts import TASK_TIMEOUT_S


def _manifest(service: Any) -> Any:
    return service.ledger_info()


@pytest.fixture
def answered(make_factory: Any) -> Any:
    """``answered(**settings) -> (factory, answers)``: a factory whose broker metadata the test answers
    for where the test broker cannot (``Answers``), the rest coming from the real broker."""

    def make(**overrides: Any) -> tuple[Any, Answers]:
        made: list[Answers] = []
        factory = make_factory(metadata=lambda real: made.append(Answers(real)) or made[0], **overrides)
        return factory, made[0]

    return make


# -- 1. a topic deleted and recreated under the same name -------------------------------------------------


@pytest.mark.parametrize("topic_ids", [True, False], ids=["topic-id", "fingerprint-only"])
def test_a_recreated_topic_longer_than_the_old_horizon_is_rebuilt(kafka: Any, answered: Any,
                                                                 topic_ids: bool) -> None:
    """Reproduced from the issue: 100 keys compacted, topic recreated, 150 new records: the old view
    must go and every new record count. Without topic ids (``fingerprint-only``: a broker that reports
    none, answered at the metadata boundary) the record at the fingerprint's offset tells."""
    topic = kafka.topic()
    factory, answers = answered()
    if not topic_ids:
        answers.topic_ids[topic] = None  # a broker that reports no topic ids
    service = factory.new_topic_compaction_service(topic)
    kafka.produce(topic, [(f"old{i}", f"v{i}") for i in range(100)])
    compact(service)
    first = _manifest(service)
    assert first.fingerprints is not None and first.fingerprints[0].offset == 99
    assert (first.topic_id is not None) is topic_ids

    kafka.recreate(topic, 1)
    kafka.produce(topic, [(f"new{i}", f"w{i}") for i in range(150)])
    ctx = compact(service)

    assert ctx.stats.recreated and ctx.stats.full_rebuild
    assert view(service) == {f"new{i}".encode(): f"w{i}".encode() for i in range(150)}
    second = _manifest(service)
    if topic_ids:
        assert second.topic_id is not None and second.topic_id != first.topic_id


def test_a_recreated_topic_with_fewer_partitions_drops_the_rows_of_the_partitions_gone(
    kafka: Any, make_factory: Any
) -> None:
    topic = kafka.topic(partitions=3)
    service = make_factory().new_topic_compaction_service(topic)
    kafka.produce(topic, [(f"k{p}-{i}", "v", p) for p in range(3) for i in range(5)])
    compact(service)
    assert len(entries(service, 2)) == 5

    kafka.recreate(topic, 2)
    kafka.produce(topic, [(f"n{p}-{i}", "w", p) for p in range(2) for i in range(20)])
    ctx = compact(service)

    assert ctx.stats.recreated
    assert set(_manifest(service).horizon) == {0, 1}
    assert entries(service, 2) == []
    assert view(service, 2) == {f"n{p}-{i}".encode(): b"w" for p in range(2) for i in range(20)}


def test_a_fingerprinted_record_that_is_only_gone_is_not_a_recreate(kafka: Any, answered: Any) -> None:
    """Retention (or the broker's own cleaner) removed the fingerprinted record; same topic id: the run
    stays incremental. The moved log start is the broker's answer (Tansu cannot move it)."""
    topic = kafka.topic()
    factory, answers = answered()
    service = factory.new_topic_compaction_service(topic)
    kafka.produce(topic, [(f"k{i}", f"v{i}") for i in range(10)])
    compact(service)
    kafka.produce(topic, [("k0", "again"), ("k20", "v20")])
    answers.log_start[topic] = {0: 11}  # offsets 0..10 are gone; the fingerprint was at 9
    ctx = compact(service)

    assert not ctx.stats.recreated and not ctx.stats.full_rebuild
    assert view(service) == {b"k20": b"v20"}  # k0's new value sits at offset 10, below the log start
    assert _manifest(service).fingerprints[0].offset == 11


def test_a_legacy_manifest_without_identity_records_it_and_stays_incremental(
    kafka: Any, make_factory: Any
) -> None:
    topic = kafka.topic()
    factory = make_factory()
    service = factory.new_topic_compaction_service(topic)
    kafka.produce(topic, [("a", "1"), ("b", "2")])
    compact(service)
    path = factory.store.ledger_path(topic, _manifest(service).ledger_id) / "manifest.json"
    data = json.loads(path.read_text())
    for key in ("topic_id", "fingerprints"):
        data.pop(key)
    data["strategy"]["empty_value_is_tombstone"] = False  # same rule as configured: no rebuild for it
    path.write_text(json.dumps(data))
    service.close()  # forget the loaded ledger: read the rewritten manifest

    kafka.produce(topic, [("c", "3")])
    ctx = compact(service)
    assert not ctx.stats.full_rebuild
    manifest = _manifest(service)
    assert manifest.topic_id is not None and manifest.fingerprints[0].offset == 2
    assert view(service) == {b"a": b"1", b"b": b"2", b"c": b"3"}


def test_a_range_the_log_no_longer_reaches_fails_the_task_and_keeps_the_ledger(
    kafka: Any, answered: Any
) -> None:
    """The broker says the log ends at 20 when the run is planned, but the log (recreated behind an
    unchanged topic id, as the broker's answer has it) ends at 3: the readers never read other offsets
    than the range's (no reset to the log start), the task fails, the ledger stays."""
    topic = kafka.topic()
    factory, answers = answered()
    service = factory.new_topic_compaction_service(topic)
    kafka.produce(topic, [(f"k{i}", "v") for i in range(10)])
    compact(service)
    before = _manifest(service)
    answers.topic_ids[topic] = before.topic_id
    answers.ends[topic] = {0: 20}
    kafka.recreate(topic, 1)
    kafka.produce(topic, [("x", "1"), ("y", "2"), ("z", "3")])

    ctx = service.compact()
    assert ctx.result(TASK_TIMEOUT_S) is TaskState.FAILED
    assert "OffsetOutOfRange" in str(ctx.error) or "below the end" in str(ctx.error), ctx.error
    assert _manifest(service).ledger_id == before.ledger_id
    assert len(entries(service)) == 10


# -- 2. retention: what the log no longer holds is not readable from the ledger --------------------------


def test_records_below_a_moved_log_start_leave_the_ledger_without_new_records(
    kafka: Any, answered: Any
) -> None:
    """Pulsar's rule: a message retention removed is not readable from the compacted ledger. Only the
    log start moved (given at the metadata boundary): the run still runs and drops them."""
    topic = kafka.topic()
    factory, answers = answered()
    service = factory.new_topic_compaction_service(topic)
    kafka.produce(topic, [(f"k{i}", f"v{i}") for i in range(10)])
    compact(service)
    answers.log_start[topic] = {0: 6}
    ctx = compact(service)
    assert not ctx.stats.skipped
    assert view(service) == {f"k{i}".encode(): f"v{i}".encode() for i in range(6, 10)}


def test_first_value_chooses_among_what_the_log_still_holds(kafka: Any, answered: Any) -> None:
    topic = kafka.topic()
    factory, answers = answered(compaction_strategy="first-value")
    service = factory.new_topic_compaction_service(topic)
    kafka.produce(topic, [("k", "first"), ("j", "1"), ("k", "second"), ("k", "third")])
    compact(service)
    assert view(service) == {b"k": b"first", b"j": b"1"}
    answers.log_start[topic] = {0: 2}
    ctx = compact(service)
    assert ctx.stats.full_rebuild  # the ledger dropped "second" as a loser: only the log has it
    assert view(service) == {b"k": b"second"}


# -- 3. Kafka's rule for deletes ---------------------------------------------------------------------------


def test_an_empty_value_is_a_value_and_pulsar_s_rule_is_a_setting_that_rebuilds(
    kafka: Any, make_factory: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topic = kafka.topic()
    records = [("empty", ""), ("null", "x"), ("null", None), ("value", "v")]
    kafka.produce(topic, records)
    kafka_rule = make_factory(root=tmp_path / "kafka").new_topic_compaction_service(topic)
    compact(kafka_rule)
    assert view(kafka_rule) == {b"empty": b"", b"value": b"v"}
    assert _manifest(kafka_rule).strategy.empty_value_is_tombstone is False

    kafka_rule.close()
    pulsar_rule = make_factory(store=kafka_rule.factory.store, compaction_empty_value_is_tombstone=True)
    service = pulsar_rule.new_topic_compaction_service(topic)
    with caplog.at_level(logging.WARNING, logger="compactord.engine.planning"):
        ctx = compact(service)
    assert ctx.stats.full_rebuild  # the rule is part of the strategy settings: a change rebuilds
    assert view(service) == {b"value": b"v"}
    # the log names what changed, not a Python repr of the settings
    assert "the strategy settings changed (empty_value_is_tombstone False -> True)" in caplog.text
    assert "StrategySettings(" not in caplog.text


@pytest.mark.parametrize("strategy", ["first-value", "event-time", "tests.inprocess.engine.strategies:LongestValue"])
def test_every_strategy_keeps_an_empty_value(kafka: Any, make_factory: Any, strategy: str) -> None:
    topic = kafka.topic()
    service = make_factory(compaction_strategy=strategy).new_topic_compaction_service(topic)
    kafka.produce(topic, [("k", ""), ("gone", "x"), ("gone", None)])
    compact(service)
    assert view(service) == {b"k": b""}


# -- 6. smaller defects ------------------------------------------------------------------------------------


def test_a_subclass_of_a_builtin_gets_its_own_fold_in_the_job(kafka: Any, make_factory: Any) -> None:
    topic = kafka.topic()
    service = make_factory(compaction_strategy="tests.inprocess.engine.strategies:LastValueWins").new_topic_compaction_service(topic)
    kafka.produce(topic, [("k", "first"), ("k", "second")])
    compact(service)
    assert view(service) == {b"k": b"second"}  # FirstValue's native query would keep "first"


class _FailingSwitch(LedgerStore):
    """A ledger store whose switch fails before or after its commit point (replacing CURRENT)."""

    when = "never"

    def switch(self, topic: str, ledger_id: int, *args: Any, **kwargs: Any) -> Any:
        if self.when == "never":
            return super().switch(topic, ledger_id, *args, **kwargs)
        if self.when == "before":
            raise InsufficientDiskSpace("switching: no space left on the device (before CURRENT moved)")
        super().switch(topic, ledger_id, *args, **kwargs)
        raise OSError(5, "Input/output error (fsync of the topic directory, after CURRENT moved)")


@pytest.mark.parametrize("when", ["before", "after"])
def test_the_switch_commits_at_the_replacement_of_current(kafka: Any, make_factory: Any, tmp_path: Path,
                                                         when: str) -> None:
    topic = kafka.topic()
    kafka.produce(topic, [("a", "1")])
    store = _FailingSwitch(str(tmp_path / "ledgers")).open()
    factory = make_factory(store=store)
    service = factory.new_topic_compaction_service(topic)
    compact(service)  # the first run switches normally
    first = _manifest(service).ledger_id
    store.when = when
    kafka.produce(topic, [("b", "2")])

    ctx = service.compact()
    state = ctx.result(TASK_TIMEOUT_S)
    assert ctx.worker_done.wait(TASK_TIMEOUT_S)  # the slot is released either way
    if when == "before":
        assert state is TaskState.FAILED
        assert store.current_ledger_id(topic) == first
        assert view(service) == {b"a": b"1"}
    else:
        assert state is TaskState.SUCCEED, ctx.error
        assert "Input/output error" in (ctx.stats.switch_warning or "")
        assert store.current_ledger_id(topic) != first
        assert view(service) == {b"a": b"1", b"b": b"2"}
    assert [p.name for p in (store.root / topic).iterdir() if p.name.startswith("ledger-")]  # nothing half-deleted


def test_retained_null_keys_are_read_from_kafka_once(kafka: Any, make_factory: Any, spark_manager: Any,
                                                      tmp_path: Path) -> None:
    from compactord.engine.job import build_winners, job_spec
    from compactord.engine.kafka_source import OffsetRange
    from compactord.engine.strategies import ResolvedStrategy

    topic = kafka.topic()
    kafka.produce(topic, [(None, "n1"), ("k", "1"), (None, "n2"), ("k", "2")])
    factory = make_factory(topic_compaction_retain_null_key=True)
    strategy = ResolvedStrategy.resolve("publishing-order", "timestamp", True)
    spec = job_spec(factory.settings, strategy, topic=topic, ranges=[OffsetRange(0, 0, 4)], ledger_files=[],
                    output_path=str(tmp_path / "out"), log_start={0: 0},
                    widths=spark_manager.job_widths(4))
    df = build_winners(spark_manager.spark, spec, strategy.strategy)
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert plan.count("compactord_kafka") == 1, plan
    assert sorted((r["offset"], r["key"], r["value"]) for r in df.collect()) == [(0, None, b"n1"), (2, None, b"n2"),
                                                                                  (3, b"k", b"2")]


def test_under_event_time_a_tombstone_without_an_event_time_does_not_delete(kafka: Any, make_factory: Any) -> None:
    """The documented rule: a record without an event time never replaces one that has it, and a
    tombstone is such a record; send the deletion with the event-time header to delete."""
    topic = kafka.topic()
    service = make_factory(compaction_strategy="event-time",
                           compaction_event_time_source="header:et").new_topic_compaction_service(topic)
    et = [("et", b"10")]
    kafka.produce(topic, [("k", "v", 0, None, et), ("k", None), ("j", "w", 0, None, et),
                          ("j", None, 0, None, [("et", b"11")])])
    compact(service)
    assert view(service) == {b"k": b"v"}
