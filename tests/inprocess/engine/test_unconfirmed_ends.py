"""An end offset no read confirmed is no evidence of a new log (see #40): the test broker (Tansu) lists the end
of a topic produced in batches at its last batch's first offset + 1, below its last record, and the read that
confirms the ends may not reach a partition in time. Neither the monitor's pass nor a run's planning then takes
the topic as recreated; a topic truly recreated with fewer records is still taken as one, on the end a read
confirmed.

Real broker, real Spark runs, a real monitor pass (``BacklogMonitor``) over the real broker client; the
confirming read is made to time out by giving the real read no time (its module's function, wrapped)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from compactord.daemon.metrics import Metrics
from compactord.daemon.monitor import BacklogMonitor
from compactord.daemon.policies import PolicyStore
from compactord.daemon.scheduler import TaskRegistry
from compactord.kafka import end_offsets, librdkafka
from tests.conftest import settings_for
from tests.support.brokers import Answers
from tests.support.service import compact, view
from tests.support.timeouts import TASK_TIMEOUT_S

RECORDS = 300


def produce_in_two_batches(kafka: Any, topic: str) -> None:
    """300 records, the last 10 in a batch of their own: the test broker lists the end at 291."""
    kafka.produce(topic, [(f"k{i % 50}", f"v{i}") for i in range(RECORDS - 10)])
    kafka.produce(topic, [(f"k{i % 50}", f"v{i}") for i in range(RECORDS - 10, RECORDS)])


def listed_end(kafka: Any, topic: str) -> int:
    from kafka import TopicPartition

    tp = TopicPartition(topic, 0)
    return int(end_offsets.list_offsets(kafka.admin, [tp], 10_000)[1][tp])


def no_time_to_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every read confirming ends times out before the broker answers it (the real read, given no time; the reads
    run in the probe processes, which import these functions by name)."""
    monkeypatch.setattr(end_offsets, "read_ends_many", read_ends_many_in_no_time)
    monkeypatch.setattr(end_offsets, "read_ends", read_ends_in_no_time)


def read_ends_in_no_time(config: Any, topic: str, listed: Any, _timeout_s: float) -> Any:
    return librdkafka.read_ends(config, topic, listed, 0)


def read_ends_many_in_no_time(config: Any, listed: Any, _timeout_s: float) -> Any:
    return librdkafka.read_ends_many(config, listed, 0)


@pytest.fixture
def monitored(broker: Any, make_factory: Any, tmp_path: Any) -> Iterator[Any]:
    """``monitored()``: a factory, and a backlog monitor over the real broker client (as given by
    ``Answers``, which reports no topic ids) whose only trigger is the ledger's view (no threshold is on), with its task registry."""
    made: list[tuple[TaskRegistry, Answers]] = []

    def make() -> tuple[Any, BacklogMonitor, Answers, TaskRegistry]:
        from compactord.kafka.admin import KafkaAdmin

        factory = make_factory()
        settings = settings_for(broker, tmp_path / "ledgers", threshold_bytes=0, threshold_messages=0,
                                topics_pattern="unconfirmed-.*")
        answers = Answers(KafkaAdmin(settings))
        registry = TaskRegistry(factory, 1, 60.0)
        made.append((registry, answers))
        monitor = BacklogMonitor(settings, answers, factory.store, registry,
                                 PolicyStore(factory.store, ["publishing-order"]), Metrics())
        return factory, monitor, answers, registry

    yield make
    for registry, answers in made:
        registry.shutdown(TASK_TIMEOUT_S)
        answers.close()


def test_an_unconfirmed_end_below_the_horizon_is_not_taken_for_a_recreated_topic(
        kafka: Any, monitored: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    factory, monitor, answers, registry = monitored()
    topic = kafka.topic(prefix="unconfirmed")
    answers.topic_ids[topic] = None  # only the offsets can tell
    service = factory.new_topic_compaction_service(topic)
    produce_in_two_batches(kafka, topic)
    compact(service)
    assert service.ledger_info().horizon == {0: RECORDS - 1}  # the run's read confirmed the true end
    assert listed_end(kafka, topic) < RECORDS  # as the test broker lists it

    no_time_to_read(monkeypatch)
    monitor.run_once()
    ctx = registry.last(topic)
    assert ctx is None, f"the pass started a {ctx.reason.kind} task: {ctx.reason.detail}"
    assert monitor.backlogs[topic].records == 0  # unknown: nothing is taken as backlog


def test_a_run_whose_read_does_not_confirm_an_end_below_the_horizon_does_not_rebuild(
        kafka: Any, make_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    service = make_factory().new_topic_compaction_service(topic := kafka.topic(prefix="unconfirmed"))
    produce_in_two_batches(kafka, topic)
    compact(service)
    first = service.ledger_info()
    assert listed_end(kafka, topic) < RECORDS and first.horizon == {0: RECORDS - 1}

    no_time_to_read(monkeypatch)  # the run's own read (and its second one) times out: the end is unknown
    ctx = compact(service)
    assert not ctx.stats.recreated and not ctx.stats.full_rebuild
    assert service.ledger_info().ledger_id == first.ledger_id  # nothing to do: the ledger stays
    assert view(service) == {f"k{k}".encode(): f"v{RECORDS - 50 + k}".encode() for k in range(50)}


def test_a_topic_recreated_with_fewer_records_is_still_taken_for_a_recreated_topic(
        kafka: Any, monitored: Any) -> None:
    factory, monitor, answers, registry = monitored()
    topic = kafka.topic(prefix="unconfirmed")
    answers.topic_ids[topic] = None  # only the offsets can tell
    service = factory.new_topic_compaction_service(topic)
    produce_in_two_batches(kafka, topic)
    compact(service)

    kafka.recreate(topic)
    kafka.produce(topic, [(f"new{i}", f"w{i}") for i in range(10)])
    monitor.run_once()
    ctx = registry.last(topic)
    assert ctx is not None and ctx.reason.kind == "recreated", ctx and ctx.reason
    assert f"now ends at 10, below the horizon {RECORDS - 1}" in ctx.reason.detail
    ctx.result(TASK_TIMEOUT_S)
    assert ctx.stats.recreated and ctx.stats.full_rebuild
    assert view(service) == {f"new{i}".encode(): f"w{i}".encode() for i in range(10)}
