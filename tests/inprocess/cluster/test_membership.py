"""Cluster membership on the real broker: members split the coordination partitions, hand them over when
stopped, lose them to the others when killed, fence themselves when cut off from the broker, and list one
another; a partition is revoked by its owner before another member gets it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from compactord import __version__
from compactord.cluster import Membership, coordination_topic, ensure_coordination_topic
from compactord.config import Settings
from compactord.embedded import dies_with, free_port, tansu_binary
from compactord.errors import ConfigError
from tests.support.fault_proxy import TcpProxy
from tests.support.timeouts import REBALANCE_TIMEOUT_S, STOP_TIMEOUT_S
from tests.support.waiting import wait_for

PARTITIONS = 6
SESSION_MS = 6000
CHILD = Path(__file__).with_name("member_child.py")


def cluster_settings(bootstrap: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = dict(kafka_bootstrap_servers=bootstrap, kafka_request_timeout_ms=10000,
                                  cluster_name=f"t{uuid.uuid4().hex[:8]}", cluster_coordination_partitions=PARTITIONS,
                                  cluster_session_timeout_ms=SESSION_MS)
    values.update(overrides)
    return Settings(**values)


class Events:
    """Every member's callbacks, in the order they happened across members (a revoke is recorded when its
    callback returns, that is when the partitions are released)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[str, str, frozenset[int]]] = []

    def add(self, member: str, event: str, partitions: set[int] | list[int]) -> None:
        with self.lock:
            self.seen.append((member, event, frozenset(partitions)))

    def callbacks(self, member: str, revoke_s: float = 0.0) -> dict[str, Callable[[set[int]], None]]:
        def revoked(partitions: set[int]) -> None:
            time.sleep(revoke_s)  # the daemon stopping the topics' tasks
            self.add(member, "revoked", partitions)

        return {"on_assigned": lambda p: self.add(member, "assigned", p), "on_revoked": revoked,
                "on_lost": lambda p: self.add(member, "lost", p)}

    def holders(self) -> dict[int, str]:
        """Each partition's holder by the events so far; fails if a partition was given to a member while
        another still held it."""
        with self.lock:
            seen = list(self.seen)
        held: dict[int, str] = {}
        for member, event, partitions in seen:
            for p in partitions:
                if event == "assigned":
                    assert p not in held, f"partition {p} assigned to {member} while {held[p]} held it: {seen}"
                    held[p] = member
                elif held.get(p) == member:
                    del held[p]
        return held

    def of(self, member: str, event: str) -> list[frozenset[int]]:
        with self.lock:
            return [parts for who, what, parts in self.seen if who == member and what == event]


@pytest.fixture
def members(broker: Any) -> Iterator[Callable[..., Membership]]:
    """``members(settings, url, events, revoke_s=0)``: a started member, stopped at the end of the test."""
    made: list[Membership] = []

    def make(settings: Settings, url: str, events: Events, revoke_s: float = 0.0) -> Membership:
        member = Membership(settings, url, **events.callbacks(url, revoke_s)).start()
        made.append(member)
        return member

    yield make
    for member in made:
        member.stop()


def split(group: list[Membership]) -> bool:
    """Each member writes and holds some partitions, none held twice, none unheld."""
    owned = [m.owned() for m in group]
    return (all(m.may_write() for m in group) and all(owned) and sum(len(o) for o in owned) == PARTITIONS
            and frozenset().union(*owned) == frozenset(range(PARTITIONS)))


