"""A daemon's membership in its cluster: the consumer group ``compactord-<clusterName>`` over the coordination
topic, which hands each member its coordination partitions (see #41).

The group runs kafka-python's consumer with the cooperative-sticky assignor only: a partition that moves is
first revoked by its owner (``on_revoked``, which may block while the daemon stops the topics' tasks; the
partition stays unassigned meanwhile), and only then, in a second round, assigned to its new owner. Never
static membership: a dead static member's partitions are never reassigned on the test broker. The consumer
holds assignments and never reads a record (its partitions are paused as they come).

kafka-python does not fence a member itself (its members kept their partitions through a 12 s broker outage):
``may_write()`` is false once the last proof of membership, a heartbeat the coordinator answered (counted from
when it was sent) or a completed join, is older than the session, and ``owned()`` is then empty.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.subscription_state import AsyncConsumerRebalanceListener

from compactord import __version__
from compactord.cluster.coordination import coordination_topic, group_id
from compactord.cluster.roster import ClusterAssignor, Member, decode_roster
from compactord.config import Settings
from compactord.kafka.client import describe, translate_kafka_errors

__all__ = ["Membership", "Rebalance"]

log = logging.getLogger(__name__)

POLL_MS = 200  # one poll of the group's consumer: how soon the poll thread sees stop()
CALLBACK_POLL_S = 0.02  # how often kafka-python's IO loop looks whether a callback's thread has ended
STOP_TIMEOUT_S = 30.0  # stop(): the leave, after on_revoked, is given this long
ERROR_BACKOFF_S = 1.0
# How long a member may block in on_revoked (and the group may wait for a member to rejoin): the consumer's
# max.poll.interval.ms, which is also the rebalance timeout of its JoinGroup.
REBALANCE_TIMEOUT_MS = 300_000

PartitionsCallback = Callable[[set[int]], None]


@dataclass(frozen=True, slots=True)
class Rebalance:
    """The last rebalance this member took part in: when it ended (wall clock, seconds since the epoch) and
    how long it took, from this member's JoinGroup to its assignment (a cooperative move's two rounds are one
    rebalance)."""

    ended_at: float
    seconds: float


class Membership:
    """This daemon's membership; ``start()`` joins, ``stop()`` leaves. The callbacks run one at a time, each on
    a thread of its own while kafka-python's IO loop (heartbeats included) goes on:

    - ``on_assigned(partitions)``: partitions newly gained (in ``owned()`` already);
    - ``on_revoked(partitions)``: partitions to release (out of ``owned()`` already); the group gives them to
      another member only once it returns, so it may block while their topics' tasks stop;
    - ``on_lost(partitions)``: partitions gone without a chance to release (the session expired: they may
      have another owner already).
    """

    def __init__(self, settings: Settings, url: str, *, on_assigned: PartitionsCallback,
                 on_revoked: PartitionsCallback, on_lost: PartitionsCallback, version: str = __version__) -> None:
        self.settings = settings
        self.url = url
        self.version = version
        self.topic = coordination_topic(settings.cluster_name)
        self.group = group_id(settings.cluster_name)
        self._callbacks = {"assigned": on_assigned, "revoked": on_revoked, "lost": on_lost}
        self._session_s = settings.cluster_session_timeout_ms / 1000
        self._lock = threading.Lock()
        self._owned: set[int] = set()
        self._confirmed_at = float("-inf")  # monotonic: the last proof of membership
        self._roster: list[Member] = []
        self._generation = -1
        self._member_id = ""
        self._join_started: float | None = None  # monotonic, while a JoinGroup is under way
        self._rebalance_started: float | None = None
        self._round_ended: float | None = None
        self._last_rebalance: Rebalance | None = None
        self.rebalances = 0  # rebalances this member took part in
        self._consumer: Any = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # -- what the daemon asks ---------------------------------------------------------------------

    def may_write(self) -> bool:
        """Whether this member's membership was confirmed within the session: when false, another member may
        hold its partitions already, and it must not switch, delete or overwrite anything."""
        with self._lock:
            return self._generation >= 0 and time.monotonic() - self._confirmed_at <= self._session_s

    def owned(self) -> frozenset[int]:
        """The coordination partitions held now; empty while ``may_write()`` is false."""
        with self._lock:
            owned = frozenset(self._owned)
        return owned if self.may_write() else frozenset()

    def members(self) -> list[Member]:
        """The group's members as of the last assignment this member received, by member id."""
        with self._lock:
            return list(self._roster)

    @property
    def member_id(self) -> str:
        with self._lock:
            return self._member_id

    @property
    def generation(self) -> int:
        with self._lock:
            return self._generation

    @property
    def last_rebalance(self) -> Rebalance | None:
        with self._lock:
            return self._last_rebalance

    # -- life -------------------------------------------------------------------------------------

    def start(self) -> Membership:
        """Join the group (in the background: ``on_assigned`` says when partitions come).

        :raises BrokerUnavailable: the brokers cannot be reached.
        """
        session_ms = self.settings.cluster_session_timeout_ms
        assignor = ClusterAssignor(self.url, self.version, self._assigned, self._joining)
        config = self.settings.kafka_client_config()
        config.update(group_id=self.group, partition_assignment_strategy=[assignor],
                      session_timeout_ms=session_ms, heartbeat_interval_ms=session_ms // 3,
                      max_poll_interval_ms=REBALANCE_TIMEOUT_MS, enable_auto_commit=False,
                      allow_auto_create_topics=False, auto_offset_reset="latest", max_poll_records=1,
                      bootstrap_timeout_ms=min(self.settings.kafka_request_timeout_ms, 10000))
        with translate_kafka_errors(self.settings.kafka_bootstrap_servers):
            consumer = KafkaConsumer(**config)
        self._consumer = consumer
        _watch_heartbeats(consumer, self._heartbeat_answered)
        # The stubs know the sync listener only; kafka-python takes either (and awaits the async one).
        consumer.subscribe(topics=[self.topic], listener=_Listener(self))  # type: ignore[arg-type]
        self._thread = threading.Thread(target=self._run, name=f"cluster-{self.group}", daemon=True)
        self._thread.start()
        log.info("joining the cluster %s as %s (group %s, coordination topic %s)", self.settings.cluster_name,
                 self.url, self.group, self.topic)
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Leave the group: ``on_revoked`` with every partition held, then a LeaveGroup, which lets the others
        rebalance at once (instead of after the session)."""
        self._stopping.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _run(self) -> None:
        consumer = self._consumer
        failing = ""
        try:
            while not self._stopping.is_set():
                try:
                    consumer.poll(timeout_ms=POLL_MS)
                    failing = ""
                except Exception as exc:  # noqa: BLE001 - the group's faults are retried; each logged once
                    if describe(exc) != failing:
                        failing = describe(exc)
                        log.warning("the cluster's group %s: %s; retrying", self.group, failing)
                    self._stopping.wait(ERROR_BACKOFF_S)
        finally:
            try:
                consumer.close(autocommit=False, timeout_ms=int(STOP_TIMEOUT_S * 1000))
            except Exception as exc:  # noqa: BLE001 - the broker may be gone: the session then expires
                log.warning("leaving the cluster's group %s failed (%s): the others take its partitions after "
                            "the session", self.group, describe(exc))
            with self._lock:
                self._owned.clear()
                self._generation = -1
            log.info("left the cluster %s", self.settings.cluster_name)

    # -- kafka-python's hooks, on its IO thread ---------------------------------------------------

    def _heartbeat_answered(self, sent_at: float) -> None:
        with self._lock:
            self._confirmed_at = max(self._confirmed_at, sent_at)

    def _joining(self) -> None:
        now = time.monotonic()
        with self._lock:
            if self._join_started is not None:
                return
            self._join_started = now
            # A round that starts within two heartbeats of the last one's end is its follow-up (a cooperative
            # move's second round): the same rebalance.
            follow_up = 2 * self._session_s / 3
            if self._round_ended is None or now - self._round_ended > follow_up:
                self._rebalance_started = now
                self.rebalances += 1

    def _assigned(self, roster: bytes | None, generation: int) -> None:
        now = time.monotonic()
        member_id = self._consumer.group_metadata().member_id
        with self._lock:
            self._confirmed_at = now
            self._generation = generation
            self._member_id = member_id
            self._roster = decode_roster(roster, generation)
            started = self._rebalance_started if self._rebalance_started is not None else now
            self._last_rebalance = Rebalance(time.time(), now - started)
            self._join_started = None
            self._round_ended = now

    async def _hand(self, kind: str, partitions: set[TopicPartition]) -> None:
        """Run the ``kind`` callback with ``partitions`` on a thread of its own, awaiting it on kafka-python's
        IO loop so that heartbeats go on meanwhile."""
        numbers = {tp.partition for tp in partitions if tp.topic == self.topic}
        with self._lock:
            if kind == "assigned":
                self._owned |= numbers
            else:
                self._owned -= numbers
        if kind == "assigned":
            self._consumer.pause(*partitions)  # held, never read
        log.info("coordination partitions %s: %s", kind, sorted(numbers))
        if not numbers:
            return
        done = threading.Event()

        def call() -> None:
            try:
                self._callbacks[kind](set(numbers))
            except Exception:
                log.exception("the cluster's on_%s callback failed for partitions %s", kind, sorted(numbers))
            finally:
                done.set()

        threading.Thread(target=call, name=f"cluster-{kind}", daemon=True).start()
        while not done.is_set():
            # kafka-python's IO loop has no public sleep; its listener hooks are awaited on that loop.
            await self._consumer._net.sleep(CALLBACK_POLL_S)


class _Listener(AsyncConsumerRebalanceListener):
    """Awaited by kafka-python (not called): its heartbeats go on while a callback blocks."""

    def __init__(self, membership: Membership) -> None:
        self._membership = membership

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._membership._hand("revoked", revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self._membership._hand("assigned", assigned)

    async def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        await self._membership._hand("lost", lost)


def _watch_heartbeats(consumer: KafkaConsumer, answered: Callable[[float], None]) -> None:
    """Call ``answered(sent_at)`` (monotonic) for each heartbeat the coordinator answers, with the time it was
    sent: the broker heard from the member then, or later. kafka-python keeps that on its coordinator's
    ``Heartbeat`` only (``last_send`` is the answered heartbeat's own: one is in flight at a time)."""
    # kafka-python exposes no heartbeat hook: its coordinator's Heartbeat, whose methods it calls, is wrapped.
    heartbeat = consumer._coordinator.heartbeat  # type: ignore[attr-defined] # private: not in the stubs
    received = heartbeat.received_heartbeat

    def received_heartbeat() -> None:
        received()
        answered(heartbeat.last_send)

    heartbeat.received_heartbeat = received_heartbeat
