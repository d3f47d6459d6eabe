"""The reads' identity check (``daemon/identity.py``) and the one new-log rule it shares with the planning
and the monitor (``kafka/identity.py``), through the broker seam (``BrokerMetadata``): one request per
topic per second however many reads come, a bounded number of topics, and a broker that cannot be asked
leaves the last answer (and the response says so). The clock is the test's: nothing here waits."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

from compactord.daemon.identity import CHECKED_AT_HEADER, IdentityAnswer, TopicIdentities
from compactord.errors import BrokerUnavailable, TopicNotFound, TopicRecreated
from compactord.interfaces import BrokerMetadata
from compactord.kafka.identity import LedgerIdentity, LogNow, new_log_reason
from compactord.model import LedgerManifest, PartitionOffsets, StrategySettings, TopicConfigs


class Broker(BrokerMetadata):
    """Answers ``ids`` and ``ends`` (log start ``starts``) as set by the test; counts the identity requests;
    ``down`` makes them fail; ``gate`` (when set) holds each request until it is released."""

    def __init__(self) -> None:
        self.ids: dict[str, str | None] = {}
        self.ends: dict[str, dict[int, int]] = {}
        self.starts: dict[str, dict[int, int]] = {}
        self.asked: list[str] = []
        self.horizons: list[dict[int, int]] = []  # of each log_now
        self.down = False
        self.gate: threading.Event | None = None

    def list_topics(self) -> list[str]:
        return sorted(self.ends)

    def ping(self) -> None:
        pass

    def partitions(self, topic: str) -> list[int]:
        return sorted(self.ends[topic])

    def topic_id(self, topic: str) -> str | None:
        return self.ids.get(topic)

    def offsets(self, topic: str) -> dict[int, PartitionOffsets]:
        self.asked.append(topic)
        if self.gate is not None:
            self.gate.wait(30)
        if self.down:
            raise BrokerUnavailable("the Kafka broker at 127.0.0.1:9 is unreachable (test)")
        if topic not in self.ends:
            raise TopicNotFound(topic)
        starts = self.starts.get(topic, {})
        return {p: PartitionOffsets(p, starts.get(p, 0), e) for p, e in self.ends[topic].items()}

    def log_now(self, topic: str, horizon: Mapping[int, int]) -> tuple[str | None, dict[int, PartitionOffsets]]:
        self.horizons.append(dict(horizon))
        return super().log_now(topic, horizon)

    def first_records(self, topic: str, at: Mapping[int, int], offsets: Any) -> Any:
        raise AssertionError("the reads' check reads no record")

    def topic_configs(self, topic: str) -> TopicConfigs:
        return TopicConfigs()

    def close(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ledger(topic_id: str | None = "id-1", horizon: int = 99, log_start: int = 0) -> LedgerManifest:
    return LedgerManifest(1, "t", {0: horizon}, StrategySettings(), [], topic_id=topic_id, log_start={0: log_start},
                          finished_at_ms=int((time.time() - 60) * 1000))


def identities(broker: Broker, problem: list[str | None] | None = None, max_topics: int = 100,
               last_seen: Any = lambda _t: None) -> tuple[TopicIdentities, Clock]:
    clock = Clock()
    problem = problem if problem is not None else [None]
    return TopicIdentities(broker, lambda: problem[0], last_seen, max_topics=max_topics, clock=clock), clock


def same_topic(broker: Broker, topic: str = "t") -> None:
    broker.ids[topic], broker.ends[topic] = "id-1", {0: 100}


# -- the rule -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("topic_id", "start", "end", "why"), [
    ("id-2", 0, 100, "topic id changed from id-1 to id-2"),
    (None, 0, 10, "partition 0 now ends at 10, below the horizon 99"),
    (None, 5, 100, "partition 0 now starts at 5, below the log start 50"),
])
def test_a_new_log_says_why(topic_id: str | None, start: int, end: int, why: str) -> None:
    previous = LedgerIdentity("id-1", {0: 99}, {0: 50})
    assert why in (new_log_reason(previous, {0: PartitionOffsets(0, start, end)}, LogNow(topic_id)) or "")


def test_retention_past_the_horizon_is_not_a_new_log() -> None:
    previous = LedgerIdentity("id-1", {0: 99}, {0: 0})
    assert new_log_reason(previous, {0: PartitionOffsets(0, 150, 200)}, LogNow(None)) is None
    assert new_log_reason(previous, {0: PartitionOffsets(0, 150, 200)}, LogNow("id-1")) is None


def test_an_end_no_read_confirmed_is_no_evidence_of_a_new_log() -> None:
    """A broker may list an end below its last record (the test broker does): below the horizon, an end that
    no read confirmed tells nothing; the other evidence still does."""
    previous = LedgerIdentity("id-1", {0: 299}, {0: 50})
    listed = PartitionOffsets(0, 50, 291, end_confirmed=False)
    assert new_log_reason(previous, {0: listed}, LogNow(None)) is None
    assert new_log_reason(previous, {0: listed}, LogNow("id-1")) is None
    assert "topic id changed" in (new_log_reason(previous, {0: listed}, LogNow("id-2")) or "")
    assert "starts at 0" in (new_log_reason(previous, {0: PartitionOffsets(0, 0, 10, False)}, LogNow(None)) or "")
    assert "below the horizon" in (new_log_reason(previous, {0: PartitionOffsets(0, 50, 291)}, LogNow(None)) or "")


# -- the check ------------------------------------------------------------------------------------


def test_a_topic_recreated_with_a_new_id_answers_410() -> None:
    broker = Broker()
    broker.ids["t"], broker.ends["t"] = "id-2", {0: 500}  # longer than the old horizon: only the id tells
    check, _ = identities(broker)
    with pytest.raises(TopicRecreated, match="topic id changed from id-1 to id-2"):
        check.check("t", ledger())


def test_without_topic_ids_the_offsets_tell_a_recreated_topic() -> None:
    broker = Broker()
    broker.ids["t"], broker.ends["t"] = None, {0: 10}
    check, _ = identities(broker)
    with pytest.raises(TopicRecreated, match="below the horizon 99"):
        check.check("t", ledger())


def test_the_same_topic_passes_with_no_header() -> None:
    broker = Broker()
    same_topic(broker)
    check, _ = identities(broker)
    assert check.check("t", ledger()).headers() == {}


def test_a_deleted_topic_not_recreated_keeps_its_last_view() -> None:
    check, _ = identities(Broker())
    assert check.check("t", ledger()).headers() == {}


def test_one_request_per_topic_per_second_however_many_reads_come() -> None:
    broker = Broker()
    same_topic(broker)
    same_topic(broker, "u")
    broker.gate = threading.Event()
    check, clock = identities(broker)
    threads = [threading.Thread(target=check.check, args=("t", ledger())) for _ in range(20)]
    for thread in threads:
        thread.start()
    broker.gate.set()  # the first read's request answers; the others waited for it
    for thread in threads:
        thread.join(30)
    check.check("u", ledger())
    assert broker.asked == ["t", "u"]
    clock.now += 0.5
    check.check("t", ledger())
    assert broker.asked == ["t", "u"]
    clock.now += 0.6  # the answer is older than a second: asked again
    check.check("t", ledger())
    assert broker.asked == ["t", "u", "t"]


def test_a_topic_recreated_within_the_second_is_seen_at_the_next_ask() -> None:
    broker = Broker()
    same_topic(broker)
    check, clock = identities(broker)
    check.check("t", ledger())
    broker.ids["t"], broker.ends["t"] = "id-2", {0: 3}
    check.check("t", ledger())  # the answer of a moment ago
    clock.now += 1.0
    with pytest.raises(TopicRecreated):
        check.check("t", ledger())


def test_an_answer_older_than_the_ledger_is_asked_again() -> None:
    broker = Broker()
    same_topic(broker)
    check, _ = identities(broker)
    check.check("t", ledger())
    newer = ledger()
    newer.finished_at_ms = int((time.time() + 5) * 1000)  # a rebuild that landed after the answer
    check.check("t", newer)
    assert broker.asked == ["t", "t"]


def test_an_answer_serves_ledgers_up_to_the_horizon_it_was_asked_for_and_a_higher_one_asks_again() -> None:
    # The ends at or below the horizon an answer was asked for were confirmed by a read; a ledger whose horizon
    # is higher may need more of them confirmed.
    broker = Broker()
    same_topic(broker)
    broker.ends["t"] = {0: 200}
    check, _ = identities(broker)

    check.check("t", ledger(horizon=99))
    check.check("t", ledger(horizon=50))
    assert (broker.asked, broker.horizons) == (["t"], [{0: 99}])

    check.check("t", ledger(horizon=150))
    check.check("t", ledger(horizon=99))
    assert (broker.asked, broker.horizons) == (["t", "t"], [{0: 99}, {0: 150}])


def test_the_topics_kept_are_bounded() -> None:
    broker = Broker()
    for topic in ("a", "b", "c"):
        same_topic(broker, topic)
    check, _ = identities(broker, max_topics=2)
    for topic in ("a", "b", "c", "a"):
        check.check(topic, ledger())
    assert broker.asked == ["a", "b", "c", "a"]  # "a" was dropped when "c" came


def test_a_broker_known_down_is_not_asked_and_the_last_answer_is_used() -> None:
    broker = Broker()
    same_topic(broker)
    problem: list[str | None] = [None]
    check, clock = identities(broker, problem)
    check.check("t", ledger())
    problem[0] = "the broker does not answer"
    clock.now += 5
    checked = check.check("t", ledger())
    assert broker.asked == ["t"]
    assert checked.answer is not None and not checked.fresh
    at = checked.headers()[CHECKED_AT_HEADER]
    assert at.endswith("Z") and at[:4].isdigit()


def test_a_last_answer_that_says_recreated_still_answers_410_while_the_broker_is_down() -> None:
    broker = Broker()
    broker.ids["t"], broker.ends["t"] = "id-2", {0: 3}
    problem: list[str | None] = [None]
    check, clock = identities(broker, problem)
    with pytest.raises(TopicRecreated):
        check.check("t", ledger())
    problem[0] = "the broker does not answer"
    clock.now += 5
    with pytest.raises(TopicRecreated):
        check.check("t", ledger())


def test_a_failing_request_leaves_the_last_answer_and_is_not_repeated_within_the_second() -> None:
    broker = Broker()
    same_topic(broker)
    check, clock = identities(broker)
    check.check("t", ledger())
    broker.down = True
    clock.now += 2
    first = check.check("t", ledger())
    second = check.check("t", ledger())
    assert broker.asked == ["t", "t"]
    assert not first.fresh and not second.fresh and CHECKED_AT_HEADER in second.headers()
    clock.now += 1
    broker.down = False
    assert check.check("t", ledger()).fresh
    assert broker.asked == ["t", "t", "t"]


def test_without_any_answer_the_read_is_served_and_says_never() -> None:
    check, _ = identities(Broker(), ["the broker does not answer"])
    assert check.check("t", ledger()).headers() == {CHECKED_AT_HEADER: "never"}


def test_the_monitor_s_answer_is_used_when_it_is_newer() -> None:
    seen = IdentityAnswer("id-2", {0: PartitionOffsets(0, 0, 3)}, time.time())
    check, _ = identities(Broker(), ["the broker does not answer"], last_seen=lambda _t: seen)
    with pytest.raises(TopicRecreated):
        check.check("t", ledger())