@pytest.mark.slow  # waits out rebalances (seconds each on the test broker)
def test_two_then_three_members_split_the_partitions_and_list_one_another(broker: Any, members: Any) -> None:
    settings = cluster_settings(broker.bootstrap)
    ensure_coordination_topic(settings)
    events = Events()
    group = [members(settings, "http://m1:8642", events, revoke_s=1.0),
             members(settings, "http://m2:8642", events, revoke_s=1.0)]
    wait_for(lambda: split(group), REBALANCE_TIMEOUT_S, "two members to split the partitions")
    # The roster: the same in every member of a generation, each member with its URL, version and partitions.
    wait_for(lambda: len({m.generation for m in group}) == 1 and all(
        {member.url: member.partitions for member in m.members()} == {n.url: n.owned() for n in group}
        for m in group), REBALANCE_TIMEOUT_S, "every member to list both")
    for m in group:
        assert [(x.member_id, x.url, x.version, x.generation) for x in m.members()] == sorted(
            (n.member_id, n.url, __version__, m.generation) for n in group)
    group.append(members(settings, "http://m3:8642", events, revoke_s=1.0))
    wait_for(lambda: split(group), REBALANCE_TIMEOUT_S, "three members to split the partitions")
    # Partitions moved to m3: revoked (and released) by their owner before m3 got them.
    assert events.of("http://m1:8642", "revoked") or events.of("http://m2:8642", "revoked")
    events.holders()
    assert not events.of("http://m1:8642", "lost") and not events.of("http://m2:8642", "lost")
    assert all(m.last_rebalance is not None and m.last_rebalance.seconds >= 0 for m in group)


@pytest.mark.slow  # waits out rebalances (seconds each on the test broker)
def test_a_revoke_that_blocks_past_the_session_keeps_the_member_and_the_partition_unassigned(
        broker: Any, members: Any) -> None:
    """The daemon may take longer than the session to stop a topic's tasks: the member's heartbeats go on
    meanwhile, and the partitions it releases go to the other member only once it returns."""
    settings = cluster_settings(broker.bootstrap)
    ensure_coordination_topic(settings)
    events = Events()
    first = members(settings, "http://m1:8642", events, revoke_s=1.5 * SESSION_MS / 1000)
    wait_for(lambda: len(first.owned()) == PARTITIONS, REBALANCE_TIMEOUT_S, "the first member to hold all")
    second = members(settings, "http://m2:8642", events)
    wait_for(lambda: split([first, second]), REBALANCE_TIMEOUT_S, "the second member to get its share")
    events.holders()
    assert events.of("http://m1:8642", "revoked") and not events.of("http://m1:8642", "lost")


@pytest.mark.slow  # waits out rebalances (seconds each on the test broker)
def test_a_member_stopped_hands_its_partitions_over(broker: Any, members: Any) -> None:
    settings = cluster_settings(broker.bootstrap)
    ensure_coordination_topic(settings)
    events = Events()
    staying = members(settings, "http://m1:8642", events)
    leaving = members(settings, "http://m2:8642", events, revoke_s=1.0)
    wait_for(lambda: split([staying, leaving]), REBALANCE_TIMEOUT_S, "two members to split the partitions")
    held = leaving.owned()
    leaving.stop()
    assert not leaving.may_write() and leaving.owned() == frozenset()
    wait_for(lambda: len(staying.owned()) == PARTITIONS, REBALANCE_TIMEOUT_S, "the other member to take all")
    assert events.of("http://m2:8642", "revoked")[-1] == held
    assert not events.of("http://m2:8642", "lost")
    assert events.holders() == dict.fromkeys(range(PARTITIONS), "http://m1:8642")


@contextlib.contextmanager
def member_process(bootstrap: str, name: str, url: str, events: Events) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen([sys.executable, str(CHILD), bootstrap, name, str(PARTITIONS), url],
                               stdout=subprocess.PIPE, text=True, start_new_session=True,
                               preexec_fn=dies_with(os.getpid()))  # noqa: PLW1509 - prctl and getppid only: safe after fork

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            event = json.loads(line)
            events.add(event["member"], event["event"], event["partitions"])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(STOP_TIMEOUT_S)
        reader.join(STOP_TIMEOUT_S)


