"""The ledger root on disk: the root's lock, ledger ids, finalising and verifying ledgers, the atomic
``CURRENT`` pointer, and the removal of orphans.

Layout::

    <root>/@compactord/lock            flock of the one daemon that writes here, holder as JSON
    <root>/@compactord/ledger-seq      last ledger id handed out (never reused)
    <root>/@compactord/progress/<task> a running task's reader progress files and CANCEL flag
    <root>/@compactord/quarantine/<topic>-<time>/  ledgers of a topic found without its CURRENT
    <root>/@compactord/history/<topic>.jsonl       the topic's run history (``daemon/history.py``)
    <root>/<topic>/CURRENT             "ledger-<id>\\n": the ledger that is served
    <root>/<topic>/ledger-<id>/        part-*.parquet (written by Spark) and manifest.json
    <root>/<topic>/DELETING            the topic's deletion was asked for; completed at the next open()

``@`` is illegal in Kafka topic names, so ``@compactord`` never collides with a topic directory.
This module is the boundary where file-system errors become ``CompactordError`` subclasses; sealing,
loading and verifying a ledger's manifest are in ``manifests.py``, deletion and orphans in ``removal.py``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

from compactord.errors import (
    CompactordError,
    InsufficientDiskSpace,
    InvalidArgument,
    LedgerCorrupt,
    LedgerRootUnwritable,
)
from compactord.ledger import manifests, removal
from compactord.ledger.files import (
    CURRENT,
    LEDGER_RE,
    MANIFEST,
    TMP_SUFFIX,
    disk_errors,
    file_crc32c,
    fsync_path,
    ledger_dir_name,
    list_names,
    remove_path,
    write_atomic,
)
from compactord.ledger.lock import RootLock
from compactord.ledger.quarantine import lost_pointer, quarantine
from compactord.ledger.removal import DELETING
from compactord.model import LedgerManifest, validate_topic_name

__all__ = ["CURRENT", "DAEMON_DIR", "DELETING", "MANIFEST", "LedgerStore", "file_crc32c", "ledger_dir_name"]

log = logging.getLogger(__name__)

DAEMON_DIR = "@compactord"
_LOCK, _SEQ, _PROGRESS, _QUARANTINE = "lock", "ledger-seq", "progress", "quarantine"
_WRITE_PROBE = "write-probe"


class LedgerStore:
    """The compacted ledgers under one root. ``open()`` takes the root's lock; one daemon writes a root.

    The reading methods (``topics``, ``current_ledger_id``, ``load_manifest``, ``verify``) also work on
    a store that is not open; the writing ones expect the lock to be held.
    """

    def __init__(self, root: str | Path) -> None:
        self.root: Path = Path(root).expanduser().resolve()
        self._daemon_dir = self.root / DAEMON_DIR
        self._lock = RootLock(self._daemon_dir / _LOCK, self.root)
        self._seq_lock = threading.Lock()

    # -- the root's lock -------------------------------------------------------------------------

    def open(self) -> LedgerStore:
        """Create the root if needed, take its lock, complete the topic deletions a restart interrupted,
        quarantine ledgers that lost their ``CURRENT`` and remove orphans left by a previous run.

        A lock whose holder died is free again (flock locks die with their process).

        :raises LedgerRootLocked: another live process, or another store in this one, holds the root.
        :raises LedgerRootUnwritable: the root cannot be created, locked or written (read-only, full,
            no permission, an I/O error).
        """
        if self._lock.held:
            return self
        with self._unwritable("cannot be created"):
            self._daemon_dir.mkdir(parents=True, exist_ok=True)
        with self._unwritable("cannot be locked"):
            self._lock.acquire()
        try:
            with self._unwritable("cannot be written"):
                # A root on a read-only or full file system takes the lock (it exists already) and
                # fails only at the first ledger: find out now, before anything is served.
                probe = self._daemon_dir / _WRITE_PROBE
                write_atomic(probe, b"compactord checks that the ledger root can be written\n")
                remove_path(probe)
            with contextlib.suppress(FileNotFoundError):
                (self._daemon_dir / (_SEQ + TMP_SUFFIX)).unlink()
            # Progress folders of tasks that a crash interrupted: no task runs before open() returns.
            for task in list_names(self._daemon_dir / _PROGRESS):
                log.warning("removing progress files of interrupted task %s", task)
                remove_path(self._daemon_dir / _PROGRESS / task)
            # Deletions first: a topic being deleted must not be served, nor its ledgers quarantined.
            for topic in self.topics():
                if self.deletion_pending(topic):
                    log.warning("completing the deletion of topic %r that a restart interrupted", topic)
                    self.delete_topic(topic)
            for topic in self.topics():
                try:
                    topic_dir = self.topic_dir(topic)
                    if lost_pointer(topic_dir):
                        quarantine(topic, topic_dir, self._daemon_dir / _QUARANTINE)
                    self.remove_orphans(topic)
                except LedgerCorrupt as exc:
                    # Keep every ledger of a topic whose pointer is unreadable: its reads report it.
                    log.error("not removing orphans of topic %r: %s", topic, exc)
        except BaseException:
            self.close()
            raise
        return self

    @contextlib.contextmanager
    def _unwritable(self, what: str) -> Iterator[None]:
        try:
            yield
        except CompactordError:
            raise
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise LedgerRootUnwritable(
                f"ledger root {self.root} {what}: {reason} ({exc}); compactedLedgerRoot must be a writable "
                "directory on a mounted file system with free space", root=str(self.root)
            ) from exc

    def close(self) -> None:
        """Release the root's lock (idempotent)."""
        self._lock.release()

    @property
    def is_open(self) -> bool:
        return self._lock.held

    def __enter__(self) -> LedgerStore:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- names and paths -------------------------------------------------------------------------

    def topic_dir(self, topic: str) -> Path:
        """The directory of ``topic`` (it may not exist).

        :raises InvalidTopicName: ``topic`` is not a legal Kafka topic name.
        :raises InvalidArgument: the directory resolves outside the root (a symbolic link).
        """
        path = self.root / validate_topic_name(topic)
        if path.resolve().parent != self.root:
            raise InvalidArgument(
                f"directory of topic {topic!r} resolves to {path.resolve()}, outside ledger root {self.root}"
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

    def progress_dir(self, task_id: str) -> Path:
        """The folder where a task's readers report progress (removed at ``open()`` if a crash left it)."""
        if not task_id or Path(task_id).name != task_id or task_id.startswith("."):
            raise InvalidArgument(f"task id must be a plain name, got: {task_id!r}")
        return self._daemon_dir / _PROGRESS / task_id

    def topics(self) -> list[str]:
        """Sorted names of the topic directories under the root."""
        try:
            children = [c for c in self.root.iterdir() if c.name != DAEMON_DIR and c.is_dir()]
        except FileNotFoundError:
            return []
        return sorted(c.name for c in children if _is_topic_name(c.name))

    def current_ledger_id(self, topic: str) -> int | None:
        """The ledger ``CURRENT`` names, or None if the topic has no ledger.

        :raises LedgerCorrupt: ``CURRENT`` cannot be read or does not hold ``ledger-<id>``.
        """
        path = self.topic_dir(topic) / CURRENT
        try:
            text = path.read_text(encoding="ascii", errors="replace")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise LedgerCorrupt(f"pointer {path} of topic {topic!r} cannot be read: {exc}") from exc
        match = LEDGER_RE.fullmatch(text.rstrip("\n"))
        if match is None:
            raise LedgerCorrupt(
                f"pointer {path} of topic {topic!r} holds {text[:80]!r}; expected one line 'ledger-<id>'",
                topic=topic,
            )
        return int(match.group(1))

    # -- writing a ledger ------------------------------------------------------------------------

    def allocate_ledger(self, topic: str) -> tuple[int, Path]:
        """Hand out the next ledger id (monotonic over the whole root, never reused) and its path.

        Creates the topic directory; the ledger directory is left to its writer (Spark).

        :raises LedgerCorrupt: the id counter file does not hold an integer.
        :raises InsufficientDiskSpace: the disk is full.
        """
        topic_dir = self.topic_dir(topic)
        seq_path = self._daemon_dir / _SEQ
        with self._seq_lock, disk_errors(f"allocating a ledger of topic {topic!r}"):
            try:
                text = seq_path.read_text(encoding="ascii", errors="replace")
            except FileNotFoundError:
                text = "0"
            if not text.strip().isdigit():
                raise LedgerCorrupt(f"ledger id counter {seq_path} holds {text[:40]!r}; expected an integer")
            # Should the counter ever be lost, still never hand out an id this topic has used.
            used = [int(m.group(1)) for m in map(LEDGER_RE.fullmatch, list_names(topic_dir)) if m]
            next_id = max([int(text), *used]) + 1
            self._daemon_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(seq_path, f"{next_id}\n".encode())
            if not topic_dir.is_dir():
                topic_dir.mkdir(parents=True, exist_ok=True)
                fsync_path(self.root)
        return next_id, topic_dir / ledger_dir_name(next_id)

    def finalize_ledger(self, topic: str, ledger_id: int, manifest: LedgerManifest) -> LedgerManifest:
        """Seal a ledger Spark has written: drop Spark's ``_SUCCESS`` and ``*.crc`` files, checksum and
        count every ``part-*.parquet``, write ``manifest.json`` and fsync it all.

        ``manifest`` is filled in place (files, bytes, records_kept, markers, removed, oldest marker)
        and returned; ``records_read`` must be set by the caller.

        :raises InvalidArgument: ``manifest`` names another topic or ledger id.
        :raises LedgerCorrupt: a part file is not Parquet or lacks a column of the record schema.
        :raises InsufficientDiskSpace: the disk is full.
        """
        path = self.ledger_path(topic, ledger_id)
        if manifest.topic != topic or manifest.ledger_id != ledger_id:
            raise InvalidArgument(
                f"manifest of topic {manifest.topic!r} ledger {manifest.ledger_id} given to finalize "
                f"ledger {ledger_id} of topic {topic!r}; they must match"
            )
        return manifests.finalize(path, manifest)

    def switch(self, topic: str, ledger_id: int) -> None:
        """Point ``CURRENT`` at a finalized ledger; a crash leaves the old or the new pointer, never a mix.

        :raises InvalidArgument: the ledger has no ``manifest.json`` (it was not finalized).
        :raises InsufficientDiskSpace: the disk is full.
        """
        path = self.ledger_path(topic, ledger_id)
        if not (path / MANIFEST).is_file():
            raise InvalidArgument(
                f"ledger {ledger_id} of topic {topic!r} has no {MANIFEST} at {path}: "
                "only a finalized ledger can become current"
            )
        with disk_errors(f"switching topic {topic!r} to ledger {ledger_id}"):
            write_atomic(path.parent / CURRENT, f"{ledger_dir_name(ledger_id)}\n".encode())

    # -- reading a ledger's manifest -------------------------------------------------------------

    def load_manifest(self, topic: str, ledger_id: int) -> LedgerManifest:
        """The manifest of a ledger.

        :raises LedgerCorrupt: ``manifest.json`` is missing, unparseable or names another ledger.
        """
        return manifests.load_manifest(self.ledger_path(topic, ledger_id), topic, ledger_id)

    def verify(self, topic: str, ledger_id: int) -> LedgerManifest:
        """Load the manifest and check every listed file's size and CRC-32C.

        :raises LedgerCorrupt: the manifest is bad, or a file is missing, has another size or checksum.
        """
        return manifests.verify(self.ledger_path(topic, ledger_id), topic, ledger_id)

    def check_free_space(self, needed_bytes: int) -> None:
        """:raises InsufficientDiskSpace: the root's file system has less than ``needed_bytes`` free."""
        if isinstance(needed_bytes, bool) or not isinstance(needed_bytes, int) or needed_bytes < 0:
            raise InvalidArgument(f"needed_bytes must be a non-negative integer, got: {needed_bytes!r}")
        # Before open() the root may not exist yet: ask about the file system that will hold it.
        probe = next(p for p in (self.root, *self.root.parents) if p.exists())
        free = shutil.disk_usage(probe).free
        if free < needed_bytes:
            raise InsufficientDiskSpace(
                f"ledger root {self.root} has {free} bytes free; the next ledger needs {needed_bytes}",
                free=free,
                needed=needed_bytes,
            )

    # -- removing --------------------------------------------------------------------------------

    def delete_ledger(self, topic: str, ledger_id: int) -> None:
        """Remove a ledger that is not current (missing is fine).

        :raises InvalidArgument: ``CURRENT`` names this ledger.
        """
        path = self.ledger_path(topic, ledger_id)
        if self._is_current(topic, path):
            raise InvalidArgument(
                f"ledger {ledger_id} is the current ledger of topic {topic!r}; switch to another ledger "
                "before deleting it, or delete the topic"
            )
        remove_path(path)

    def discard(self, path: Path) -> None:
        """Remove a partial ledger directory (missing is fine).

        :raises InvalidArgument: ``path`` is not an entry of a topic directory of this root, or is the
            topic's pointer or current ledger.
        """
        resolved = Path(path).resolve()
        parts = resolved.relative_to(self.root).parts if resolved.is_relative_to(self.root) else ()
        is_topic = len(parts) == 2 and _is_topic_name(parts[0]) and parts[1] != CURRENT
        if not is_topic:
            raise InvalidArgument(
                f"refusing to discard {path}: only an entry of a topic directory under ledger root "
                f"{self.root} (not its CURRENT) can be discarded"
            )
        if self._is_current(parts[0], resolved):
            raise InvalidArgument(f"refusing to discard {path}: it is the current ledger of {parts[0]!r}")
        remove_path(resolved)

    def mark_deleting(self, topic: str) -> bool:
        """Record durably that ``topic`` is to be deleted, before anything of it is removed: a deletion
        a crash or a restart interrupts is completed by the next ``open()``.

        False if the disk is too full to hold the mark: deleting is what frees a full disk, so the
        deletion goes on without it (logged), rather than being refused.
        """
        return removal.mark_deleting(self.root, self.topic_dir(topic), topic)

    def unmark_deleting(self, topic: str) -> None:
        """Withdraw a deletion mark (a deletion given up, e.g. because a new compaction started)."""
        remove_path(self.topic_dir(topic) / DELETING)

    def deletion_pending(self, topic: str) -> bool:
        """Whether ``topic`` carries a deletion mark (``mark_deleting``) not yet completed."""
        return (self.topic_dir(topic) / DELETING).is_file()

    def delete_topic(self, topic: str) -> None:
        """Remove a topic's directory with every ledger, its pointer and policies (missing is fine).

        The deletion mark, if any, goes last: until then a crash leaves a deletion ``open()`` completes.
        """
        removal.delete_topic(self.root, self.topic_dir(topic))

    def quarantined(self) -> list[str]:
        """The folders under ``@compactord/quarantine`` (``<topic>-<time>``), sorted."""
        return sorted(list_names(self._daemon_dir / _QUARANTINE))

    def remove_orphans(self, topic: str) -> list[Path]:
        """Remove the ledgers ``CURRENT`` does not name and leftover temporary files; return them.

        Only safe while nothing is being written, i.e. at ``open()``. Without ``CURRENT``, a finalized
        ledger (one with a manifest) is never removed: ``open()`` quarantines it.

        :raises LedgerCorrupt: ``CURRENT`` is unreadable (then nothing is removed).
        """
        return removal.remove_orphans(self.topic_dir(topic), topic, self.current_ledger_id(topic))

    def _is_current(self, topic: str, path: Path) -> bool:
        current = self.current_ledger_id(topic)
        if current is None:
            return False
        return path.resolve() == (self.topic_dir(topic) / ledger_dir_name(current)).resolve()


def _is_topic_name(name: str) -> bool:
    try:
        validate_topic_name(name)
    except CompactordError:
        return False
    return True


