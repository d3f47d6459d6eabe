"""The Spark + Parquet ``TopicCompactionService`` of one topic: its current ledger, reads of it with
pyarrow, and the start of compaction tasks (their work is ``engine/run.py``)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from compactord.engine.run import CompactionRun
from compactord.engine.seams import EngineResources
from compactord.engine.sweeps import SWEEPS
from compactord.errors import (
    CompactionAlreadyRunning,
    CompactordError,
    Fenced,
    InvalidArgument,
    LedgerCorrupt,
    LedgerRetired,
    NotCompacted,
)
from compactord.interfaces import TopicCompactionService
from compactord.ledger.pointer import Pointer, expired
from compactord.ledger.reads import LedgerHandle, LedgerReader
from compactord.model import CompactedPage, CompactedRows, Horizon, LedgerManifest, Position, validate_topic_name
from compactord.task import CompactionTaskCtx

__all__ = ["SparkTopicCompactionService"]

log = logging.getLogger(__name__)
T = TypeVar("T")
# A read retries when a switch retires the ledger it found; more than one retry needs two switches
# within one read, so this bound is never reached in practice.
_READ_ATTEMPTS = 10
# Reads of the current ledger's manifest, each after a switch deleted the ledger the pointer named when read.
_SWITCHED_ATTEMPTS = 3
# A sweep of retired ledgers waits while a task of the topic runs (the pointer is the task's base); it is tried
# again this much later; one the root failed (unreachable, full) is tried again after the longer wait.
_SWEEP_RETRY_S = 5.0
_SWEEP_ERROR_RETRY_S = 30.0


class SparkTopicCompactionService(TopicCompactionService):
    def __init__(self, topic: str, factory: EngineResources) -> None:
        self.topic = validate_topic_name(topic)
        self.factory = factory
        self._lock = threading.RLock()
        self._task: CompactionTaskCtx | None = None
        self._handle: LedgerHandle | None = None
        self._handle_id: int | None = None
        self._corrupt: LedgerCorrupt | None = None
        # Ledgers a switch replaced that a pinned read opened, readable by id until the ``until`` the pointer's
        # retired list gives them (the list, not this, says which are readable: it outlives a restart).
        self._retired: dict[int, tuple[LedgerHandle, Callable[[], None]]] = {}
        self._sweep_at: float | None = None  # when this topic's sweep is due (``sweeps.SWEEPS``); None: not asked
        self._closed = False  # closed with its factory: no sweep is armed again

    # -- the current ledger ---------------------------------------------------------------------

    def current(self, *, recheck: bool = False) -> LedgerHandle | None:
        """The verified current ledger (loaded once; its files checked again if ``recheck``).

        :raises LedgerCorrupt: the current ledger fails verification (it is then not served).
        """
        store = self.factory.store
        with self._lock:
            pointer = store.pointer(self.topic)
            ledger_id = pointer.ledger
            if pointer.retired:  # also after a restart: the retired ledgers are deleted when their time comes
                self._arm_sweep(min(r.until for r in pointer.retired))
            if ledger_id is None:
                return None
            cached = self._handle if self._handle is not None and self._handle_id == ledger_id else None
            if cached is not None and not recheck:
                return cached
            try:
                manifest = store.verify(self.topic, ledger_id)
            except LedgerCorrupt as exc:
                if self._corrupt is None or str(self._corrupt) != str(exc):
                    log.error("compacted ledger of topic %s is not served: %s", self.topic, exc)
                self._corrupt = exc
                if cached is not None:  # its files went bad after it was loaded: stop serving it
                    self._handle = self._handle_id = None
                    cached.retire(lambda: None)
                raise
            self._corrupt = None
            if cached is not None:
                return cached
            handle = LedgerHandle(store.open_reader(self.topic, ledger_id, manifest))
            displaced = self._install(handle, ledger_id)
            if displaced is not None:
                # CURRENT moved without this service's switch (another service on the store): readers
                # of the stale ledger retry on the new one; its files are the switcher's to delete.
                displaced.retire(lambda: None)
            return handle

    def corrupt_ledger(self) -> LedgerCorrupt | None:
        return self._corrupt

    def _install(self, handle: LedgerHandle, ledger_id: int) -> LedgerHandle | None:
        with self._lock:
            old, self._handle, self._handle_id = self._handle, handle, ledger_id
            return old

    def switch_to(self, handle: LedgerHandle, ledger_id: int,
                  base: Pointer | None = None) -> tuple[LedgerHandle | None, Exception | None]:
        """Make ``handle`` current: the CURRENT pointer (by compare-and-swap against ``base``, the pointer the
        task read when it started; the ledger it names joins the retired list for
        ``compactionRetiredLedgerGraceSeconds``) and the in-memory ledger, under the lock that reads take to
        find the current ledger, so that no read installs the new ledger in between and leaves the old one
        unretired.

        The commit point is the replacement of CURRENT: an error before it raises (the previous ledger
        stays current; ``Fenced`` if another writer switched since ``base``); an error after it (e.g. the
        directory's fsync) is returned with the ledger this replaced in memory, and the switch stands.
        """
        store = self.factory.store
        grace = self.factory.settings.compaction_retired_ledger_grace_seconds
        with self._lock:
            problem: Exception | None = None
            try:
                store.switch(self.topic, ledger_id, base, retire_for=grace)
            except Fenced:
                raise
            except Exception as exc:
                if store.current_ledger_id(self.topic) != ledger_id:
                    raise
                problem = exc
            old = self._install(handle, ledger_id)
            self._corrupt = None
            return old, problem

    # -- ledgers replaced by a switch ------------------------------------------------------------

    def keep_retired(self, handle: LedgerHandle, ledger_id: int, delete: Callable[[], None]) -> None:
        """A ledger replaced by a switch stays readable by id (``ledger_id=`` reads) until the ``until`` the
        switch gave it in the pointer's retired list (``compactionRetiredLedgerGraceSeconds``), so that a reader
        pinned to it finishes; then the sweep takes it off the list, retires it, and ``delete`` runs once no
        read holds it."""
        if self.factory.settings.compaction_retired_ledger_grace_seconds <= 0:
            handle.retire(delete)
            return
        until = self.factory.store.pointer(self.topic).retired_until(ledger_id)
        with self._lock:
            self._retired[ledger_id] = (handle, delete)
        self._arm_sweep(until if until is not None else time.time())

    def sweep_retired(self) -> list[int]:
        """Take the retired ledgers past their ``until`` off the pointer, retire them and delete their files
        once no read holds them; return their ids. Waits while a task of the topic runs (its switch must find
        the pointer as the task read it)."""
        store = self.factory.store
        with self._lock:
            if self._task is not None and not self._task.done:
                self._arm_sweep(time.time() + _SWEEP_RETRY_S)
                return []
            try:
                pointer = store.pointer(self.topic)
                doomed = expired(pointer)
                if doomed:
                    store.drop_retired(self.topic, set(doomed), pointer)
            except (Fenced, LedgerCorrupt) as exc:  # another writer, or a pointer its reads report
                log.warning("retired ledgers of topic %s not swept: %s", self.topic, exc)
                return []
            left = [r.until for r in pointer.retired if r.id not in doomed]
            gone = [(i, self._retired.pop(i, None)) for i in doomed]
        if left:
            self._arm_sweep(min(left))
        for ledger_id, held in gone:
            handle, delete = held if held is not None else (None, self._deleter(ledger_id))
            if handle is not None:
                handle.retire(delete)
            else:
                delete()
        if gone:
            log.info("topic %s: retired ledgers %s deleted (past their grace period)", self.topic, doomed)
        return doomed

    def _deleter(self, ledger_id: int) -> Callable[[], None]:
        def delete() -> None:
            try:  # kept while a retained snapshot of the topic's Iceberg table names it (``delete_retired``)
                self.factory.store.delete_retired(self.topic, ledger_id)
            except CompactordError as exc:  # off the pointer already: an orphan, which the sweep removes
                log.warning("could not delete retired ledger %d of topic %s (removed by the storage sweep or "
                            "at the next start): %s", ledger_id, self.topic, exc)
        return delete

    def _arm_sweep(self, at: float) -> None:
        """Sweep at ``at`` (UTC seconds), unless a sweep is due before then; on the process's one sweep thread
        (``sweeps.SWEEPS``), never a thread of the topic's own."""
        with self._lock:
            if self._closed or (self._sweep_at is not None and self._sweep_at <= at):
                return
            self._sweep_at = at
        SWEEPS.at(at, lambda: self._run_sweep(at))

    def _run_sweep(self, at: float) -> None:
        with self._lock:
            # Only the sweep last asked for runs (one asked for earlier since, or the service closed, stands
            # instead); forgotten first, so that the sweep asks for the next one for the ledgers it leaves.
            if self._closed or self._sweep_at != at:
                return
            self._sweep_at = None
        try:
            self.sweep_retired()
        except CompactordError as exc:  # the root unreachable for a while, say: tried again a little later
            log.warning("retired ledgers of topic %s not swept (tried again in %gs): %s", self.topic,
                        _SWEEP_ERROR_RETRY_S, exc)
            self._arm_sweep(time.time() + _SWEEP_ERROR_RETRY_S)
        except Exception:  # the sweep thread has no caller: the next switch, read or start sweeps again
            log.exception("sweeping the retired ledgers of topic %s failed", self.topic)

    def _expire_all(self) -> None:
        with self._lock:
            retired, self._retired = self._retired, {}
            self._sweep_at = None  # a sweep asked for finds it was not the last asked for, and does nothing
        for handle, _ in retired.values():
            handle.retire(lambda: None)  # the files go with the topic, or at the next sweep or start-up

    def _handle_for(self, ledger_id: int | None) -> LedgerHandle:
        """The current ledger, or (``ledger_id``) that ledger if it is current or retired before its ``until``
        (read from the pointer: also after a restart).

        :raises LedgerRetired: the pinned ledger is past its ``until``, never existed, or its files are gone.
        """
        handle = self.current()
        if handle is None and ledger_id is None:
            raise NotCompacted(self.topic)
        if ledger_id is None or (handle is not None and handle.manifest.ledger_id == ledger_id):
            return handle  # type: ignore[return-value]
        current = None if handle is None else handle.manifest.ledger_id
        until = self.factory.store.pointer(self.topic).retired_until(ledger_id)
        if until is None or until <= time.time():
            raise LedgerRetired(
                f"ledger {ledger_id} of topic {self.topic!r} is not readable: it was replaced more than "
                f"compactionRetiredLedgerGraceSeconds ago, or never existed; start the read again "
                f"(the current ledger is {current})", topic=self.topic, ledger_id=ledger_id, current=current)
        with self._lock:
            held = self._retired.get(ledger_id)
            if held is not None:
                return held[0]
            store = self.factory.store
            try:  # retired before a restart: opened again, its files as its manifest lists them
                manifest = store.load_manifest(self.topic, ledger_id)
                retired = LedgerHandle(store.open_reader(self.topic, ledger_id, manifest))
            except LedgerCorrupt as exc:
                raise LedgerRetired(
                    f"ledger {ledger_id} of topic {self.topic!r} is not readable: its files are gone ({exc}); "
                    f"start the read again (the current ledger is {current})",
                    topic=self.topic, ledger_id=ledger_id, current=current) from exc
            self._retired[ledger_id] = (retired, self._deleter(ledger_id))
        self._arm_sweep(until)
        return retired

    def _read(self, fn: Callable[[LedgerReader], T], ledger_id: int | None = None) -> tuple[LedgerManifest, T]:
        """Run ``fn`` on the current ledger (or the pinned ``ledger_id``), which stays on disk until
        ``fn`` returns; return that ledger's manifest with the result. The one retry loop around a
        switch: a current ledger retired between the look-up and the read is replaced by the new
        current one; a pinned one is not (``LedgerRetired``)."""
        attempt = 0
        while True:
            handle = self._handle_for(ledger_id)
            try:
                reader = handle.acquire()
            except LedgerRetired:
                attempt += 1
                if ledger_id is not None or attempt >= _READ_ATTEMPTS:
                    raise
                continue
            try:
                return handle.manifest, fn(reader)
            except LedgerCorrupt as exc:
                if ledger_id is None or handle is self._handle:
                    raise
                raise LedgerRetired(  # a retired ledger's files went before its time (removed by hand)
                    f"ledger {ledger_id} of topic {self.topic!r} is not readable: its files are gone ({exc}); "
                    "start the read again", topic=self.topic, ledger_id=ledger_id) from exc
            finally:
                handle.release()

    def read_compacted_page(self, start: Position, n: int, include_markers: bool = False,
                            ledger_id: int | None = None, max_bytes: int | None = None) -> CompactedPage:
        if n < 1 or start.partition < 0 or start.offset < 0:
            raise InvalidArgument(f"need n >= 1 and a non-negative partition and offset, got {start}, n={n}")
        manifest, found = self._read(
            lambda r: r.read_slice(start.partition, start.offset, n, include_markers=include_markers,
                                   max_bytes=max_bytes), ledger_id)
        return CompactedPage(manifest, found.entries, found.truncated)

    def read_compacted_rows(self, start: Position, n: int, include_markers: bool = False,
                            ledger_id: int | None = None, max_bytes: int | None = None) -> CompactedRows:
        if n < 1 or start.partition < 0 or start.offset < 0:
            raise InvalidArgument(f"need n >= 1 and a non-negative partition and offset, got {start}, n={n}")
        manifest, (rows, truncated) = self._read(
            lambda r: r.read_rows(start.partition, start.offset, n, include_markers=include_markers,
                                  max_bytes=max_bytes), ledger_id)
        return CompactedRows(manifest, rows, truncated)

    def read_last_compacted_page(self, partition: int, ledger_id: int | None = None) -> CompactedPage:
        if partition < 0:
            raise InvalidArgument(f"partition must be >= 0, got {partition}")
        manifest, entry = self._read(lambda reader: reader.last(partition), ledger_id)
        return CompactedPage(manifest, [] if entry is None else [entry])

    def ledger_info(self, ledger_id: int | None = None) -> LedgerManifest | None:
        store = self.factory.store
        if ledger_id is not None:
            return self._handle_for(ledger_id).manifest
        for attempt in range(1, _SWITCHED_ATTEMPTS + 1):
            current = store.current_ledger_id(self.topic)
            if current is None:
                return None
            with self._lock:  # the current ledger's, as loaded: no other process changes the root meanwhile
                if store.sole_writer and self._handle is not None and self._handle_id == current:
                    return self._handle.manifest
            try:
                return store.load_manifest(self.topic, current)
            except LedgerCorrupt:
                # A switch between the pointer's read and the manifest's (this process's, or the owner's in a
                # cluster) may have deleted the replaced ledger: read the new one; the same one gone is corrupt.
                if attempt == _SWITCHED_ATTEMPTS or store.current_ledger_id(self.topic) == current:
                    raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def get_last_compacted_position(self) -> Horizon | None:
        manifest = self.ledger_info()
        return None if manifest is None else dict(manifest.horizon)

    @property
    def task(self) -> CompactionTaskCtx | None:
        return self._task

    # -- compaction -----------------------------------------------------------------------------

    def compact(self, *, rebuild: bool = False, start: bool = True, kind: str = "compaction") -> CompactionTaskCtx:
        """Start a task (``kind="preview"``: the read and choose steps only, see ``engine/preview.py``)."""
        with self._lock:
            if self._task is not None and not self._task.done:
                raise CompactionAlreadyRunning(self.topic, self._task)
            ctx = CompactionTaskCtx(self.topic, rebuild=rebuild, probe=self.factory.probe, kind=kind)
            thread = threading.Thread(target=CompactionRun(self, ctx), name=f"compact-{self.topic}", daemon=True)
            ctx.set_start_hook(thread.start)
            self._task = ctx
        if start:
            ctx.start()
        return ctx

    @contextlib.contextmanager
    def idle_guard(self) -> Iterator[bool]:
        """Hold the topic's guard (no task of it starts meanwhile, as in ``delete``); yield whether no task of
        the topic runs nor is still stopping (a cancelled task's Spark work may still write its ledger)."""
        with self._lock:
            task = self._task
            yield task is None or (task.done and task.worker_done.is_set())

    # -- lifecycle ------------------------------------------------------------------------------

    def delete(self) -> None:
        with self._lock:
            if self._task is not None and not self._task.done:
                raise CompactionAlreadyRunning(self.topic, self._task)
            handle, self._handle, self._handle_id = self._handle, None, None
        if handle is not None:
            handle.retire(lambda: None)
        self._expire_all()
        self.factory.store.delete_topic(self.topic)
        self.factory.forget(self.topic)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._handle = None
            self._handle_id = None
        self._expire_all()
