"""The task registry: one live task per topic, the slots that bound concurrent compactions, history.

A triggered task starts in Pending and waits for one of ``compactionMaxConcurrentTasks`` slots.
Waiting tasks start biggest backlog first, except that one that has waited longer than two monitor
intervals goes first. A task planned as a small run, read in the driver without a Spark job
(``compactionDriverRunMaxRecords``), or likely to be one (its current ledger is that small: it leaves
before it is planned), leaves its slot for one of ``DRIVER_RUNS_AT_ONCE`` of its own, if one is free: its
waits (the broker, fsyncs) then overlap the next tasks' work. A run that left its slot and then needs a Spark
job waits for a slot again, before any waiting task (``take_slot``). A slot is freed on the thread that ends
the task's work. The last 20 tasks of every topic are kept in memory.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from compactord.errors import CompactionAlreadyRunning, NoTaskRunning, TaskNotCancellable
from compactord.interfaces import CompactionServiceFactory, TopicCompactionService
from compactord.model import validate_topic_name
from compactord.task import CompactionTaskCtx, EndRecorder, Reason, TaskState

__all__ = ["CancelOutcome", "TaskRegistry"]

log = logging.getLogger(__name__)
HISTORY = 20
# Small runs read in the driver at once, besides compactionMaxConcurrentTasks: their work is mostly waits for
# the broker and for fsyncs, which overlap (docs/performance.md, "Small topics").
DRIVER_RUNS_AT_ONCE = 4
PRUNE_AT = 64


@dataclass
class _Waiting:
    ctx: CompactionTaskCtx
    backlog: float
    queued_at: float


@dataclass(frozen=True)
class CancelOutcome:
    task: CompactionTaskCtx
    stopped: bool  # the work has ended (else it is still stopping in the background)


class _Overdue:
    """Tasks that ended while their work went on, each freed by ``release`` if its work has not ended within
    its bound: one thread for them all, started with the first."""

    def __init__(self, release: Callable[[CompactionTaskCtx], None]) -> None:
        self._release = release
        self._due: list[tuple[float, int, CompactionTaskCtx]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, ctx: CompactionTaskCtx, after_s: float) -> None:
        with self._cond:
            if len(self._due) >= PRUNE_AT:  # most tasks' work ends at once: theirs is not watched any longer
                self._due = [d for d in self._due if not d[2].worker_done.is_set()]
                heapq.heapify(self._due)
            heapq.heappush(self._due, (time.monotonic() + after_s, next(self._seq), ctx))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="task-slots", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._cond.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _at, _seq, ctx = heapq.heappop(self._due)
            if not ctx.worker_done.is_set():
                self._release(ctx)


class TaskRegistry:
    """Triggers, slots, cancel and history. Thread-safe."""

    def __init__(
        self,
        factory: CompactionServiceFactory,
        max_concurrent: int,
        monitor_interval_s: float,
        on_end: Callable[[CompactionTaskCtx], None] | None = None,
        release_after_s: float = 600.0,
        recorder: EndRecorder | None = None,
    ) -> None:
        """``recorder``: called as each task ends, before its end is visible (``add_end_recorder``)."""
        self._factory = factory
        self._recorder = recorder
        self._release_after = release_after_s
        self._max = max_concurrent
        self._starve_after = 2 * monitor_interval_s
        self._on_end = on_end
        self._lock = threading.RLock()
        self._live: dict[str, CompactionTaskCtx] = {}
        self._waiting: list[_Waiting] = []
        self._running: set[str] = set()  # task ids holding a slot
        self._driver_runs: set[str] = set()  # task ids of small runs that left their slot (``leave_slot``)
        self._taking: list[tuple[CompactionTaskCtx, threading.Event]] = []  # driver runs waiting for a slot again
        self._history: dict[str, collections.deque[CompactionTaskCtx]] = {}
        self._closed = False
        self._overdue = _Overdue(lambda ctx: self._release(ctx, overdue=True))

    def service(self, topic: str) -> TopicCompactionService:
        return self._factory.new_topic_compaction_service(validate_topic_name(topic))

    def existing_service(self, topic: str) -> TopicCompactionService | None:
        """The topic's service if it has any state (a ledger, a task), else None; creates nothing."""
        return self._factory.existing_topic_compaction_service(validate_topic_name(topic))

    # -- trigger and slots ----------------------------------------------------------------------

    def trigger(self, topic: str, *, rebuild: bool = False, backlog: float = 0.0, reason: Reason | None = None,
                caller: str | None = None, kind: str = "compaction") -> CompactionTaskCtx:
        """Queue a compaction of ``topic`` (or, ``kind="preview"``, an exact preview, which takes a slot
        and is the topic's live task the same way); it starts when a slot is free. ``reason``: why
        (default manual, or rebuild; a preview's is "preview"); ``caller``: the client address of a
        manual trigger. A preview is not a run: it is not recorded in the run history.

        :raises CompactionAlreadyRunning: the topic has a live task (it is attached to the error).
        """
        service = self.service(topic)
        with self._lock:
            if self._closed:
                raise CompactionAlreadyRunning(topic)  # shutting down: nothing new starts
            live = self._live.get(topic)
            if live is not None and not live.done:
                raise CompactionAlreadyRunning(topic, live)
            ctx = service.compact(rebuild=rebuild, start=False, **({} if kind == "compaction" else {"kind": kind}))
            default = Reason("rebuild" if rebuild else "manual") if kind == "compaction" else Reason(kind)
            ctx.set_reason(reason or default, caller)
            if self._recorder is not None and kind == "compaction":
                ctx.add_end_recorder(self._recorder)
            ctx.add_listener(self._on_state)
            self._live[topic] = ctx
            self._history.setdefault(topic, collections.deque(maxlen=HISTORY)).append(ctx)
            self._waiting.append(_Waiting(ctx, backlog, time.monotonic()))
        log.info("task %s of topic %s queued (reason %s)", ctx.task_id, topic, ctx.reason.kind)
        self._dispatch()
        return ctx

    def _next_waiting(self) -> _Waiting | None:
        if not self._waiting:
            return None
        now = time.monotonic()
        starved = [w for w in self._waiting if now - w.queued_at > self._starve_after]
        if starved:
            return min(starved, key=lambda w: w.queued_at)
        return max(self._waiting, key=lambda w: (w.backlog, -w.queued_at))

    def _dispatch(self) -> None:
        to_start: list[CompactionTaskCtx] = []
        with self._lock:
            self._waiting = [w for w in self._waiting if not w.ctx.done]
            while self._taking and len(self._running) < self._max:  # driver runs taking a slot back go first
                ctx, given = self._taking.pop(0)
                self._driver_runs.discard(ctx.task_id)
                self._running.add(ctx.task_id)
                given.set()
            while len(self._running) < self._max and not self._closed:
                nxt = self._next_waiting()
                if nxt is None:
                    break
                self._waiting.remove(nxt)
                self._running.add(nxt.ctx.task_id)
                nxt.ctx.set_slot_hook(self._leave_slot, self._take_slot)
                to_start.append(nxt.ctx)
        for ctx in to_start:
            try:
                ctx.start()
            except Exception as exc:  # noqa: BLE001 (cancelled between dispatch and start, or the start failed)
                log.info("task %s of topic %s did not start: %s", ctx.task_id, ctx.topic, exc)
                with self._lock:
                    self._running.discard(ctx.task_id)

    def _leave_slot(self, ctx: CompactionTaskCtx) -> bool:
        """A small run read in the driver: it takes a driver run's place, if one is free, and its slot goes to
        the next waiting task. Whether it did."""
        with self._lock:
            if ctx.task_id not in self._running or len(self._driver_runs) >= DRIVER_RUNS_AT_ONCE:
                return False
            self._running.discard(ctx.task_id)
            self._driver_runs.add(ctx.task_id)
        self._dispatch()
        return True

    def _take_slot(self, ctx: CompactionTaskCtx) -> threading.Event | None:
        """A run that left its slot before it was planned, and needs a Spark job after all: the event set when
        a slot is its again, before any waiting task's; None when it kept its slot."""
        given = threading.Event()
        with self._lock:
            if ctx.task_id not in self._driver_runs:
                return None
            self._taking.append((ctx, given))
        self._dispatch()
        return given

    def _on_state(self, ctx: CompactionTaskCtx, old: TaskState, new: TaskState) -> None:
        if not new.terminal:
            return
        if self._on_end is not None:
            self._on_end(ctx)
        # Free the task's slot once its work has ended, not when its state did: a cancelled task is Cancelled
        # at once while its Spark work may still be stopping, and a new task must not run beside it beyond
        # ``compactionMaxConcurrentTasks``. Freed on the thread that ends the work; work that never ends is
        # not waited for forever (``_Overdue``).
        ctx.worker_done.when_set(lambda: self._release(ctx))
        if not ctx.worker_done.is_set():
            self._overdue.watch(ctx, self._release_after)

    def _release(self, ctx: CompactionTaskCtx, *, overdue: bool = False) -> None:
        with self._lock:
            held = ctx.task_id in self._running or ctx.task_id in self._driver_runs
            self._taking = [t for t in self._taking if t[0] is not ctx]
            self._running.discard(ctx.task_id)
            self._driver_runs.discard(ctx.task_id)
        if overdue and held:
            log.warning("task %s of topic %s ended %ds ago but its work has not stopped; its slot is freed",
                        ctx.task_id, ctx.topic, self._release_after)
        self._dispatch()

    def kick(self) -> None:
        """Re-run the dispatch (e.g. after waiting tasks aged past the starvation bound)."""
        self._dispatch()

    # -- inspection -----------------------------------------------------------------------------

    def live(self, topic: str) -> CompactionTaskCtx | None:
        ctx = self._live.get(topic)
        return ctx if ctx is not None and not ctx.done else None

    def last(self, topic: str) -> CompactionTaskCtx | None:
        """The topic's last compaction task (previews are not compactions)."""
        history = self._history.get(topic)
        return next((t for t in reversed(history) if t.kind == "compaction"), None) if history else None

    def history(self, topic: str) -> list[CompactionTaskCtx]:
        return list(self._history.get(topic, ()))

    def tasks(self) -> list[CompactionTaskCtx]:
        with self._lock:
            return sorted((t for h in self._history.values() for t in h), key=lambda t: t.created_at)

    def running_count(self) -> int:
        with self._lock:
            return len(self._running) + len(self._driver_runs)

    def pending_count(self) -> int:
        with self._lock:
            return sum(1 for w in self._waiting if not w.ctx.done)

    def recent_failures(self, topic: str) -> int:
        """How many of the topic's last compactions failed in a row (cancellations do not count)."""
        count = 0
        for ctx in reversed(self.history(topic)):
            if ctx.kind != "compaction":
                continue
            if ctx.state is TaskState.FAILED:
                count += 1
            elif ctx.state is TaskState.SUCCEED:
                break
        return count

    def forget(self, topic: str) -> None:
        """Drop a deleted topic's history."""
        with self._lock:
            self._history.pop(topic, None)
            if topic in self._live and self._live[topic].done:
                del self._live[topic]

    # -- cancel ---------------------------------------------------------------------------------

    def cancel(self, topic: str, timeout: float, reason: str = "cancelled by request") -> CancelOutcome:
        """Cancel the topic's live task and wait up to ``timeout`` for its work to end.

        :raises NoTaskRunning: the topic has no live task.
        :raises TaskNotCancellable: the task is switching ledgers.
        """
        ctx = self.live(topic)
        if ctx is None:
            raise NoTaskRunning(topic)
        try:
            ctx.cancel(reason)
        except TaskNotCancellable:
            if ctx.done:  # it ended between the look-up and the cancel
                return CancelOutcome(ctx, ctx.worker_done.is_set())
            raise
        self._dispatch()
        return CancelOutcome(ctx, ctx.worker_done.wait(timeout))

    def stop_topic(self, topic: str, timeout: float) -> CancelOutcome | None:
        """Cancel a cancellable task or wait for a switching one, within ``timeout``; None if idle."""
        ctx = self.live(topic)
        if ctx is None:
            return None
        deadline = time.monotonic() + timeout
        try:
            ctx.cancel("the topic was unloaded or deleted")
        except TaskNotCancellable:
            pass  # switching: it completes or fails on its own, never half-way
        ctx.wait(max(0.0, deadline - time.monotonic()))
        stopped = ctx.worker_done.wait(max(0.0, deadline - time.monotonic()))
        return CancelOutcome(ctx, stopped)

    def shutdown(self, timeout: float) -> None:
        """SIGTERM: cancel what can be cancelled, let a switching task finish."""
        with self._lock:
            self._closed = True
            live = [t for t in self._live.values() if not t.done]
        for ctx in live:
            try:
                ctx.cancel("the daemon is shutting down")
            except TaskNotCancellable:
                log.info("waiting for task %s of topic %s to finish its ledger switch", ctx.task_id, ctx.topic)
        deadline = time.monotonic() + timeout
        for ctx in live:
            ctx.wait(max(0.0, deadline - time.monotonic()))
            # A cancelled task has ended at once, but its worker may still be removing its partial
            # ledger: let it finish before Spark stops and the process exits.
            ctx.worker_done.wait(max(0.0, deadline - time.monotonic()))
