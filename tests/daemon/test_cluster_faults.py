"""A cluster of three real daemons on a shared local root, under faults: a member stopped (SIGSTOP) while it switches
a topic and resumed after its topics moved is fenced and rejoins; a few dozen topics that their owners' monitors keep
compacting are held by one member at a time and never compacted by two at once while a member restarts; a rolling
restart of every member leaves reads answering, and the view changing only by committed switches.

Each member holds its runs at the ``switch`` checkpoint while its own gate file is missing (the test factory
``PausingFactory``; every gate is there unless a test removes it). Waits are bounded by ``REBALANCE_TIMEOUT_S`` and
``TASK_TIMEOUT_S``, never timed.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import httpx
import pytest

from tests.conftest import Kafka
from tests.daemon.conftest import Launcher
from tests.deploy.test_packaging import CLUSTER_ONLY, names_used_in_deploy
from tests.support.cluster import Root, by_url, cluster_of, member, owner_url, running, settled, view
from tests.support.daemon import DaemonProcess, compact, metric, metric_samples, status, wait_state
from tests.support.probes import GATE_ENV
from tests.support.timeouts import REBALANCE_TIMEOUT_S, TASK_TIMEOUT_S
from tests.support.waiting import wait_for

# The members' monitors compact the topics kafka.topic(prefix="cf") makes, at their first new record.
MONITORED = "cf-[0-9]+-[0-9a-f]{6}"
TOPICS = 24
# No grace: a replaced ledger is deleted as soon as no read holds it, so that a read racing its owner's next switch
# (its look-up of the current ledger's manifest, ``TopicCompactionService.ledger_info``) finds it gone and must
# read the new one, never answer 500.
RETIRED_GRACE_S = 0
NAMES = ("a", "b", "c")


@pytest.fixture(scope="module")
def gates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each member's gate at ``switch``: present (runs pass) unless a test removes it, and touches it again."""
    folder = tmp_path_factory.mktemp("cluster-gates")
    found = {name: folder / name for name in NAMES}
    for gate in found.values():
        gate.touch()
    return found


@pytest.fixture(scope="module")
def members(launch: Launcher, tmp_path_factory: pytest.TempPathFactory,
            gates: dict[str, Path]) -> Iterator[list[DaemonProcess]]:
    root = Root("local", tmp_path_factory.mktemp("cluster-faults") / "ledgers", {})
    daemons = []
    for name in NAMES:
        daemon = member(launch, root, name, pauses="", sparkMaster="local[1]", compactionTopicsPattern=MONITORED,
                        compactionThresholdInMessages=1, brokerServiceCompactionMonitorIntervalInSeconds=1,
                        compactionRetiredLedgerGraceSeconds=RETIRED_GRACE_S)
        daemon.env[GATE_ENV] = f"switch:{gates[name]}"
        daemons.append(daemon)
    with running(daemons):
        yield daemons


@pytest.fixture(scope="module")
def topics(kafka: Kafka, members: list[DaemonProcess]) -> list[str]:
    """Tiny topics the members' monitors compact, each compacted once by its owner before the tests go on."""
    names = [kafka.topic(prefix="cf") for _ in range(TOPICS)]
    for n, topic in enumerate(names):
        kafka.produce(topic, [(f"k{i % 3}", f"v{n}-{i}") for i in range(6)])
    for topic in names:
        owner = by_url(members, owner_url(members[0], topic))
        wait_for(lambda t=topic, o=owner: status(o, t)["state"] == "Succeed", TASK_TIMEOUT_S,  # type: ignore[misc]
                 f"topic {topic}'s first compaction by its owner", owner)
    return names


def name_of(members: list[DaemonProcess], daemon: DaemonProcess) -> str:
    return NAMES[members.index(daemon)]


def history(daemon: DaemonProcess, topic: str) -> list[dict[str, Any]]:
    answer = daemon.client().get(f"/v1/topics/{topic}/history", params={"limit": 1000})
    assert answer.status_code == 200, answer.text
    runs: list[dict[str, Any]] = answer.json()["runs"]
    return runs


def ledger_served(daemon: DaemonProcess, topic: str) -> int:
    answer = daemon.client().get(f"/v1/topics/{topic}/compacted", params={"partition": 0, "limit": 1})
    assert answer.status_code == 200, answer.text
    ledger: int = answer.json()["ledger_id"]
    return ledger


