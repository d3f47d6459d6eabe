"""Who may write a ledger root, and with what fence: one interface, ``WriterGuard``, and its backends.

A guard is acquired when the root is opened (``LedgerStore.open``) and released when it is closed. Between
the two, every write that another process's could conflict with asks it, per topic, whether this process may
write that topic now (``check``) and with what fence (``fence``): the writer epoch that the topic's ``CURRENT``
records and that ``Pointer.switched`` refuses to lower (``pointer.py``). That epoch is the one fence every
pointer write carries, whichever backend handed it out; a guard only decides who gets which epoch, and when a
process must stop writing before its epoch is overtaken.

The backends:

- ``LockGuard``, a local root's: an ``flock`` on ``@compactord/lock`` (``lock.py``). Held until released; the
  root's epoch is raised when it is taken.
- ``LeaseGuard``, an object store's, where there is no ``flock``: the renewed lease ``@compactord/lease``
  (``lease.py``), which raises the root's epoch as it is taken. It lapses when its renewals fail for two thirds
  of the lease (``overdue``), and is lost for good when another daemon takes it over (``lost``).
- ``OwnershipGuard`` (``ownership.py``), a cluster's: daemons sharing a root, each owning the topics a Kafka consumer
  group assigns it, answer ``check(T)`` with whether this member took T and its membership is current, and
  ``fence(T)`` with the epoch raised in T's pointer when it was taken (``take``), so that the previous owner's writes
  of T are refused by the pointer as a stale generation's (Kafka Connect's and Streams' fencing of the previous
  generation). The daemon's recovery of a topic (``LedgerStore.recover_topic``) is per topic for that reason.

``writer_guard`` picks one of the first two by what the store declares (a folder of this host has a lock file); a
cluster's daemon gives the store its ``OwnershipGuard``. The first two answer the same for every topic: one process
writes the whole root. Both refuse a root marked as a cluster's (``@compactord/cluster``, ``claimed_by_cluster``),
checked before and again after the right is taken, so that a single daemon and a cluster member starting at once
do not both go on.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path

from compactord.errors import LedgerRootClaimed, ObjectNotFound
from compactord.ledger import layout
from compactord.ledger.lease import Lease, acquire
from compactord.ledger.lock import RootLock, unwritable
from compactord.ledger.pointer import Pointer, raise_epoch
from compactord.storage import ObjectStore

__all__ = ["CLUSTER_KEY", "LeaseGuard", "LockGuard", "WriterGuard", "claimed_by_cluster", "refuse_cluster_root",
           "writer_guard"]

CLUSTER_KEY = layout.cluster_key()


class WriterGuard(ABC):
    """Whether this process may write a root's topics, and the fence its pointer writes carry."""

    @abstractmethod
    def acquire(self) -> None:
        """Take the right to write (the lock, the lease) and raise the root's writer epoch; idempotent.

        :raises LedgerRootLocked: another live process holds it.
        :raises LedgerRootUnwritable: the root cannot be created, locked or written.
        """

    @abstractmethod
    def release(self) -> None:
        """Give the right back (idempotent), so that the next writer starts at once."""

    @property
    @abstractmethod
    def held(self) -> bool:
        """Whether ``acquire`` took the right and ``release`` has not given it back."""

    @abstractmethod
    def fence(self, topic: str) -> int:
        """The writer epoch that a write of ``topic``'s pointer carries (0 before ``acquire``)."""

    @abstractmethod
    def check(self, topic: str) -> None:
        """Return if this process may write ``topic`` now (a guard not acquired answers for a store that is only
        read: it returns).

        :raises Fenced: another process took the right over (for good).
        :raises StorageUnavailable: the right lapsed for now (a lease not renewed in time): nothing is written
            until it is held again.
        """

    def sole_writer(self, topic: str) -> bool:
        """Whether no other process writes ``topic``'s pointer while this guard holds it, so that what this
        process read of it stays true until it writes (a local root's files are read again, at a syscall's
        cost)."""
        return False

    def overdue(self) -> float | None:
        """The seconds since the right was last confirmed, while that is too long to write (the store failed
        the renewals), else None; from memory only (the readiness probes ask it)."""
        return None

    @property
    def lost(self) -> bool:
        """Whether another process took the right over for good."""
        return False

    def problem(self) -> str | None:
        """Why this process may not write now, as a fixed phrase for readiness (``/readyz``), or None."""
        if self.lost:
            return "another daemon took the ledger root's lease over"
        if self.overdue() is not None:
            return "the ledger root's lease is not renewed yet (the store failed its renewals)"
        return None

    @property
    def lease(self) -> Lease | None:
        """The renewed lease behind this guard while it holds one (``LeaseGuard``), else None."""
        return None

    @property
    def shared_root(self) -> bool:
        """Whether other processes write the root's topics while this guard is held (a cluster's members): then
        nothing root-wide is cleaned at the open (another member's writes under way), only each topic by its owner."""
        return False

    def owns(self, topic: str) -> bool:
        """Whether this process recovers and writes ``topic`` (every topic, for the root's one writer)."""
        return True

    def take(self, topic: str) -> int:
        """Take ``topic`` for this process and return its fence (the root's one writer has every topic)."""
        return self.fence(topic)

    def release_topic(self, topic: str) -> None:
        """Give ``topic`` back (the root's one writer keeps every topic until ``release``)."""

    def check_owner(self, topic: str) -> None:
        """Before a write of ``topic``'s objects beside its pointer (its policies, marks, deletion): return if this
        process writes the topic now (the root's one writer: always; see ``OwnershipGuard``).

        :raises Fenced: another process holds the topic, or took it since.
        """

    def check_pointer(self, topic: str, pointer: Pointer) -> None:
        """Before a write against ``pointer`` (its base): return if this process may write over it. A lower epoch
        than the pointer's is ``Pointer.switched``'s to refuse, whatever the backend.

        :raises Fenced: the pointer is not this process's to write over.
        """

    def confirm(self, topic: str, written: Pointer) -> None:
        """After ``written`` won its compare-and-swap: return if it is the topic's pointer (nothing to ask where
        one process writes the root).

        :raises ConditionalWriteNotAtomic: the pointer reads back as another writer's.
        """


