"""What a compaction task says of itself besides its state: why it runs (``Reason``), how far it has read
(``Progress``, live) and what its run did (``TaskStats``). ``compactord.task`` re-exports them with the
state machine that carries them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from compactord.model import PartitionOffsets

__all__ = ["REASON_KINDS", "LogSeen", "Progress", "Reason", "RequestCounts", "TaskStats", "count_request",
           "counting_requests"]


#: Why a task runs (``Reason.kind``): a fixed set, so that it can label a metric.
REASON_KINDS = (
    "manual",  # PUT .../compaction
    "rebuild",  # PUT .../compaction?rebuild=true
    "backlog_bytes",  # the monitor's triggers, one kind each
    "backlog_records",
    "max_lag",
    "dirty_ratio",
    "log_start",  # the log start moved past ledger entries (retention)
    "recreated",  # the topic's log is a new one
    "preview",  # GET .../compaction/preview?exact=true: not a run, never in the history
)


@dataclass(frozen=True, slots=True)
class Reason:
    """Why a task runs: ``kind`` (one of ``REASON_KINDS``) and ``detail``, the values that fired it
    (``"backlog 104857600 bytes > threshold 52428800"``)."""

    kind: str
    detail: str = ""

    def __post_init__(self) -> None:
        if self.kind not in REASON_KINDS:
            raise ValueError(f"reason kind must be one of {', '.join(REASON_KINDS)}, got: {self.kind!r}")

    @classmethod
    def combine(cls, fired: list[Reason]) -> Reason:
        """One reason for several that fired at once: the first one's kind, every detail."""
        if not fired:
            raise ValueError("combine needs at least one reason")
        return cls(fired[0].kind, "; ".join(r.detail for r in fired if r.detail))


class RequestCounts:
    """Requests to the ledger root's store, by operation (``list``, ``get``, ``put``, ...), counted as they are
    made: thread-safe, and readable while a run still counts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._final = False

    def __repr__(self) -> str:
        return f"RequestCounts({self.snapshot()})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RequestCounts) and self.snapshot() == other.snapshot()

    def add(self, op: str) -> None:
        with self._lock:
            if not self._final:
                self._counts[op] = self._counts.get(op, 0) + 1

    def add_counts(self, counts: Mapping[str, int]) -> None:
        """Add counts made elsewhere (the reading tasks', from their reports)."""
        with self._lock:
            if not self._final:
                for op, n in counts.items():
                    self._counts[op] = self._counts.get(op, 0) + n

    def final(self) -> dict[str, int]:
        """The counts, fixed from now on: what the run's thread does after its end (writing its history
        record) is not the run's."""
        with self._lock:
            self._final = True
        return self.snapshot()

    def snapshot(self) -> dict[str, int]:
        """The counts so far, by operation in name order."""
        with self._lock:
            return dict(sorted(self._counts.items()))


# The counts of the run whose thread makes a request; None outside a run (the API's reads, the monitor).
_COUNTING: ContextVar[RequestCounts | None] = ContextVar("compactord_run_requests", default=None)


@contextlib.contextmanager
def counting_requests(counts: RequestCounts) -> Iterator[None]:
    """Within the block, the store requests made on this thread (``count_request``) are added to ``counts``."""
    token = _COUNTING.set(counts)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # a generator's block closed in another context: nothing set there
            _COUNTING.reset(token)


def count_request(op: str) -> None:
    """One request of ``op`` to the store (the store's observer calls it): counted for the run that made it."""
    counts = _COUNTING.get()
    if counts is not None:
        counts.add(op)


@dataclass(frozen=True, slots=True)
class LogSeen:
    """What the broker told a run of its topic's log when the run fixed its offsets: the topic id, each
    partition's offsets, and when it was asked (UTC seconds, before the answer). The daemon keeps it as the
    topic's broker view at the run's end instead of asking the broker again."""

    topic_id: str | None
    offsets: Mapping[int, PartitionOffsets]
    asked_at: float


@dataclass(slots=True)
class TaskStats:
    """What a task's run did (for metrics, the status and the monitor's size estimate).

    ``skipped``: nothing new since the horizon, no ledger was written.
    """

    records_read: int = 0  # ledger rows + tail records
    records_kept: int = 0  # live entries in the new ledger
    markers: int = 0  # event-time deletion markers in the new ledger
    removed: int = 0
    bytes_read: int = 0  # key and value bytes read from Kafka
    bytes_written: int = 0
    spilled_bytes: int = 0  # what the reading tasks wrote to local disk (windows past their memory budget)
    # The reading tasks' CPU seconds (their workers' threads) and wall seconds from their first fetch, summed.
    task_cpu_seconds: float = 0.0
    task_wall_seconds: float = 0.0
    tail_records: int = 0
    ledger_rows_read: int = 0
    full_rebuild: bool = False
    skipped: bool = False
    recreated: bool = False  # rebuilt in full because the topic's log is a new one
    early_tasks: bool = False  # read by reading tasks launched while the run was planned (``engine.early_start``)
    in_driver: bool = False  # a small run's reading task run in the driver, without a Spark job (``engine.run``)
    switch_warning: str | None = None  # the switch committed, then a step after it failed
    # The requests the run made to an object store's root, by operation: the driver's, and those the reading
    # tasks report (a local root's are not counted).
    storage_requests: RequestCounts = field(default_factory=RequestCounts)
    log_seen: LogSeen | None = None  # the broker's answer the run was planned on (None: not planned)

    @property
    def task_cpu_ratio(self) -> float | None:
        """The reading tasks' CPU seconds per wall second: near 1 when each had a core to itself, far below
        when they waited for one (Spark given more slots than cores, other jobs on the cores) or for the
        broker; None when no task read."""
        return round(self.task_cpu_seconds / self.task_wall_seconds, 3) if self.task_wall_seconds > 0 else None


@dataclass(slots=True)
class Progress:
    """How far a run has read, followed while it reads. Once the task has ended it no longer changes
    (``CompactionTaskCtx.follow_progress``): its status, a cancel's answer and its history record give
    one count."""

    records_read: int = 0
    bytes_read: int = 0
    records_total: int = 0
    max_read_bytes_per_second: int = 0  # the run's read budget (0: unlimited)
    read_tasks: int = 0  # reading tasks at once that share the budget (0: not throttled)
    read_started_at: float | None = None  # when the first reading task started
    read_ended_at: float | None = None  # when the last reading task that ended read its last record
    throttled_seconds: float = 0.0  # the reading tasks' waits for the budget, summed

    def timeout_allowance(self, limit: float) -> float:
        """A task's time limit: ``limit``, plus for a throttled run the least time its budget needs for
        what it has read so far (so that a slow budget does not time a steady run out)."""
        if self.max_read_bytes_per_second <= 0:
            return limit
        return limit + self.bytes_read / self.max_read_bytes_per_second
