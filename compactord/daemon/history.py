"""The run history: every ended task of a topic, kept on the ledger root across restarts.

Layout (outside the topic folders, so that the ledger layout of ``ledger/store.py`` is unchanged; ``@``
is illegal in topic names, so no topic is ever mistaken for it)::

    <root>/@compactord/history/<topic>.jsonl   one JSON object a line, oldest first

A run is appended, and the file fsynced (its folder too when the file is new), before the task's end
is visible (``CompactionTaskCtx.add_end_recorder``): a caller who saw the end finds the run here, also
after a crash. A crash in the middle of an append leaves a torn last line: reads skip it and the next
append starts on a line of its own.

Bounded per topic: ``compactionHistoryMaxRuns`` runs, none older than ``compactionHistoryMaxAgeDays``.
Reads apply both bounds; the file is rewritten (atomically) once it holds a tenth more runs than the
bound, or its oldest run has expired, so that an append stays one small write.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from compactord.errors import InvalidArgument
from compactord.ledger.files import disk_errors, fsync_path, remove_path, write_atomic
from compactord.model import validate_topic_name
from compactord.task import CompactionTaskCtx, TaskState

__all__ = ["RunHistory", "RunPage", "RunRecord"]

log = logging.getLogger(__name__)

SUFFIX = ".jsonl"
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
            task_cpu_ratio=stats.task_cpu_ratio,
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
    count: int  # valid runs in the file
    last_seq: int
    oldest_finished: float | None


class RunHistory:
    """The run histories under one folder. Thread-safe; one writer process (the root's lock holder)."""

    def __init__(self, folder: Path, max_runs: int, max_age_days: float,
                 clock: Callable[[], float] = time.time) -> None:
        if max_runs < 1 or max_age_days <= 0:
            raise ValueError(f"max_runs must be >= 1 and max_age_days positive, got: {max_runs}, {max_age_days}")
        self.folder = Path(folder)
        self.max_runs = max_runs
        self.max_age_s = max_age_days * DAY_S
        self._clock = clock
        self._lock = threading.Lock()
        self._files: dict[str, _FileState] = {}
        # The newest run of each topic asked for: status and listing requests read it, not the file.
        self._last: dict[str, RunRecord | None] = {}

    def path(self, topic: str) -> Path:
        """:raises InvalidTopicName: ``topic`` is not a legal Kafka topic name."""
        return self.folder / (validate_topic_name(topic) + SUFFIX)

    # -- writing --------------------------------------------------------------------------------

    def append(self, record: RunRecord) -> RunRecord:
        """Append ``record`` durably (its ``seq`` is assigned here) and return it as stored.

        :raises InsufficientDiskSpace: the disk is full. :raises OSError: it cannot be written.
        """
        path = self.path(record.topic)
        with self._lock, disk_errors(f"recording run {record.task_id} of topic {record.topic!r}"):
            state = self._state(record.topic, path)
            stored = replace(record, seq=state.last_seq + 1)
            line = json.dumps(stored.to_json(), separators=(",", ":")).encode() + b"\n"
            if not self.folder.is_dir():
                self.folder.mkdir(parents=True, exist_ok=True)
                fsync_path(self.folder.parent)
            created = not path.exists()
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    line = b"\n" + line  # a crash tore the last line: start on a line of our own
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:
                fsync_path(self.folder)
            state.count += 1
            state.last_seq = stored.seq
            self._last[record.topic] = stored
            if state.oldest_finished is None:
                state.oldest_finished = stored.finished_at
            if self._needs_rewrite(state):
                self._rewrite(record.topic, path)
        return stored

    def delete(self, topic: str) -> None:
        """Remove the topic's history (durably; missing is fine)."""
        path = self.path(topic)
        with self._lock:
            self._files.pop(topic, None)
            self._last.pop(topic, None)
            remove_path(path)

    def _needs_rewrite(self, state: _FileState) -> bool:
        over = state.count > self.max_runs + max(1, self.max_runs // 10)
        expired = state.oldest_finished is not None and state.oldest_finished < self._clock() - self.max_age_s
        return over or expired

    def _rewrite(self, topic: str, path: Path) -> None:
        kept = self._bounded(self._read(path))
        write_atomic(path, b"".join(json.dumps(r.to_json(), separators=(",", ":")).encode() + b"\n" for r in kept))
        state = self._files[topic]
        state.count = len(kept)
        state.oldest_finished = kept[0].finished_at if kept else None

    def _state(self, topic: str, path: Path) -> _FileState:
        state = self._files.get(topic)
        if state is None:
            runs = self._read(path)
            state = _FileState(len(runs), max((r.seq for r in runs), default=0),
                               runs[0].finished_at if runs else None)
            self._files[topic] = state
        return state

    # -- reading --------------------------------------------------------------------------------

    def _read(self, path: Path) -> list[RunRecord]:
        """Every readable run of the file, oldest first (a torn or edited line is skipped)."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []
        runs: list[RunRecord] = []
        for number, line in enumerate(data.split(b"\n"), 1):
            if not line.strip():
                continue
            try:
                runs.append(RunRecord.from_json(json.loads(line)))
            except ValueError as exc:  # json's errors are ValueErrors too
                log.warning("run history %s: line %d skipped (%s)", path, number, exc)
        return runs

    def _bounded(self, runs: list[RunRecord]) -> list[RunRecord]:
        since = self._clock() - self.max_age_s
        return [r for r in runs if r.finished_at >= since][-self.max_runs:]

    def runs(self, topic: str) -> list[RunRecord]:
        """The topic's runs within the bounds, newest first."""
        path = self.path(topic)
        with self._lock:
            return list(reversed(self._bounded(self._read(path))))

    def last(self, topic: str) -> RunRecord | None:
        """The topic's newest run within the bounds (read from the file once, then kept in memory)."""
        path = self.path(topic)
        with self._lock:
            if topic not in self._last:
                runs = self._bounded(self._read(path))
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