@pytest.mark.slow  # waits out rebalances (seconds each on the test broker)
def test_a_killed_member_process_loses_its_partitions_to_the_others(broker: Any) -> None:
    settings = cluster_settings(broker.bootstrap)
    ensure_coordination_topic(settings)
    events = Events()
    with member_process(broker.bootstrap, settings.cluster_name, "http://m1:8642", events) as first, \
            member_process(broker.bootstrap, settings.cluster_name, "http://m2:8642", events):
        wait_for(lambda: set(events.holders().values()) == {"http://m1:8642", "http://m2:8642"}
                 and len(events.holders()) == PARTITIONS, REBALANCE_TIMEOUT_S, "two processes to split the partitions")
        os.kill(first.pid, signal.SIGKILL)  # no revoke, no leave: the broker finds out when the session ends
        first.wait(STOP_TIMEOUT_S)
        events.add("http://m1:8642", "lost", range(PARTITIONS))  # by the test: the killed process says nothing
        wait_for(lambda: events.holders() == dict.fromkeys(range(PARTITIONS), "http://m2:8642"), REBALANCE_TIMEOUT_S,
                 "the surviving process to hold every partition")


@pytest.fixture
def broker_behind_proxy(tmp_path: Path) -> Iterator[tuple[str, TcpProxy]]:
    """A broker of its own that advertises a relay's port, so that the relay can cut off its clients."""
    port = free_port()
    with TcpProxy(port) as proxy, open(tmp_path / "tansu.log", "ab") as log:
        process = subprocess.Popen(
            [str(tansu_binary()), "broker", "--listener-url", f"tcp://127.0.0.1:{port}",
             "--advertised-listener-url", f"tcp://127.0.0.1:{proxy.port}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=dies_with(os.getpid()))  # noqa: PLW1509 - prctl and getppid only: safe after fork
        try:
            wait_for(lambda: _listening(port), 30, "the broker to listen")
            yield f"127.0.0.1:{proxy.port}", proxy
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(STOP_TIMEOUT_S)


def _listening(port: int) -> bool:
    import socket

    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


@pytest.mark.slow  # waits out rebalances (seconds each on the test broker)
def test_a_member_cut_off_from_the_broker_stops_writing_within_the_session(
        broker_behind_proxy: tuple[str, TcpProxy], members: Any) -> None:
    """kafka-python's consumer keeps its assignment while it cannot reach the broker; the member does not."""
    bootstrap, proxy = broker_behind_proxy
    settings = cluster_settings(bootstrap)
    ensure_coordination_topic(settings)
    events = Events()
    member = members(settings, "http://m1:8642", events)
    wait_for(lambda: len(member.owned()) == PARTITIONS, REBALANCE_TIMEOUT_S, "the member to hold every partition")
    proxy.partition()
    wait_for(lambda: not member.may_write(), REBALANCE_TIMEOUT_S, "the member to fence itself")
    assert member.owned() == frozenset()
    proxy.rejoin()
    wait_for(lambda: member.may_write() and len(member.owned()) == PARTITIONS, REBALANCE_TIMEOUT_S,
             "the member to hold every partition again")


def test_an_existing_coordination_topic_with_another_partition_count_is_refused(broker: Any, kafka: Any) -> None:
    settings = cluster_settings(broker.bootstrap, cluster_coordination_partitions=4)
    topic = coordination_topic(settings.cluster_name)
    kafka.admin.create_topics({topic: {"num_partitions": 3, "replication_factor": 1}})
    with pytest.raises(ConfigError) as refused:
        ensure_coordination_topic(settings)
    assert refused.value.key == "clusterCoordinationPartitions"
    assert f"the coordination topic {topic} exists with 3 partitions, not 4" in refused.value.message
    ensure_coordination_topic(settings.with_overrides(cluster_coordination_partitions=3))


def test_a_missing_coordination_topic_is_created_with_the_configured_partitions(broker: Any, kafka: Any) -> None:
    settings = cluster_settings(broker.bootstrap, cluster_coordination_partitions=5)
    ensure_coordination_topic(settings)
    (described,) = kafka.admin.describe_topics([coordination_topic(settings.cluster_name)])
    assert len(described["partitions"]) == 5
    ensure_coordination_topic(settings)  # a second member finds it as it wants it
