"""The ledger root: the root's lock, ledger ids, finalising and verifying ledgers, the compare-and-swap
``CURRENT`` pointer, and the removal of orphans. The layout is docs/design.md's ("The compacted ledger"):
``<topic>/CURRENT``, ``<topic>/ledger-<id>/`` (parts and ``manifest.json``), ``<topic>/DELETING``, and the
daemon's own objects under ``@compactord/``, every key built by ``layout.py``; ``upgrade.py`` moves what an
older layout wrote when the root is opened.

Every object goes through the root's ``ObjectStore`` (``compactord/storage``), which maps the store's
errors, and which declares what differs between backends (free space, folders, a local path): this module
addresses objects by key only. The pointer, the ids and the epoch are ``pointer.py``'s, sealing, loading and
verifying a ledger's manifest ``manifests.py``'s, allocating, sealing and switching to a ledger ``writes.py``'s,
deletion and orphans ``topic_removal.py``'s (by key ``removal.py``'s), who may write the root
and with what epoch ``guard.py``'s (a local root's lock, an object store's lease), when each topic is recovered
``recovery.py``'s (at its first use, or by a paced pass: never all at ``open()``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Self

from compactord.errors import (
    InsufficientDiskSpace,
    InvalidArgument,
    LedgerCorrupt,
    StorageUnavailable,
)
from compactord.ledger import layout, manifests, removal, topic_removal, upgrade, writes
from compactord.ledger.checksums import file_crc32c
from compactord.ledger.guard import WriterGuard, writer_guard
from compactord.ledger.layout import CURRENT, DAEMON_DIR, DELETING, LEDGER_RE, MANIFEST, ledger_dir_name
from compactord.ledger.lock import unwritable
from compactord.ledger.pointer import KnownPointers, Pointer, read_pointer, write_pointer
from compactord.ledger.quarantine import lost_pointer, quarantine, quarantined
from compactord.ledger.reads import LedgerReader
from compactord.ledger.recovery import RECOVERY_TOPICS_PER_SECOND, RecoveryHook, TopicRecovery
from compactord.model import LedgerManifest, validate_topic_name
from compactord.storage import ObjectStore, open_store

__all__ = ["CURRENT", "DAEMON_DIR", "DELETING", "MANIFEST", "LedgerStore", "Pointer", "file_crc32c", "ledger_dir_name"]

log = logging.getLogger(__name__)


class LedgerStore:
    """The compacted ledgers under one root. ``open()`` takes the root's lock (an object store's lease); one daemon
    writes a root.

    The reading methods (``topics``, ``current_ledger_id``, ``load_manifest``, ``verify``) also work on
    a store that is not open; the writing ones expect the lock to be held.
    """

    def __init__(self, root: str | Path, objects: ObjectStore | None = None, lease_seconds: float = 30.0,
                 recovery_per_second: float = RECOVERY_TOPICS_PER_SECOND, guard: WriterGuard | None = None) -> None:
        """``objects``: the root's store as the daemon opened it (``open_store`` with its settings and
        metrics); by default the local root ``root``. ``lease_seconds``: an object store's lease
        (``lease.py``; a local root has its lock). ``recovery_per_second``: the pace of the recovery pass that
        ``open()`` starts (``recovery.py``); <= 0: none (``start_recovery_pass`` starts one later), each topic
        recovers at its first use. ``guard``: who may write which topic (``guard.py``); by default the root's one
        writer's (``writer_guard``: a local root's lock, an object store's lease), a cluster member's
        ``OwnershipGuard`` (``ownership.py``) where daemons share the root."""
        self.objects: ObjectStore = objects if objects is not None else open_store(str(root))
        self.root: Path = self.objects.local_root or Path(str(root))
        self.lease_seconds = lease_seconds
        # Who may write, and the epoch every pointer write carries (raised by ``open()``; 0 until then).
        self.guard: WriterGuard = guard if guard is not None else writer_guard(self.objects, self.root, lease_seconds)
        self._opened = False
        self._known = KnownPointers()  # while this store is the sole writer: the pointers it read or wrote
        self.recovery_per_second = recovery_per_second
        self._recovery = TopicRecovery(self.recover_topic)
        self._keepers: list[Callable[[str], set[int] | None]] = []

    # -- the root's lock -------------------------------------------------------------------------

    def open(self) -> Self:
        """Create the root if needed, take its writer guard (``guard.py``: a local root's lock, an object store's
        lease), which raises the writer epoch, check that the root can be written and upgrade an older layout;
        then start the recovery pass. Each topic is recovered (``recover_topic``) before its first use, or by the
        pass, once per ``open()``; never every topic here, which would be a burst of requests per topic.

        A lock whose holder died is free again (flock locks die with their process); a lease is taken over once
        stale, after ``lease_seconds`` (``lease.acquire``).

        :raises LedgerRootLocked: another live process, or another store in this one, holds the root.
        :raises LedgerRootUnwritable: the root cannot be created, locked or written (read-only, full,
            no permission, an I/O error).
        """
        if self.is_open:
            return self
        self.guard.acquire()  # first: nothing of the root is touched before it is ours
        self._opened = True
        try:
            with self._unwritable("cannot be written"):
                # A root on a read-only or full file system takes the lock (it exists already) and
                # fails only at the first ledger: find out now, before anything is served.
                probe = layout.write_probe_key(f"{os.getpid()}-{uuid.uuid4().hex[:12]}")
                self.objects.put(probe, b"compactord checks that the ledger root can be written\n")
                self.objects.delete(probe)
                daemon_dir = self.objects.local_path(DAEMON_DIR)
                if daemon_dir is not None:  # a file system's folders may fold case; an object store's keys do not
                    layout.refuse_folded_case(self.root, daemon_dir)
                if not self.guard.shared_root:  # other members' writes under way: each topic's owner cleans it
                    self.objects.recover()
            upgrade.upgrade_root(self.objects)
            self._recovery.start()
            self.start_recovery_pass(self.recovery_per_second)
        except BaseException:
            self.close()
            raise
        return self

    def start_recovery_pass(self, per_second: float = RECOVERY_TOPICS_PER_SECOND) -> None:
        """Recover every topic in a thread, ``per_second`` topics a second at most (``recovery.py``), unless a pass
        runs already; it stops at ``close()``. Nothing on a store that is not open, or for ``per_second`` <= 0."""
        self._recovery.start_pass(self.topics, per_second)

    def after_recovery(self, hook: RecoveryHook) -> None:
        """Call ``hook(topic, deleted)`` for each topic once recovered, before the topic is served (``deleted``:
        the recovery completed the topic's deletion), and at once for the topics recovered already."""
        self._recovery.after_recovery(hook)

    def keep_also(self, keeper: Callable[[str], set[int] | None]) -> None:
        """Keep, besides the ledgers a topic's pointer names, those ``keeper(topic)`` names (an Iceberg table's
        retained snapshots); None from it: not known yet, so every ledger below the current one is kept. The
        retired ledgers' sweep and the orphans' removal both keep them (``topic_removal``)."""
        self._keepers.append(keeper)

    def kept_elsewhere(self, topic: str) -> set[int] | None:
        """The ledgers of ``topic`` the keepers name (None: one of them does not know yet)."""
        kept: set[int] = set()
        for keeper in self._keepers:
            named = keeper(topic)
            if named is None:
                return None
            kept |= named
        return kept

    def ready(self, topic: str) -> None:
        """Recover ``topic`` if it was not since ``open()`` (nothing on a store that is not open): the gate of
        every per-topic entry point, for what keeps a topic's objects outside the store (its run history).

        :raises InvalidTopicName: ``topic`` is not a legal Kafka topic name.
        :raises StorageUnavailable: the recovery's requests failed (the next use tries again).
        """
        self._recovery.ready(validate_topic_name(topic))

    def recovered(self, topic: str) -> bool:
        """Whether ``topic`` was recovered since ``open()``."""
        return self._recovery.recovered(topic)

    def recover_topic(self, topic: str) -> bool | None:
        """What the root's writer does for one topic before it serves or compacts it (``ready`` calls it once per
        ``open()``): complete a deletion a restart interrupted, quarantine ledgers that lost their ``CURRENT``,
        remove retired ledgers past their ``until`` and orphans. One topic at a time, touching only its own
        objects, so that a writer that owns some of a root's topics recovers those alone. True if it completed
        the topic's deletion; None if it could not write now (the root's lease is not renewed yet): the topic is
        then read as it is, unless its deletion is pending, and recovered at a touch once the lease is held.

        On a root daemons share, only the topic's owner recovers it (after ``take``), without the root-wide lock or
        lease; it also aborts the topic's unfinished uploads (a previous owner's). A topic another member owns is
        read as it is (None).

        :raises Fenced: another daemon took the root over (it recovers the topic).
        :raises StorageUnavailable: the store does not answer, or the lease is not renewed and the topic's
            deletion is pending (it is not served)."""
        if not self.guard.owns(topic):
            return None  # its owner recovers it
        try:
            self._check_writer(topic)  # a store no longer the root's writer leaves its topics to the one that is
        except StorageUnavailable:
            if self.deletion_pending(topic):
                raise
            return None
        if self.deletion_pending(topic):  # first: a topic being deleted is neither served nor quarantined
            log.warning("completing the deletion of topic %r that a restart interrupted", topic)
            self.delete_topic(topic)
            return True
        try:
            self.topic_dir(topic)
            if lost_pointer(self.objects, topic):
                quarantine(self.objects, topic)
            self.sweep_retired(topic)
            self.remove_orphans(topic)
            if self.guard.shared_root:  # the root-wide clean-up of open() is each topic's there
                self.objects.abort_uploads(layout.topic_prefix(topic), time.time())
        except LedgerCorrupt as exc:
            # Keep every ledger of a topic whose pointer is unreadable: its reads report it.
            log.error("not removing orphans of topic %r: %s", topic, exc)
        return False

    def take(self, topic: str) -> int:
        """Take ``topic`` (``WriterGuard.take``: a cluster member raises its epoch in its pointer), then recover it
        as its new owner (``recover_topic``: what a previous owner left); return its fence.

        :raises Fenced: this process may not take it now. :raises StorageUnavailable: the store failed.
        """
        topic = validate_topic_name(topic)
        epoch = self.guard.take(topic)
        self._known.wrote(topic, None)
        self._recovery.forget(topic)  # recovered again, as its new owner
        self.ready(topic)
        return epoch

    def release_topic(self, topic: str) -> None:
        """Give ``topic`` back (``WriterGuard.release_topic``): nothing of it is written here from now on."""
        topic = validate_topic_name(topic)
        self.guard.release_topic(topic)
        self._known.wrote(topic, None)
        self._recovery.forget(topic)

    def put_topic_object(self, topic: str, name: str, data: bytes) -> str:
        """Write ``<topic>/<name>`` as the topic's writer (``writes.put_topic_object``); return its version."""
        return writes.put_topic_object(self, topic, name, data)

    def delete_topic_object(self, topic: str, name: str) -> None:
        """Remove ``<topic>/<name>`` as the topic's writer (``writes.delete_topic_object``)."""
        writes.delete_topic_object(self, topic, name)

    def _unwritable(self, what: str) -> contextlib.AbstractContextManager[None]:
        return unwritable(self.root, what)

    def _check_writer(self, topic: str) -> None:
        """Before a write of ``topic`` that another daemon's could conflict with (``WriterGuard.check``: Fenced
        once taken over, StorageUnavailable while a lease is not renewed)."""
        self.guard.check(topic)

    def close(self) -> None:
        """Stop the recovery pass and release the root's writer guard (idempotent)."""
        self._recovery.stop()
        self._opened = False
        self._known.clear()
        self.guard.release()

    @property
    def is_open(self) -> bool:
        return self._opened

    @property
    def epoch(self) -> int:
        """The root's writer epoch this store writes pointers with (``WriterGuard.fence``: the same for every
        topic of a root one daemon writes): raised by ``open()``; 0 until then (an older version's)."""
        return self.guard.fence("")

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- names and paths -------------------------------------------------------------------------

    @property
    def location(self) -> str:
        """Where the root is, for logs and ``/v1/info``: a local folder's path, or ``s3://BUCKET/PREFIX``."""
        folder = self.objects.local_root
        return str(folder) if folder is not None else self.objects.describe()

    def topic_dir(self, topic: str) -> Path:
        """The directory of ``topic`` (it may not exist).

        :raises InvalidTopicName: ``topic`` is not a legal Kafka topic name.
        :raises InvalidArgument: the directory resolves outside the root (a symbolic link).
        """
        path = self.root / validate_topic_name(topic)
        self._recovery.ready(topic)
        folder = self.objects.local_path(topic)  # a folder of this host may be a symbolic link
        if folder is not None and folder.resolve().parent != self.root:
            raise InvalidArgument(
                f"directory of topic {topic!r} resolves to {folder.resolve()}, outside ledger root {self.root}"
            )
        return path

    def ledger_path(self, topic: str, ledger_id: int) -> Path:
        """The directory of ledger ``ledger_id`` of ``topic`` (it may not exist).

        :raises InvalidTopicName: ``topic`` is not a legal Kafka topic name.
        :raises InvalidArgument: ``ledger_id`` is not a positive integer.
        """
        if isinstance(ledger_id, bool) or not isinstance(ledger_id, int) or ledger_id < 1:
            raise InvalidArgument(f"ledger id must be a positive integer, got: {ledger_id!r}")
        return self.topic_dir(topic) / ledger_dir_name(ledger_id)

    def topics(self) -> list[str]:
        """Sorted names of the topics under the root."""
        folders = [name[:-1] for name in self.objects.children() if name.endswith("/")]
        return [name for name in folders if name != DAEMON_DIR and layout.is_topic_name(name)]

    def pointer(self, topic: str) -> Pointer:
        """The topic's ``CURRENT``, with its version (``Pointer(None)``: the topic has no ledger): as read now,
        or, while this store holds an object store's lease (no other process writes a pointer then), as this
        store last read or wrote it.

        :raises LedgerCorrupt: ``CURRENT`` holds neither the JSON pointer nor an older version's line.
        """
        topic = validate_topic_name(topic)
        self._recovery.ready(topic)
        if not self.guard.sole_writer(topic):
            return read_pointer(self.objects, topic)
        return self._known.read(topic, lambda: read_pointer(self.objects, topic))

    def pointer_generation(self, topic: str) -> int:
        """A number that changes, from memory, at each write of ``topic``'s pointer by this process (a switch, a
        retired ledger dropped, a deletion, a take or a release) and when the store closes: what a reader learnt
        of the current ledger holds while it stays, unless another process writes the pointer (a cluster's other
        members, a daemon that took an object store's lease over)."""
        return self._known.generation(topic)

    @property
    def sole_writer(self) -> bool:
        """Whether no other process writes under the root while this store holds it (an object store's lease,
        ``WriterGuard.sole_writer``), so that what it read there stays true until it writes (a local root's files
        are read again, at a syscall's cost)."""
        return self.guard.sole_writer("")

    def _write_pointer(self, topic: str, new: Pointer, base: Pointer) -> Pointer:
        self._check_writer(topic)
        try:
            written = write_pointer(self.objects, topic, new, base)
            self.guard.confirm(topic, written)  # a store that let another write win too: reads back the other's
        except BaseException:
            self._known.wrote(topic, None)  # lost a race, or an answer lost: read it again
            raise
        self._known.wrote(topic, written)
        return written

    def switch_base(self, topic: str) -> Pointer:
        """The pointer a task switches against (``switch``'s ``base``): as ``pointer`` reads it, or, when it is
        unreadable, its version alone, so that the run that rebuilds the topic replaces it."""
        try:
            return self.pointer(topic)
        except LedgerCorrupt:
            info = self.objects.head(layout.pointer_key(topic))
            return Pointer(None, version=None if info is None else info.version)

    def current_ledger_id(self, topic: str) -> int | None:
        """The ledger ``CURRENT`` names, or None if the topic has no ledger.

        :raises LedgerCorrupt: ``CURRENT`` is unreadable.
        """
        return self.pointer(topic).ledger

    def ledger_ids(self, topic: str) -> list[int]:
        """The ids of the ledger folders under the topic, sorted (finished or not)."""
        prefix = layout.topic_prefix(topic)
        self._recovery.ready(topic)
        names = self.objects.children(prefix)
        found = (LEDGER_RE.fullmatch(name.rstrip("/")) for name in names)
        return sorted(int(m.group(1)) for m in found if m)

    # -- writing a ledger ------------------------------------------------------------------------

    def allocate_ledger(self, topic: str) -> tuple[int, Path]:
        """The topic's next ledger id, never reused, and its path (``writes.allocate_ledger``)."""
        return writes.allocate_ledger(self, topic)

    def finalize_ledger(self, topic: str, ledger_id: int, manifest: LedgerManifest) -> LedgerManifest:
        """Seal a ledger Spark has written, filling ``manifest`` in (``writes.finalize_ledger``)."""
        return writes.finalize_ledger(self, topic, ledger_id, manifest)

    def switch(self, topic: str, ledger_id: int, base: Pointer | None = None,
               retire_for: float | None = None) -> Pointer:
        """Point ``CURRENT`` at a finalized ledger by compare-and-swap against ``base`` (the pointer the
        task read when it started; None: as read now), with this store's epoch; return the new pointer. The
        ledger ``base`` named joins the retired list for ``retire_for`` seconds (``writes.switched``). A crash
        leaves the old or the new pointer, never a mix.

        :raises Fenced: the pointer is no longer ``base`` (another writer switched since), or names a
            writer of a higher epoch than this store's, or another daemon took the root's lease; nothing changed.
        :raises StorageUnavailable: the root's lease has not been renewed in time (``Lease.check``).
        :raises InvalidArgument: the ledger has no ``manifest.json`` (it was not finalized).
        :raises InsufficientDiskSpace: the disk is full.
        """
        new, base = writes.switched(self, topic, ledger_id, base, retire_for)
        return self._write_pointer(topic, new, base)

    def drop_retired(self, topic: str, ids: set[int], base: Pointer) -> Pointer:
        """Take ``ids`` off the pointer's retired list by compare-and-swap against ``base``.

        :raises Fenced: the pointer changed since ``base`` was read, or names a higher epoch than this store's.
        """
        self.guard.check_pointer(topic, base)
        new = base.without(topic, ids, self.guard.fence(topic))
        return base if new.retired == base.retired else self._write_pointer(topic, new, base)

    def sweep_retired(self, topic: str, now: float | None = None) -> list[int]:
        """Delete the retired ledgers past their ``until``; return them (``topic_removal.sweep_retired``)."""
        return topic_removal.sweep_retired(self, topic, now)

    # -- reading a ledger's manifest -------------------------------------------------------------

    def load_manifest(self, topic: str, ledger_id: int) -> LedgerManifest:
        """The manifest of a ledger.

        :raises LedgerCorrupt: ``manifest.json`` is missing, unparseable or names another ledger.
        """
        return manifests.load_manifest(self.objects, self._prefix(topic, ledger_id), topic, ledger_id)

    def open_reader(self, topic: str, ledger_id: int, manifest: LedgerManifest) -> LedgerReader:
        """A reader of the ledger whose files ``manifest`` lists, reading them through the store.

        :raises LedgerCorrupt: a file is missing, not Parquet, or has another row count than listed.
        """
        return LedgerReader(self.ledger_path(topic, ledger_id), manifest, self.objects, self._prefix(topic, ledger_id))

    def verify(self, topic: str, ledger_id: int) -> LedgerManifest:
        """Load the manifest and check every listed file's size and CRC-32C.

        :raises LedgerCorrupt: the manifest is bad, or a file is missing, has another size or checksum.
        """
        return manifests.verify(self.objects, self._prefix(topic, ledger_id), topic, ledger_id)

    def check_free_space(self, needed_bytes: int) -> None:
        """:raises InsufficientDiskSpace: the root's file system has less than ``needed_bytes`` free."""
        if isinstance(needed_bytes, bool) or not isinstance(needed_bytes, int) or needed_bytes < 0:
            raise InvalidArgument(f"needed_bytes must be a non-negative integer, got: {needed_bytes!r}")
        free = self.objects.free_bytes()  # before open() the root may not exist yet: its file system's
        if free is not None and free < needed_bytes:  # None: an object store has no free space to ask of
            raise InsufficientDiskSpace(
                f"ledger root {self.root} has {free} bytes free; the next ledger needs {needed_bytes}",
                free=free,
                needed=needed_bytes,
            )

    # -- removing --------------------------------------------------------------------------------

    def delete_ledger(self, topic: str, ledger_id: int) -> None:
        """Remove a ledger that is not current (``topic_removal.delete_ledger``)."""
        topic_removal.delete_ledger(self, topic, ledger_id)

    def delete_retired(self, topic: str, ledger_id: int) -> bool:
        """Remove a retired ledger past its grace unless a keeper keeps it (``topic_removal.delete_retired``)."""
        return topic_removal.delete_retired(self, topic, ledger_id)

    def delete_released(self, topic: str) -> list[int]:
        """Remove the finalized ledgers below the current one that nothing keeps any more
        (``topic_removal.delete_released``)."""
        return topic_removal.delete_released(self, topic)

    def discard(self, path: Path) -> None:
        """Remove a partial ledger directory (``topic_removal.discard``)."""
        topic_removal.discard(self, path)

    def mark_deleting(self, topic: str) -> bool:
        """Record durably that ``topic`` is to be deleted; False without a mark (``topic_removal.mark_deleting``)."""
        return topic_removal.mark_deleting(self, topic)

    def unmark_deleting(self, topic: str) -> None:
        """Withdraw a deletion mark (a deletion given up, e.g. because a new compaction started)."""
        topic_removal.unmark_deleting(self, topic)

    def deletion_pending(self, topic: str) -> bool:
        """Whether ``topic`` carries a deletion mark not yet completed (``topic_removal.deletion_pending``)."""
        return topic_removal.deletion_pending(self, topic)

    def delete_topic(self, topic: str) -> None:
        """Remove a topic with every ledger, its deletion mark last (``topic_removal.delete_topic``)."""
        topic_removal.delete_topic(self, self._known, topic)

    def quarantined(self) -> list[str]:
        """The folders under ``@compactord/quarantine`` (``<topic>/<time>``), sorted."""
        return quarantined(self.objects)

    def remove_orphans(self, topic: str) -> list[str]:
        """Remove the topic's orphans, in its recovery; return their keys (``topic_removal.remove_orphans``)."""
        return topic_removal.remove_orphans(self, topic)

    def sweep(self, topic: str, ceiling: int, older_than: float) -> removal.Swept:
        """Remove the topic's orphans on a root in use, past a margin (``topic_removal.sweep``)."""
        return topic_removal.sweep(self, topic, ceiling, older_than)

    def ledger_key(self, topic: str, ledger_id: int) -> str:
        """The key prefix of a ledger's objects without its last ``/`` (``<topic>/ledger-<id>``): the folder
        its tasks write into (``engine.worker_store``)."""
        return self._prefix(topic, ledger_id)[:-1]

    def _prefix(self, topic: str, ledger_id: int) -> str:
        """The key prefix of a ledger's objects, ``<topic>/ledger-<id>/`` (name and id checked)."""
        self.ledger_path(topic, ledger_id)
        return layout.ledger_prefix(topic, ledger_id)