def claimed_by_cluster(objects: ObjectStore) -> str | None:
    """The cluster name ``@compactord/cluster`` holds (None: no cluster shares the root; a mark that does not
    parse names ``"?"``, so that nothing takes the root as a single daemon's)."""
    try:
        data = objects.get(CLUSTER_KEY)
    except ObjectNotFound:
        return None
    try:
        name = json.loads(data)["cluster"]
    except (ValueError, KeyError, TypeError):
        return "?"
    return name if isinstance(name, str) and name else "?"


def refuse_cluster_root(objects: ObjectStore, root: Path | str) -> None:
    """What a single daemon's guard asks before and after it takes the root.

    :raises LedgerRootClaimed: a cluster shares the root.
    """
    cluster = claimed_by_cluster(objects)
    if cluster is not None:
        raise LedgerRootClaimed(
            f"ledger root {root} is shared by the daemons of cluster {cluster!r} ({objects.location(CLUSTER_KEY)}), "
            f"each writing the topics it owns; a daemon without clusterName may not write it: set "
            f"clusterName={cluster} to join that cluster, or use another compactedLedgerRoot (the root goes back to a "
            f"single daemon once {CLUSTER_KEY} is removed, with no member of the cluster running)",
            root=str(root), cluster=cluster)


class LockGuard(WriterGuard):
    """A local root's guard: the ``flock`` of ``lock.py``, in the root's folder ``root``."""

    def __init__(self, objects: ObjectStore, root: Path) -> None:
        self._objects, self._root = objects, root
        self._daemon_dir = root / layout.DAEMON_DIR
        self._lock = RootLock(self._daemon_dir / layout.lock_name(), root)
        self._epoch = 0

    def acquire(self) -> None:
        if self._lock.held:
            return
        with unwritable(self._root, "cannot be created"):
            self._daemon_dir.mkdir(parents=True, exist_ok=True)
        refuse_cluster_root(self._objects, self._root)
        with unwritable(self._root, "cannot be locked"):
            self._lock.acquire()
        try:
            refuse_cluster_root(self._objects, self._root)  # a member that marked the root meanwhile
            with unwritable(self._root, "cannot be written"):
                self._epoch = raise_epoch(self._objects)
        except BaseException:
            self._lock.release()
            raise

    def release(self) -> None:
        self._lock.release()

    @property
    def held(self) -> bool:
        return self._lock.held

    def fence(self, topic: str) -> int:
        return self._epoch

    def check(self, topic: str) -> None:
        return None  # an flock is held until released: nothing can take it over meanwhile


class LeaseGuard(WriterGuard):
    """An object-store root's guard: the lease of ``lease.py``, for ``seconds``; ``root`` names the root in the
    messages of a start that fails."""

    def __init__(self, objects: ObjectStore, root: Path, seconds: float) -> None:
        self._objects, self._root, self.seconds = objects, root, seconds
        self._lease: Lease | None = None
        self._epoch = 0

    def acquire(self) -> None:
        if self._lease is not None:
            return
        refuse_cluster_root(self._objects, self._root)
        with unwritable(self._root, "cannot be written"):
            lease = acquire(self._objects, self.seconds)
        try:
            refuse_cluster_root(self._objects, self._root)  # a member that marked the root meanwhile
        except BaseException:
            lease.release()
            raise
        self._lease, self._epoch = lease, lease.epoch

    def release(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()

    @property
    def held(self) -> bool:
        return self._lease is not None

    def fence(self, topic: str) -> int:
        return self._epoch

    def check(self, topic: str) -> None:
        if self._lease is not None:
            self._lease.check()

    def sole_writer(self, topic: str) -> bool:
        return self._lease is not None and not self._lease.lost

    def overdue(self) -> float | None:
        return self._lease.overdue() if self._lease is not None else None

    @property
    def lost(self) -> bool:
        return self._lease is not None and self._lease.lost

    @property
    def lease(self) -> Lease | None:
        return self._lease


def writer_guard(objects: ObjectStore, root: Path, lease_seconds: float) -> WriterGuard:
    """The guard of the root ``objects`` (``root``: its path, or its URL as a path, for messages): its lock where
    it is a folder of this host, else its lease for ``lease_seconds``."""
    folder = objects.local_root
    return LockGuard(objects, folder) if folder is not None else LeaseGuard(objects, root, lease_seconds)