def test_the_cluster_s_metrics_named_under_deploy_are_served_by_a_member(members: list[DaemonProcess]) -> None:
    served = {name for name, _, _ in metric_samples(members[0])}
    assert names_used_in_deploy() >= CLUSTER_ONLY
    assert served >= CLUSTER_ONLY, sorted(CLUSTER_ONLY - served)


# -- the zombie ---------------------------------------------------------------------------------


def test_a_member_resumed_after_its_topics_moved_is_fenced_serves_the_new_owner_s_view_and_rejoins(
        kafka: Kafka, members: list[DaemonProcess], gates: dict[str, Path]) -> None:
    topic = kafka.topic(prefix="zb")  # not the monitors': only triggers compact it
    kafka.produce(topic, [(f"k{i % 3}", f"first-{i}") for i in range(12)])
    zombie = by_url(members, owner_url(members[0], topic))
    others = [d for d in members if d is not zombie]
    compact(zombie, topic)
    before, ledger_before = view(zombie, topic), ledger_served(zombie, topic)
    kafka.produce(topic, [("k-late", "read by the zombie's run only")])
    gate = gates[name_of(members, zombie)]
    gate.unlink()
    try:
        answer = zombie.client().put(f"/v1/topics/{topic}/compaction")
        assert answer.status_code == 202, answer.text
        task_id = answer.json()["task_id"]
        wait_state(zombie, topic, "Ending_with_switch_ledger")  # its ledger written, held before the switch
        os.kill(zombie.pid, signal.SIGSTOP)  # the daemon's process only: its Spark JVM runs on
        try:
            wait_for(lambda: settled(others), REBALANCE_TIMEOUT_S, "the other two to hold every partition")
            new_owner = by_url(others, owner_url(others[0], topic))
            wait_for(lambda: topic in cluster_of(new_owner)["owned_topics"], REBALANCE_TIMEOUT_S,
                     f"the new owner to take topic {topic}", new_owner)
        finally:
            os.kill(zombie.pid, signal.SIGCONT)
    finally:
        gate.touch()  # released: its switch is tried now
    final = wait_state(zombie, topic, "Succeed", "Failed", "Cancelled")
    assert (final["task_id"], final["state"]) == (task_id, "Failed"), final
    [run] = [r for r in history(new_owner, topic) if r["task_id"] == task_id]
    assert run["error_type"] == "fenced", run
    assert (metric(zombie, "compactord_fenced_switches_total") or 0) >= 1
    # Nothing the zombie wrote is served: every member serves the ledger the new owner took over.
    for daemon in members:
        assert ledger_served(daemon, topic) == ledger_before
        assert view(daemon, topic) == before
    # It rejoins as an ordinary member; a trigger sent to it runs on the owner, and then every member serves that.
    wait_for(lambda: settled(members), REBALANCE_TIMEOUT_S, "the resumed member to rejoin", zombie)
    owner = by_url(members, owner_url(zombie, topic))
    answer = zombie.client().put(f"/v1/topics/{topic}/compaction")
    assert answer.status_code == 202, answer.text
    assert wait_state(owner, topic, "Succeed", "Failed")["state"] == "Succeed"
    after = view(owner, topic)
    assert "k-late" in {e[2] for e in after}
    wait_for(lambda: all(view(d, topic) == after for d in members), REBALANCE_TIMEOUT_S,
             "every member to serve the owner's switch")


# -- one owner at a time, one run at a time ---------------------------------------------------------


