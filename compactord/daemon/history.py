"""The run history: every ended task of a topic, kept on the ledger root across restarts.

Layout (``ledger/layout.py``: outside the topic folders, each topic's objects inside a folder named by it
alone, so that no two topics share a key), objects of the root's store::

    @compactord/history/<topic>/compacted.jsonl  the compacted runs: one JSON object a line, oldest first
    @compactord/history/<topic>/<seq>.json       one run each, recorded since the last compaction

An object store can neither append nor rename, so a run is not appended to the file: it is written as an
object of its own (``put``: durable, whole or absent) before the task's end is visible
(``CompactionTaskCtx.add_end_recorder``), so that a caller who saw the end finds the run here, also after a
crash. Once ``_PENDING_MAX`` runs wait as objects, or the bounds below call for it, the runs are compacted:
the file is written whole with every run within the bounds, then the run objects it now holds are deleted. A
crash between the two leaves a run both in the file and as an object: reads take each ``seq`` once. A file an
older version appended to may end in a torn line: reads skip it. A run is recorded once its object is written:
a compaction that fails then is logged and tried again at the next run, never makes the run recorded twice.

A failure that concerns one topic's objects (a corrupt or misplaced object: any error but
``StorageUnavailable``) is that topic's: logged, and the runs of other topics are recorded all the same.

Bounded per topic: ``compactionHistoryMaxRuns`` runs, none older than ``compactionHistoryMaxAgeDays``.
Reads apply both bounds; the file is compacted once it and the run objects hold a tenth more runs than the
bound, or its oldest run has expired.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from compactord.errors import (
    CompactordError,
    InvalidArgument,
    ObjectConflict,
    ObjectNotFound,
    PreconditionFailed,
    StorageUnavailable,
)
from compactord.ledger import layout
from compactord.storage import ObjectStore
from compactord.task import CompactionTaskCtx, TaskState

__all__ = ["MAX_UNRECORDED_RUNS", "RunHistory", "RunPage", "RunRecord", "UnrecordedRuns"]

log = logging.getLogger(__name__)

# Runs recorded as objects of their own before they are compacted into the topic's file: what a read of the
# history gets one by one (a list and a small get each), and how often the file is written whole.
_PENDING_MAX = 32
_SEQ_ATTEMPTS = 5  # run numbers tried before a record is given up as unrecordable (each lost to another writer)
_TEXT_MAX = 2000  # an error or a reason detail longer than this is cut (a line stays small)
DAY_S = 86400.0


def _cut(text: str | None) -> str | None:
    return text if text is None or len(text) <= _TEXT_MAX else text[: _TEXT_MAX - 3] + "..."


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One ended task. Times are seconds since the epoch; ``seq`` orders a topic's runs (and pages them)."""

    task_id: str
    topic: str
    state: str  # Succeed, Failed or Cancelled
    reason: str  # a kind of compactord.task.REASON_KINDS
    reason_detail: str
    caller: str | None  # the client address of a manual trigger
    created_at: float
    started_at: float | None
    finished_at: float
    records_read: int
    bytes_read: int
    records_written: int  # entries and deletion markers in the new ledger
    bytes_written: int
    removed: int
    ledger_before: int | None
    ledger_after: int | None  # the ledger current after the run (the one before, if none was written)
    full_rebuild: bool
    recreated: bool  # rebuilt in full because the topic's log is a new one
    skipped: bool  # nothing new since the horizon
    error: str | None
    error_type: str | None
    seq: int = 0
    spilled_bytes: int = 0  # what its reading tasks wrote to local disk (a record from before: 0)
    task_cpu_ratio: float | None = None  # its reading tasks' CPU seconds per wall second (TaskStats)
    storage_requests: dict[str, int] = field(default_factory=dict)  # by operation (TaskStats; before: {})
    member: str | None = None  # in a cluster: the advertised URL of the member that ran it

    @classmethod
    def of_task(cls, ctx: CompactionTaskCtx, final: TaskState) -> RunRecord:
        """The record of ``ctx`` ending in ``final`` (what an end recorder is given)."""
        stats, progress = ctx.stats, ctx.progress
        succeeded = final is TaskState.SUCCEED
        written = stats.records_kept + stats.markers if succeeded and not stats.skipped else 0
        return cls(
            task_id=ctx.task_id, topic=ctx.topic, state=final.value, reason=ctx.reason.kind,
            reason_detail=_cut(ctx.reason.detail) or "", caller=ctx.caller, created_at=ctx.created_at,
            started_at=ctx.started_at, finished_at=ctx.finished_at or time.time(),
            records_read=stats.records_read or progress.records_read,
            bytes_read=stats.bytes_read or progress.bytes_read,
            records_written=written, bytes_written=stats.bytes_written if written else 0,
            removed=stats.removed if succeeded else 0,
            ledger_before=ctx.previous_ledger_id,
            ledger_after=ctx.ledger_id if ctx.ledger_id is not None else ctx.previous_ledger_id,
            full_rebuild=stats.full_rebuild, recreated=stats.recreated, skipped=stats.skipped,
            error=_cut(ctx.error), error_type=ctx.error_type, spilled_bytes=stats.spilled_bytes,
            task_cpu_ratio=stats.task_cpu_ratio, storage_requests=stats.storage_requests.final(),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> RunRecord:
        """:raises ValueError: ``data`` is not a run record."""
        if not isinstance(data, dict):
            raise ValueError(f"a run record is a JSON object, got {type(data).__name__}")
        try:
            record = cls(**{k: v for k, v in data.items() if k in _FIELDS})
        except TypeError as exc:
            raise ValueError(f"not a run record: {exc}") from None
        if not isinstance(record.seq, int) or not isinstance(record.finished_at, int | float):
            raise ValueError("a run record needs an integer seq and a numeric finished_at")
        return record


_FIELDS = frozenset(f.name for f in fields(RunRecord))


@dataclass(frozen=True, slots=True)
class RunPage:
    runs: list[RunRecord]  # newest first
    next: str | None  # the cursor of the next (older) page, None after the last


@dataclass(slots=True)
class _FileState:
    count: int  # valid runs, in the file and as objects
    last_seq: int
    oldest_finished: float | None
    pending: int  # runs recorded as objects of their own


class RunHistory:
    """The run histories of ``objects`` (a root's store), where ``layout.history_prefix`` puts them. Thread-safe,
    each topic's runs recorded one at a time and beside other topics'. A run's object is created, never
    overwritten: on a root a cluster shares, a topic's previous owner may record a late run while its new owner
    records its own, and the one that finds its ``seq`` taken reads the history again and takes the next."""

    def __init__(self, objects: ObjectStore, max_runs: int, max_age_days: float,
                 clock: Callable[[], float] = time.time, ready: Callable[[str], object] = layout.topic_prefix,
                 member: str | None = None) -> None:
        """``ready``: called with a topic before its history is read (``LedgerStore.ready``: the topic is
        recovered first, so that the history of a topic whose deletion a restart interrupted is not served);
        by default, the name's check alone. ``member``: in a cluster, this member's advertised URL, which each
        run it records names."""
        if max_runs < 1 or max_age_days <= 0:
            raise ValueError(f"max_runs must be >= 1 and max_age_days positive, got: {max_runs}, {max_age_days}")
        self.objects = objects
        self.member = member
        self.max_runs = max_runs
        self.max_age_s = max_age_days * DAY_S
        self._clock = clock
        self._ready = ready
        # One lock a topic: a run's record (a put and its fsyncs, and every _PENDING_MAX runs the file written
        # whole) waits only for the runs of its own topic, never for every topic's.
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._files: dict[str, _FileState] = {}
        # The newest run of each topic asked for: status and listing requests read it, not the file.
        self._last: dict[str, RunRecord | None] = {}

    def _lock(self, topic: str) -> threading.Lock:
        """The topic's lock (kept while the process runs: a lock dropped while a thread waits on it would let
        another thread take a second one)."""
        with self._locks_lock:
            lock = self._locks.get(topic)
            if lock is None:
                lock = self._locks[topic] = threading.Lock()
            return lock

    def key(self, topic: str) -> str:
        """The key of the topic's compacted file.

        :raises InvalidTopicName: ``topic`` is not a legal Kafka topic name.
        """
        return layout.history_file_key(topic)

    # -- writing --------------------------------------------------------------------------------

    def append(self, record: RunRecord) -> RunRecord:
        """Record ``record`` durably (its ``seq`` is assigned here) and return it as stored.

        :raises InsufficientDiskSpace: the disk is full. :raises StorageUnavailable: it cannot be written.
        :raises CompactordError: the topic's history objects are not usable (e.g. a folder where its run's
            object goes): that topic's alone.
        """
        topic = record.topic
        with self._lock(topic):
            for _ in range(_SEQ_ATTEMPTS):
                state = self._state(topic)
                stored = replace(record, seq=state.last_seq + 1, member=self.member or record.member)
                key = layout.run_key(topic, stored.seq)
                try:
                    self.objects.put_if_absent(key, _line(stored))
                    break
                except PreconditionFailed:  # another member recorded a run of the topic: read its history again
                    self._files.pop(topic, None)
                if self._state(topic).last_seq < stored.seq:  # what holds that number is no run
                    raise ObjectConflict(f"topic {topic!r}: {self.objects.location(key)} is in the way of its run "
                                         "history's next run, and is not a run; move it away", key=key)
            else:
                raise StorageUnavailable(
                    f"topic {topic!r}: run {record.task_id} not recorded: each of {_SEQ_ATTEMPTS} run numbers tried "
                    f"was taken by another writer of {self.objects.location(layout.history_prefix(topic))}")
            state.count += 1
            state.pending += 1
            state.last_seq = stored.seq
            self._last[topic] = stored
            if state.oldest_finished is None:
                state.oldest_finished = stored.finished_at
            if state.pending >= _PENDING_MAX or self._needs_rewrite(state):
                try:
                    self._compact(topic)
                except (CompactordError, OSError) as exc:  # the run is recorded: compacted at a later run
                    log.error("topic %s: run history %s not compacted (its %d runs are kept as objects of their "
                              "own): %s", topic, self.objects.location(self.key(topic)), state.pending, exc)
        return stored

    def forget(self, topic: str) -> None:
        """Read the topic's history again at its next use (a cluster's member that takes the topic: its previous
        owner recorded runs since)."""
        with self._lock(topic):
            self._files.pop(topic, None)
            self._last.pop(topic, None)

    def delete(self, topic: str) -> None:
        """Remove the topic's history (durably; missing is fine)."""
        prefix = layout.history_prefix(topic)
        with self._lock(topic):
            self._files.pop(topic, None)
            self._last.pop(topic, None)
            self.objects.delete_prefix(prefix)

    def _needs_rewrite(self, state: _FileState) -> bool:
        over = state.count > self.max_runs + max(1, self.max_runs // 10)
        expired = state.oldest_finished is not None and state.oldest_finished < self._clock() - self.max_age_s
        return over or expired

    def _compact(self, topic: str) -> None:
        """Write the file whole with the runs within the bounds, then delete the run objects it now holds."""
        runs, pending = self._read(topic)
        kept = self._bounded(runs)
        self.objects.put(self.key(topic), b"".join(_line(r) for r in kept))
        self.objects.delete_many(pending)
        state = self._files[topic]
        state.count, state.pending = len(kept), 0
        state.oldest_finished = kept[0].finished_at if kept else None

    def _state(self, topic: str) -> _FileState:
        state = self._files.get(topic)
        if state is None:
            runs, pending = self._read(topic)
            state = _FileState(len(runs), max((r.seq for r in runs), default=0),
                               runs[0].finished_at if runs else None, len(pending))
            self._files[topic] = state
        return state

    # -- reading --------------------------------------------------------------------------------

    def _read(self, topic: str) -> tuple[list[RunRecord], list[str]]:
        """Every readable run of the topic, each ``seq`` once, oldest first (a torn or edited line is skipped),
        and the keys of the run objects not compacted yet."""
        key = self.key(topic)
        try:
            data = self.objects.get(key)
        except ObjectNotFound:
            data = b""
        found: dict[int, RunRecord] = {}
        for number, line in enumerate(data.split(b"\n"), 1):
            self._parse(line, f"{self.objects.location(key)}: line {number}", found)
        prefix = layout.history_prefix(topic)
        pending = [info.key for info in self.objects.list(prefix) if layout.RUN_RE.fullmatch(info.key[len(prefix):])]
        for run_key in pending:
            try:
                self._parse(self.objects.get(run_key), self.objects.location(run_key), found)
            except ObjectNotFound:
                continue  # removed by hand since the listing
        return [found[seq] for seq in sorted(found)], pending

    @staticmethod
    def _parse(line: bytes, where: str, found: dict[int, RunRecord]) -> None:
        if not line.strip():
            return
        try:
            record = RunRecord.from_json(json.loads(line))
        except ValueError as exc:  # json's errors are ValueErrors too
            log.warning("run history %s skipped (%s)", where, exc)
            return
        found[record.seq] = record

    def _bounded(self, runs: list[RunRecord]) -> list[RunRecord]:
        since = self._clock() - self.max_age_s
        return [r for r in runs if r.finished_at >= since][-self.max_runs:]

    def runs(self, topic: str) -> list[RunRecord]:
        """The topic's runs within the bounds, newest first."""
        self.key(topic)
        self._ready(topic)
        with self._lock(topic):
            return list(reversed(self._bounded(self._read(topic)[0])))

    def last(self, topic: str) -> RunRecord | None:
        """The topic's newest run within the bounds (read from the file once, then kept in memory)."""
        self.key(topic)
        self._ready(topic)
        with self._lock(topic):
            if topic not in self._last:
                runs = self._bounded(self._read(topic)[0])
                self._last[topic] = runs[-1] if runs else None
            last = self._last[topic]
        return last if last is not None and last.finished_at >= self._clock() - self.max_age_s else None

    def page(self, topic: str, limit: int, cursor: str | None = None) -> RunPage:
        """Up to ``limit`` runs, newest first, older than ``cursor`` (the ``next`` of the page before).

        :raises InvalidArgument: ``limit`` is not from 1 to 1000, or ``cursor`` is not a page's ``next``.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise InvalidArgument(f"limit must be a whole number from 1 to 1000, got: {limit!r}")
        before = None
        if cursor is not None:
            if not (cursor.isascii() and cursor.isdigit() and len(cursor) <= 18):
                raise InvalidArgument(f"cursor must be the 'next' value of a previous page, got: {cursor[:40]!r}")
            before = int(cursor)
        runs = [r for r in self.runs(topic) if before is None or r.seq < before]
        page = runs[:limit]
        return RunPage(page, str(page[-1].seq) if len(runs) > limit else None)


MAX_UNRECORDED_RUNS = 1000  # runs that ended while the store was down, kept until it answers


class UnrecordedRuns:
    """The runs that ended while the store was down, oldest first, waiting to enter the history once it answers
    (``record``). Bounded: past ``limit`` the oldest is dropped, and named in the log. Thread-safe: the store's
    prober and a task's end both record them."""

    def __init__(self, limit: int = MAX_UNRECORDED_RUNS) -> None:
        self._runs: list[RunRecord] = []
        self._limit = limit
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._runs)

    def add(self, run: RunRecord) -> None:
        with self._lock:
            self._runs.append(run)
            if len(self._runs) > self._limit:
                lost = self._runs.pop(0)
                log.error("topic %s: run %s is not recorded in the run history: more than %d runs ended while "
                          "the store was down", lost.topic, lost.task_id, self._limit)

    def record(self, append: Callable[[RunRecord], object]) -> None:
        """``append`` each to the history, oldest first, each let go of once appended; one that fails for its
        topic's objects alone (not ``StorageUnavailable``) is named in the log and let go of, so that it never
        holds back the runs of other topics.

        :raises StorageUnavailable: the store failed again (the rest are kept)."""
        with self._lock:
            while self._runs:
                run = self._runs[0]
                try:
                    append(run)
                except StorageUnavailable:
                    raise
                except (CompactordError, OSError) as exc:
                    log.error("topic %s: run %s not recorded in the run history: %s", run.topic, run.task_id, exc)
                self._runs.pop(0)

    def give_up(self, why: str) -> None:
        """The daemon stops with runs still waiting: name them in the log (they were kept in memory only)."""
        with self._lock:
            if self._runs:
                log.error("the run history lacks %d runs that ended while the store was down (%s): %s",
                          len(self._runs), ", ".join(f"{r.topic}/{r.task_id}" for r in self._runs), why)
                self._runs.clear()


def _line(record: RunRecord) -> bytes:
    return json.dumps(record.to_json(), separators=(",", ":")).encode() + b"\n"
