"""The writer guard of a root that a cluster's daemons share: each member writes the topics it owns, fenced per topic
by an epoch in the topic's pointer (see #41). No flock and no lease: ownership is handed out by the cluster's
membership (a Kafka consumer group), and this guard only makes a stale owner's writes fail.

- ``acquire`` marks the root as the cluster's: ``@compactord/cluster`` (``{"cluster": NAME}``), created once by the
  first member and never rewritten. A root marked for another cluster, or locked by a live single daemon (a local
  root's ``flock``, an object store's renewed lease), is refused (``LedgerRootClaimed``); a single daemon's guard
  refuses a marked root in turn (``guard.refuse_cluster_root``).
- ``take(T)`` raises T's epoch: the root's epoch is raised by compare-and-swap (``pointer.raise_epoch``, above the
  pointer's, so that every take gets an epoch of its own, and a single daemon that opens the root later one above
  them all), then written into T's ``CURRENT`` by compare-and-swap, keeping the ledgers it names (a topic without a
  ledger gets a pointer naming none). The pointer is read back: a store that let another conditional write win from
  the same version (``docs/object-storage.md``) shows the other's, and the take is made again over it.
- Every write of T asks ``check(T)``: T taken by this member, and its membership current (``may_write``: the
  membership's own fencing, false once it has not heartbeated within its session). A switch also needs its base
  pointer to carry T's epoch as taken (``check_pointer``): a member that took T since raised it, and the base's
  version changed with it, so the compare-and-swap of a stale owner fails either way. A pointer written is read back
  (``confirm``): another writer's read there is a double winner, reported as the store's fault
  (``ConditionalWriteNotAtomic``), never served as two views.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from compactord.errors import (
    ConditionalWriteNotAtomic,
    Fenced,
    InvalidArgument,
    LedgerCorrupt,
    LedgerRootClaimed,
    LedgerRootLocked,
    PreconditionFailed,
)
from compactord.ledger import layout
from compactord.ledger.guard import CLUSTER_KEY, WriterGuard, claimed_by_cluster
from compactord.ledger.lease import check_free
from compactord.ledger.lock import unwritable
from compactord.ledger.pointer import Pointer, raise_epoch, read_pointer, write_pointer
from compactord.model import validate_topic_name
from compactord.storage import ObjectStore

__all__ = ["OwnershipGuard"]

log = logging.getLogger(__name__)

# A take lost to another writer of the topic's pointer is made again from what it wrote; each loss is a switch of a
# previous owner (a few at most) or a double winner of a store that does not decide conditions atomically.
_TAKE_ATTEMPTS = 10
# Writes seen between a pointer's compare-and-swap and its read-back (a test's seam): (topic, pointer written).
AfterWrite = Callable[[str, Pointer], None]


def _always() -> bool:
    return True


class OwnershipGuard(WriterGuard):
    """A cluster member's guard of the root ``objects`` (``root``: its path or URL, for messages).

    ``cluster``: the cluster's name, written into the root's mark. ``may_write``: whether this member's membership is
    current (asked before every write; False fences every topic until it is True again). ``lease_seconds``: how long
    a single daemon's lease is watched at ``acquire`` (an object store's). ``after_write``: a seam run between a
    pointer's compare-and-swap and its read-back (tests write behind the writer's back there).
    """

    def __init__(self, objects: ObjectStore, root: Path | str, cluster: str, may_write: Callable[[], bool] = _always,
                 *, lease_seconds: float = 30.0, after_write: AfterWrite | None = None) -> None:
        if not isinstance(cluster, str) or not cluster:
            raise InvalidArgument(f"a cluster's guard needs the cluster's name, got: {cluster!r}")
        self._objects, self._root, self.cluster = objects, root, cluster
        self._may_write, self._lease_seconds, self._after_write = may_write, lease_seconds, after_write
        self._lock = threading.Lock()
        self._taken: dict[str, int] = {}
        self._held = False

    # -- the root --------------------------------------------------------------------------------

    def acquire(self) -> None:
        """Mark the root as this cluster's (or find it marked so); take no lock and no lease.

        :raises LedgerRootClaimed: the root is another cluster's, or a live single daemon holds it.
        :raises LedgerRootUnwritable: the mark cannot be written.
        """
        if self._held:
            return
        with unwritable(Path(str(self._root)), "cannot be written"):
            created = self._mark()
        try:
            self._refuse_single_daemon()
        except BaseException:
            if created:  # the root stays a single daemon's, as it was
                self._objects.delete(CLUSTER_KEY)
            raise
        self._held = True
        log.info("ledger root %s is shared by cluster %r; this member writes the topics it takes",
                 self._objects.describe(), self.cluster)

    def _mark(self) -> bool:
        """Create the root's mark, or find it naming this cluster; True if this member created it."""
        body = json.dumps({"cluster": self.cluster}).encode() + b"\n"
        found: str | None = None
        for _ in range(3):  # a mark removed between the create and the read is created again
            try:
                self._objects.put_if_absent(CLUSTER_KEY, body)
                return True
            except PreconditionFailed:
                found = claimed_by_cluster(self._objects)
            if found == self.cluster:
                return False
            if found is not None:
                break
        raise LedgerRootClaimed(
            f"ledger root {self._root} is shared by the daemons of cluster {found!r} "
            f"({self._objects.location(CLUSTER_KEY)}), not {self.cluster!r}: a root is one cluster's; set "
            f"clusterName={found} to join that cluster, or use another compactedLedgerRoot",
            root=str(self._root), cluster=found)

    def _refuse_single_daemon(self) -> None:
        """:raises LedgerRootClaimed: a live single daemon holds the root (its flock, or a lease it renews)."""
        why: str | None = None
        folder = self._objects.local_root
        if folder is not None:
            holder = _flock_holder(folder / layout.DAEMON_DIR / layout.lock_name())
            if holder is not None:
                why = (f"a single compactord holds its lock (pid {holder.get('pid', '?')} on host "
                       f"{holder.get('host', '?')}, see {folder / layout.DAEMON_DIR / layout.lock_name()})")
        else:
            try:
                check_free(self._objects, self._lease_seconds)
            except LedgerRootLocked as exc:
                holder = exc.details.get("holder") or {}
                why = (f"a single compactord renews its lease (pid {holder.get('pid', '?')} on host "
                       f"{holder.get('host', '?')}, see {self._objects.location(layout.lease_key())})")
        if why is not None:
            raise LedgerRootClaimed(
                f"ledger root {self._root} is written by a single daemon: {why}; the daemons of cluster "
                f"{self.cluster!r} may share only a root that no single daemon writes: stop that daemon (or give it "
                "clusterName too), or use another compactedLedgerRoot", root=str(self._root), cluster=None)

    def release(self, topic: str | None = None) -> None:
        """Give ``topic`` back (None: every topic, and the root: ``held`` is false after); idempotent. The root's
        mark stays: the root remains the cluster's."""
        if topic is not None:
            self.release_topic(topic)
            return
        with self._lock:
            self._taken.clear()
            self._held = False

    @property
    def held(self) -> bool:
        return self._held

    @property
    def shared_root(self) -> bool:
        return True

    # -- topics ----------------------------------------------------------------------------------

    def take(self, topic: str) -> int:
        """Raise ``topic``'s epoch in its pointer by compare-and-swap and return it: from now on a previous owner's
        switch, deletion or policy write of the topic fails ``fenced``.

        :raises Fenced: the root is not acquired, the membership is not current, or the pointer kept changing.
        :raises ConditionalWriteNotAtomic: the pointer never read back as written (a store that lets two
            conditional writes win, every time).
        :raises StorageUnavailable: the store failed.
        """
        topic = validate_topic_name(topic)
        if not self._held:
            raise Fenced(f"topic {topic!r} cannot be taken: the ledger root {self._root} is not acquired by this "
                         f"member of cluster {self.cluster!r}", topic=topic)
        self._check_membership(topic)
        lost = "another writer changed its pointer at each attempt"
        for _ in range(_TAKE_ATTEMPTS):
            base = self._base(topic)
            epoch = raise_epoch(self._objects, above=base.epoch)
            try:
                written = write_pointer(self._objects, topic, base.taken(epoch), base)
            except Fenced:
                continue  # a previous owner's switch, or another take: take it again from what it wrote
            if self._reads_back(topic, written):
                with self._lock:
                    self._taken[topic] = epoch
                log.info("took topic %r with epoch %d (its pointer names ledger %s)", topic, epoch, written.ledger)
                return epoch
            lost = "the store let another conditional write of its pointer win as well"
            log.error("topic %r: the pointer written by its take (epoch %d) reads back as another writer's: %s (%s "
                      "does not decide conditional writes atomically); taking it again", topic, epoch, lost,
                      self._objects.describe())
        error = ConditionalWriteNotAtomic if lost.startswith("the store") else Fenced
        raise error(f"topic {topic!r} was not taken in {_TAKE_ATTEMPTS} attempts: {lost}", topic=topic)

    def _base(self, topic: str) -> Pointer:
        """The pointer a take writes over: as read, or, when it is unreadable, its version alone (the take writes a
        pointer naming no ledger; the topic's recovery quarantines its finalized ledgers)."""
        try:
            return read_pointer(self._objects, topic)
        except LedgerCorrupt as exc:
            info = self._objects.head(layout.pointer_key(topic))
            log.error("topic %r: its pointer is replaced by one naming no ledger as it is taken (%s)", topic, exc)
            return Pointer(None, version=None if info is None else info.version)

    def release_topic(self, topic: str) -> None:
        """Give ``topic`` back: nothing of it is written from now on (idempotent)."""
        with self._lock:
            self._taken.pop(topic, None)

    def taken(self) -> dict[str, int]:
        """The topics this member holds, with their epochs."""
        with self._lock:
            return dict(self._taken)

    def owns(self, topic: str) -> bool:
        return not self._held or topic in self._taken

    def fence(self, topic: str) -> int:
        return self._taken.get(topic, 0)

    def check(self, topic: str) -> None:
        if not self._held:
            return  # a store that is only read
        if topic not in self._taken:
            raise Fenced(f"topic {topic!r} is not taken by this member of cluster {self.cluster!r} (another member "
                         "owns it, or it was given back): nothing of it is written here", topic=topic)
        self._check_membership(topic)

    def _check_membership(self, topic: str) -> None:
        if not self._may_write():
            raise Fenced(f"this member of cluster {self.cluster!r} has not confirmed its membership within its "
                         f"session (another member may own topic {topic!r} by now): nothing is written until it has",
                         topic=topic)

    def check_owner(self, topic: str) -> None:
        """``check``, then that the topic's pointer (read now) still carries the epoch this member took it with. The
        store has no condition across two objects: a member taking the topic between this and the write is not seen;
        the membership's session fences the previous owner first (``may_write``)."""
        self.check(topic)
        if not self._held:
            return
        try:
            pointer = read_pointer(self._objects, topic)
        except LedgerCorrupt:
            return  # the take replaced an unreadable pointer: one found now names no other member's epoch
        self.check_pointer(topic, pointer)

    def check_pointer(self, topic: str, pointer: Pointer) -> None:
        if self._held and pointer.epoch != self.fence(topic):
            raise Fenced(f"the pointer of topic {topic!r} carries epoch {pointer.epoch}, not the one this member took "
                         f"the topic with ({self.fence(topic)}): another member took it since; nothing is written",
                         topic=topic, epoch=pointer.epoch)

    def confirm(self, topic: str, written: Pointer) -> None:
        if self._reads_back(topic, written):
            return
        # Not logged here: the task that fails with it logs its error once.
        raise ConditionalWriteNotAtomic(
            f"the pointer of topic {topic!r} (ledger {written.ledger}, epoch {written.epoch}) won its "
            f"compare-and-swap but reads back as another writer's: {self._objects.describe()} does not decide "
            "conditional writes atomically (docs/object-storage.md); the view is the pointer's as it reads now",
            topic=topic, ledger_id=written.ledger)

    def _reads_back(self, topic: str, written: Pointer) -> bool:
        if self._after_write is not None:
            self._after_write(topic, written)
        return read_pointer(self._objects, topic).to_bytes() == written.to_bytes()

    def sole_writer(self, topic: str) -> bool:
        return self._held and topic in self._taken and self._may_write()

    def problem(self) -> str | None:
        if self._held and not self._may_write():
            return "this cluster member has not confirmed its membership within its session"
        return None


def _flock_holder(path: Path) -> dict[str, object] | None:
    """The holder a live single daemon's lock names (``{}`` if unnamed), or None if no process holds the lock. A
    shared lock is taken and given back at once: members probing at the same time do not see each other."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                data = json.loads(os.pread(fd, 4096, 0) or b"{}")
            except (OSError, ValueError):
                data = {}
            return data if isinstance(data, dict) else {}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