class Background:
    """A thread of a test's (``_run``, until ``_stop`` is set), from ``with`` to its end."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        raise NotImplementedError


class Load(Background):
    """Records produced to the topics round-robin (each topic's owner compacts it at once) until the end of its ``with``."""

    def __init__(self, kafka: Kafka, topics: list[str]) -> None:
        self._kafka, self._topics = kafka, topics
        super().__init__()
        self.errors: list[str] = []

    def _run(self) -> None:
        try:
            with self._kafka.producer() as producer:
                for n in itertools.count():
                    if self._stop.wait(0.2):
                        return
                    producer.send(self._topics[n % len(self._topics)], key=b"k-load", value=f"load-{n}".encode())
                    producer.flush()
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(repr(exc))


class Holders(Background):
    """Samples every member's ``/v1/cluster`` until the end of its ``with``: each answer's generation and the topics it has taken."""

    def __init__(self, members: list[DaemonProcess], topics: list[str]) -> None:
        self._members, self._topics = members, set(topics)
        super().__init__()
        self.rounds: list[list[tuple[str, int | None, frozenset[str]]]] = []

    def _run(self) -> None:
        clients = [(NAMES[n], httpx.Client(base_url=d.url, timeout=10.0, headers={"Authorization": f"Bearer {d.token}"}))
                   for n, d in enumerate(self._members)]
        try:
            while not self._stop.wait(0.1):
                found = []
                for name, client in clients:
                    try:
                        answer = client.get("/v1/cluster")
                    except httpx.HTTPError:
                        continue  # the member restarting
                    if answer.status_code == 200:
                        body = answer.json()
                        found.append((name, body["generation"], frozenset(body["owned_topics"]) & self._topics))
                self.rounds.append(found)
        finally:
            for _, client in clients:
                client.close()

    def doubles(self) -> list[tuple[str, list[tuple[str, int | None]]]]:
        """The topics that two members said they held in one generation: (topic, [(member, generation)])."""
        held: dict[tuple[int | None, str], set[str]] = {}
        for found in self.rounds:
            for name, generation, taken in found:
                for topic in taken:
                    held.setdefault((generation, topic), set()).add(name)
        return [(topic, [(name, generation) for name in sorted(names)])
                for (generation, topic), names in held.items() if generation is not None and len(names) > 1]

    def owners(self, topic: str) -> set[str]:
        return {name for found in self.rounds for name, _, taken in found if topic in taken}


def runs_overlapping(runs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Pairs of runs (task ids) of one topic whose times overlap; the ISO times sort as they read."""
    timed = sorted((r for r in runs if r["started_at"] is not None), key=lambda r: r["started_at"])
    return [(earlier["task_id"], later["task_id"]) for earlier, later in itertools.pairwise(timed)
            if later["started_at"] < earlier["finished_at"]]


def idle(members: list[DaemonProcess], topics: list[str]) -> bool:
    """Every topic's last compaction, on its owner, has ended."""
    for topic in topics:
        owner = by_url(members, owner_url(members[0], topic))
        if status(owner, topic)["state"] not in ("Succeed", "Failed", "Cancelled"):
            return False
    return True


def ran_by(members: dict[str, DaemonProcess], topics: list[str]) -> dict[str, set[str]]:
    """Each topic's members (by name) that have an ended task of it (the last 20 of each, ``/v1/tasks``)."""
    found: dict[str, set[str]] = {t: set() for t in topics}
    for name, daemon in members.items():
        answer = daemon.client().get("/v1/tasks")
        assert answer.status_code == 200, answer.text
        for task in answer.json()["tasks"]:
            if task["topic"] in found and task["finished_at"] is not None:
                found[task["topic"]].add(name)
    return found


def test_a_member_restarting_under_load_leaves_each_topic_one_owner_and_its_runs_one_at_a_time(
        kafka: Kafka, members: list[DaemonProcess], topics: list[str]) -> None:
    restarting = members[2]
    with Load(kafka, topics) as load, Holders(members, topics) as holders:
        wait_for(lambda: len(holders.rounds) >= 20, REBALANCE_TIMEOUT_S, "samples of the settled cluster")
        assert restarting.stop() == 0
        wait_for(lambda: settled(members[:2]), REBALANCE_TIMEOUT_S, "two members hold every partition")
        restarting.start().wait_ready()
        wait_for(lambda: settled(members), REBALANCE_TIMEOUT_S, "the restarted member rejoined", restarting)
        wait_for(lambda: ran_by({NAMES[2]: restarting}, topics) != {t: set() for t in topics}, TASK_TIMEOUT_S,
                 "a run of the restarted member", restarting)
    assert not load.errors
    wait_for(lambda: idle(members, topics), TASK_TIMEOUT_S, "the monitors' last runs to end")
    assert holders.doubles() == []
    moved = [t for t in topics if len(holders.owners(t)) > 1]
    assert moved, "the restart moved some topics from one member to another"
    # The runs of a topic never overlap in time, whichever member ran them (the history is the shared root's).
    for topic in topics:
        runs = history(members[0], topic)
        assert runs_overlapping(runs) == [], (topic, runs)
    # ... and that covered topics run by two members: before and after a move.
    assert any(len(names) > 1 for names in ran_by(dict(zip(NAMES, members, strict=True)), topics).values())


# -- a rolling restart --------------------------------------------------------------------------


class Reader(Background):
    """Reads the topics' compacted views from the members round-robin until the end of its ``with``. An answer of the member being
    restarted (``restarting``) that is refused, or a 503, is sent to the next member; any other answer but 200 is a
    failure. Records each ledger served with its entries."""

    def __init__(self, members: list[DaemonProcess], topics: list[str]) -> None:
        self._members, self._topics = members, topics
        self.restarting: DaemonProcess | None = None
        super().__init__()
        self.answered = dict.fromkeys(NAMES, 0)
        self.retried = 0
        self.reads = 0
        self.failures: list[str] = []
        self.ledgers: dict[tuple[str, int], list[Any]] = {}
        self.inconsistent: list[str] = []

    def _run(self) -> None:
        for n in itertools.count():
            if self._stop.is_set():
                return
            topic = self._topics[n % len(self._topics)]
            first = (n + n // len(self._topics)) % len(self._members)  # each topic from each member in turn
            for attempt in range(len(self._members)):
                daemon = self._members[(first + attempt) % len(self._members)]
                restarting = daemon is self.restarting
                try:
                    with daemon.client() as client:
                        answer = client.get(f"/v1/topics/{topic}/compacted",
                                            params={"partition": 0, "limit": 1000, "encoding": "utf8"})
                except httpx.HTTPError as exc:
                    if restarting or daemon is self.restarting:
                        self.retried += 1
                        continue
                    self.failures.append(f"{NAMES[self._members.index(daemon)]}: {exc!r}")
                    break
                if answer.status_code == 503 and "retry-after" in answer.headers and (
                        restarting or daemon is self.restarting):
                    self.retried += 1
                    continue
                if answer.status_code != 200:
                    self.failures.append(f"{NAMES[self._members.index(daemon)]}: {answer.status_code} {answer.text}")
                    break
                self._record(daemon, topic, answer.json())
                break
            else:
                self.failures.append(f"topic {topic}: no member answered")
            self.reads += 1
            time.sleep(0.05)

    def _record(self, daemon: DaemonProcess, topic: str, body: dict[str, Any]) -> None:
        self.answered[NAMES[self._members.index(daemon)]] += 1
        entries = [(e["offset"], e["key"], e["value"]) for e in body["entries"]]
        known = self.ledgers.setdefault((topic, body["ledger_id"]), entries)
        if known != entries:
            self.inconsistent.append(f"topic {topic} ledger {body['ledger_id']} served as two views")


def test_a_rolling_restart_of_every_member_leaves_reads_answering_and_the_view_changing_by_switches_only(
        kafka: Kafka, members: list[DaemonProcess], topics: list[str]) -> None:
    read = topics[:6]
    with Load(kafka, read) as load, Reader(members, read) as reader:
        for daemon in members:
            reader.restarting = daemon
            assert daemon.stop() == 0
            daemon.start().wait_ready()
            reader.restarting = None
            wait_for(lambda: settled(members), REBALANCE_TIMEOUT_S, "the restarted member rejoined", daemon)
        count = reader.reads
        wait_for(lambda: reader.reads >= count + 10, REBALANCE_TIMEOUT_S, "reads of the cluster restarted")
    assert not load.errors
    assert reader.failures == []
    assert reader.inconsistent == []
    assert all(n > 0 for n in reader.answered.values()), reader.answered
    # Every ledger served is one a committed switch made current: a successful run's.
    wait_for(lambda: idle(members, read), TASK_TIMEOUT_S, "the monitors' last runs to end")
    switched = {(t, r["ledger_after"]) for t in read for r in history(members[0], t) if r["state"] == "Succeed"}
    assert set(reader.ledgers) <= switched, set(reader.ledgers) - switched
    assert len(reader.ledgers) > len(read), "the view changed by switches while it was read"
