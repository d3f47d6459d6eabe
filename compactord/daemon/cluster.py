"""This daemon as a member of a cluster (``clusterName``): which topics it owns, taking them and handing them over.

The members of a cluster share one ledger root and split its topics through the broker's group coordinator
(``compactord/cluster/membership.py``): a topic belongs to a coordination partition (``coordination_partition``),
and the member that holds that partition owns the topic. Owning a topic means, in order:

1. **taking it**: the ledger root's ownership guard raises the topic's epoch in its pointer with a
   compare-and-swap (``OwnershipGuard.take``), which fences every earlier owner's writes of it;
2. **recovering it**: what an earlier owner left (orphans, an interrupted run's objects) is removed for this topic
   only, and its policies are read again (``LedgerStore.recover_topic`` and the daemon's recovery hook);
3. then the monitor considers it and the API's triggers run here (``owns``); another member forwards them here
   (``api/proxy.py``, from ``owner``).

A partition gained takes its topics at once; a topic that appears later is taken when first seen (``owns``). A
partition about to be revoked first stops its topics' tasks (the cooperative protocol keeps it unassigned
meanwhile) and then releases them; a partition lost (the session expired) is released without a handover: the
next owner's epoch fences whatever this member still tries. While the membership cannot heartbeat for longer
than the session, ``Membership.may_write`` is False and the guard refuses every write (a zombie cannot switch).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from compactord.cluster.coordination import coordination_partition
from compactord.cluster.membership import Membership
from compactord.cluster.roster import Member
from compactord.errors import CompactordError

__all__ = ["ClusterRole", "ClusterView", "Owner"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Owner:
    """Who owns a topic now: this member (``here``), another one at ``url``, or none (neither)."""

    here: bool
    url: str | None = None


@dataclass(frozen=True)
class ClusterView:
    """What ``GET /v1/cluster`` shows."""

    name: str
    me: str
    partitions: int
    members: list[Member]
    owned_topics: int
    unowned_partitions: int
    last_rebalance_at: float | None
    last_rebalance_seconds: float | None


class ClusterRole:
    """Ownership of this member's topics. ``take``: raise a topic's epoch and recover it as its new owner (its
    clean-up, policies and last success; ``LedgerStore.take``); ``release``: drop it; ``stop_topic``: stop a topic's
    task and wait for it (bounded); ``known_topics``: the topics there are (on the broker or the root)."""

    def __init__(self, name: str, membership: Membership, partitions: int, me: str, *,
                 take: Callable[[str], int], release: Callable[[str], None], stop_topic: Callable[[str], None], known_topics: Callable[[], Iterable[str]]) -> None:
        self.name = name
        self.membership = membership
        self.partitions = partitions
        self.me = me
        self._take, self._release = take, release
        self._stop_topic, self._known_topics = stop_topic, known_topics
        self._lock = threading.Lock()
        self._taken: dict[str, int] = {}  # topic -> the epoch taken

    def partition(self, topic: str) -> int:
        return coordination_partition(topic, self.partitions)

    # -- who owns what --------------------------------------------------------------------------

    def holds(self, topic: str) -> bool:
        """Whether this member holds the topic's partition now and may write (its session is fresh)."""
        return self.membership.may_write() and self.partition(topic) in self.membership.owned()

    def owns(self, topic: str) -> bool:
        """Whether this member owns the topic now: it holds its partition, and has taken it (taken here if not
        yet: a topic created since its partition was gained). Blocking (a compare-and-swap at most)."""
        if not self.holds(topic):
            return False
        with self._lock:
            if topic in self._taken:
                return True
        try:
            self._take_one(topic)
        except CompactordError as exc:
            log.warning("topic %s not taken: %s", topic, exc)
            return False
        return True

    def owner(self, topic: str) -> Owner:
        """Who answers the topic's writes: here, another member's URL, or no one (mid-rebalance). Does not block."""
        if self.holds(topic):
            return Owner(here=True)
        part = self.partition(topic)
        for member in self.membership.members():
            if part in member.partitions and member.url != self.me:
                return Owner(here=False, url=member.url)
        return Owner(here=False, url=None)

    def taken(self) -> list[str]:
        with self._lock:
            return sorted(self._taken)

    def view(self) -> ClusterView:
        members = self.membership.members()
        held = {p for m in members for p in m.partitions}
        last = self.membership.last_rebalance
        return ClusterView(self.name, self.me, self.partitions, members, len(self.taken()),
                           self.partitions - len(held & set(range(self.partitions))),
                           last.ended_at if last is not None else None, last.seconds if last is not None else None)

    # -- the membership's callbacks -------------------------------------------------------------

    def gained(self, partitions: set[int]) -> None:
        """Take the topics of the ``partitions`` just assigned (each one failing alone: it is taken again when
        the monitor or a trigger asks ``owns``)."""
        started = time.monotonic()
        topics = [t for t in self._known_topics() if self.partition(t) in partitions]
        for topic in topics:
            try:
                self._take_one(topic)
            except CompactordError as exc:
                log.warning("topic %s not taken: %s", topic, exc)
        log.info("coordination partitions %s gained: %d topics taken in %.2fs", sorted(partitions), len(topics),
                 time.monotonic() - started)

    def revoking(self, partitions: set[int]) -> None:
        """Before the ``partitions`` go to another member: stop their topics' tasks, then release the topics."""
        for topic in self._topics_in(partitions):
            self._stop_topic(topic)
            self._release_one(topic)
        log.info("coordination partitions %s handed over", sorted(partitions))

    def lost(self, partitions: set[int]) -> None:
        """The ``partitions`` are gone without a handover (the session expired): stop and release their topics;
        another member's epoch already fences what they would write."""
        for topic in self._topics_in(partitions):
            self._stop_topic(topic)
            self._release_one(topic)
        log.warning("coordination partitions %s lost (the group's session expired)", sorted(partitions))

    def stop(self) -> None:
        """Hand every topic over (a graceful leave): the membership stops, which revokes its partitions."""
        self.membership.stop()

    # -- internals ------------------------------------------------------------------------------

    def _topics_in(self, partitions: set[int]) -> list[str]:
        with self._lock:
            return [t for t in self._taken if self.partition(t) in partitions]

    def _take_one(self, topic: str) -> None:
        epoch = self._take(topic)
        with self._lock:
            self._taken[topic] = epoch
        log.info("topic %s taken (epoch %d)", topic, epoch)

    def _release_one(self, topic: str) -> None:
        with self._lock:
            self._taken.pop(topic, None)
        try:
            self._release(topic)
        except CompactordError as exc:  # the next owner's epoch fences it all the same
            log.warning("topic %s not released cleanly: %s", topic, exc)
