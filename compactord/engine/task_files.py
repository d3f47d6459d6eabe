"""The files through which a run's driver and its reading tasks talk, in the run's progress folder (on the
ledger root, which a cluster's executors share; the tasks run in other processes, on other machines):

- ``<partition>-<start>.json``: a reading task's progress (records, bytes, the last data record's
  fingerprint, its times), replaced whole (``TaskFiles.report``); the driver sums them
  (``read_progress``);
- ``CANCEL``: the run was cancelled; every task stops at its next check (``TaskFiles.cancelled``);
- ``RATE``: a throttled run's share of the read budget per task, raised by the driver as tasks end
  (``write_rate``, ``throttle.running_share``); the tasks read it with their cancel checks.
- ``PLAN``: the spec of tasks launched before their run was planned (``early_start``), or that they are not
  needed, written once, by the driver or by tasks that stopped waiting (``write_plan``, ``wait_for_plan``).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compactord.model import RecordFingerprint

__all__ = ["CANCEL_FILE", "PLAN_FILE", "RATE_FILE", "TailRead", "TaskFiles", "cancel", "read_progress", "wait_for_plan",
           "write_plan", "write_rate"]

CANCEL_FILE = "CANCEL"
RATE_FILE = "RATE"
PLAN_FILE = "PLAN"
# How often a task waiting for its plan looks: every millisecond at first (planning takes ~20 ms), then
# every 20 ms (a plan that takes long waits on the broker).
_PLAN_LOOKS_S = (0.001, 0.02)
_PLAN_FAST_LOOKS_FOR_S = 0.5


@dataclass(frozen=True, slots=True)
class TailRead:
    """What the Kafka readers report they read (their progress files, summed)."""

    records: int = 0
    bytes: int = 0
    last: dict[int, RecordFingerprint] = field(default_factory=dict)  # per partition, the last data record
    started_at: float | None = None  # when the first reading task started (epoch seconds)
    throttled_seconds: float = 0.0  # the reading tasks' waits for the read budget, summed
    ended: int = 0  # reading tasks that have ended
    ended_at: float | None = None  # when the last of those read its last record (epoch seconds)
    spilled_bytes: int = 0  # what the reading tasks wrote to local disk (windows past their memory budget)
    cpu_seconds: float = 0.0  # the reading tasks' CPU time (their workers' threads), summed
    wall_seconds: float = 0.0  # the reading tasks' wall time from their first fetch, summed

    @property
    def cpu_ratio(self) -> float | None:
        """The reading tasks' CPU seconds per wall second (None before any task read): near 1 when each had a
        core; far below 1 when they waited for one (more slots than cores) or for the broker."""
        return self.cpu_seconds / self.wall_seconds if self.wall_seconds > 0 else None


def read_progress(progress_dir: Path) -> TailRead:
    """The readers' progress files, summed (a file being replaced right now is skipped)."""
    records = size = ended = spilled = 0
    throttled = cpu = wall = 0.0
    started: list[float] = []
    ended_at: list[float] = []
    last: dict[int, RecordFingerprint] = {}
    try:
        paths = list(progress_dir.glob("*.json"))
    except OSError:
        return TailRead()
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        records += int(data.get("records", 0))
        size += int(data.get("bytes", 0))
        throttled += float(data.get("throttled_seconds", 0.0))
        spilled += int(data.get("spilled_bytes", 0))
        cpu += float(data.get("cpu_seconds", 0.0))
        wall += float(data.get("wall_seconds", 0.0))
        if data.get("started_at") is not None:
            started.append(float(data["started_at"]))
        if data.get("done"):
            ended += 1
            if data.get("read_ended_at") is not None:
                ended_at.append(float(data["read_ended_at"]))
        if data.get("last") is not None:
            found = RecordFingerprint.from_json(data["last"])
            partition = int(data["partition"])
            if partition not in last or found.offset > last[partition].offset:
                last[partition] = found
    return TailRead(records, size, last, min(started, default=None), throttled, ended, max(ended_at, default=None),
                    spilled, cpu, wall)


def cancel(progress_dir: Path) -> None:
    """Stop the run's reading tasks at their next check (a folder already removed: the run ended)."""
    with contextlib.suppress(OSError):
        (progress_dir / CANCEL_FILE).touch()


def write_rate(progress_dir: Path, rate: float) -> None:
    """Give each reading task ``rate`` bytes per second from its next check (a folder already removed: the
    job ended)."""
    tmp = progress_dir / f"{RATE_FILE}.tmp"
    try:
        tmp.write_text(repr(rate))
        os.replace(tmp, progress_dir / RATE_FILE)
    except OSError:
        pass


def write_plan(progress_dir: Path, spec: dict[str, Any] | None) -> bool:
    """Hand the waiting tasks their spec (None: they are not needed, and end without reading). False when they
    had stopped waiting (``wait_for_plan``): the first plan written is the one every task follows."""
    return _write_once(progress_dir, {"spec": spec})


def wait_for_plan(progress_dir: Path, limit_s: float) -> dict[str, Any] | None:
    """The spec ``write_plan`` wrote, once it is there; None when the tasks are not needed, or when no plan
    came within ``limit_s`` (the tasks then stop waiting, and the driver's ``write_plan`` fails: waiting tasks
    hold Spark's cores, which another topic's job may need).

    :raises RuntimeError: the run was cancelled.
    """
    path, started = progress_dir / PLAN_FILE, time.monotonic()
    while True:
        try:
            return json.loads(path.read_text())["spec"]  # type: ignore[no-any-return]
        except FileNotFoundError:
            pass
        if (progress_dir / CANCEL_FILE).exists() or not progress_dir.exists():
            raise RuntimeError("compaction cancelled before its reading tasks were given their ranges")
        waited = time.monotonic() - started
        if waited > limit_s:
            _write_once(progress_dir, {"spec": None, "waited_s": round(waited, 3)})
        else:
            time.sleep(_PLAN_LOOKS_S[waited > _PLAN_FAST_LOOKS_FOR_S])


def _write_once(progress_dir: Path, plan: dict[str, Any]) -> bool:
    """Write the PLAN file unless it exists (a link fails on an existing name: one writer wins)."""
    tmp = progress_dir / f"{PLAN_FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
    tmp.write_text(json.dumps(plan))
    try:
        os.link(tmp, progress_dir / PLAN_FILE)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


class TaskFiles:
    """A reading task's side of the folder (``progress_dir`` None: a task that reports nothing, e.g. the
    warm-up's)."""

    def __init__(self, progress_dir: Path | None, partition: int, start: int) -> None:
        self.progress_dir = progress_dir
        self._report_path = progress_dir / f"{partition}-{start}.json" if progress_dir is not None else None
        self._rate_seen: int | None = None  # the RATE file's mtime last read

    def cancelled(self) -> bool:
        return self.progress_dir is not None and (self.progress_dir / CANCEL_FILE).exists()

    def new_rate(self) -> float | None:
        """The share the driver wrote last, if it wrote one since the last call (None otherwise)."""
        if self.progress_dir is None:
            return None
        path = self.progress_dir / RATE_FILE
        try:
            seen = path.stat().st_mtime_ns
            if seen == self._rate_seen:
                return None
            self._rate_seen = seen
            rate = float(path.read_text())
        except (OSError, ValueError):
            return None  # none yet, or being replaced: the next check reads it
        return rate if rate > 0 else None

    def report(self, report: dict[str, Any]) -> None:
        """Replace the task's progress file with ``report`` (a removed folder: the run ended, cancelled)."""
        if self._report_path is None:
            return
        tmp = self._report_path.with_suffix(f".{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(report))
            os.replace(tmp, self._report_path)
        except FileNotFoundError:
            pass  # the progress dir was removed: the task ended (cancelled) and cleaned up
