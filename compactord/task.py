"""``CompactionTaskCtx``: one compaction run as a state machine (Pulsar's PIP-387).

::

    Pending -> Creating_Raw_Reader -> Running -> Ending_with_switch_ledger -> Succeed
                                                                           \\-> Failed
    Pending, Creating_Raw_Reader, Running -> Cancelled | Failed
    Creating_Raw_Reader, Running -> Succeed   (nothing new to compact: no ledger is written)

Writing and fsyncing the new ledger happen in Running; Ending_with_switch_ledger covers only the
pointer replacement, the in-memory swap and the deletion of the old ledger, and cannot be cancelled.

A cancel ends the task at once (state Cancelled) and runs the cancel hooks the work registered
(cancel the Spark job group, stop the Kafka readers). Spark work that cannot be interrupted at once
finishes in the background; the worker then discards its output and sets ``worker_done``.

The work calls ``checkpoint(point)`` at each of the ``CHECKPOINTS``: it tells the task's
``TaskProbe`` (a no-op in production), then raises ``CompactionCancelled`` if the task was
cancelled. The probe is the seam through which tests hold a task at a chosen point.

What a task carries besides its state (why it runs, how far it has read, what it did) is in
``compactord.task_report``, re-exported here.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any

from compactord.errors import CompactionCancelled, IllegalStateTransition, TaskNotCancellable
from compactord.task_report import REASON_KINDS, Progress, Reason, TaskStats

__all__ = ["CHECKPOINTS", "REASON_KINDS", "TRANSITIONS", "CompactionTaskCtx", "EndRecorder", "Progress", "Reason",
           "TaskProbe", "TaskState", "TaskStats", "WorkDone"]

log = logging.getLogger(__name__)


class TaskState(str, Enum):
    PENDING = "Pending"
    CREATING_RAW_READER = "Creating_Raw_Reader"
    RUNNING = "Running"
    ENDING_WITH_SWITCH_LEDGER = "Ending_with_switch_ledger"
    SUCCEED = "Succeed"
    FAILED = "Failed"
    CANCELLED = "Cancelled"

    @property
    def terminal(self) -> bool:
        return self in (TaskState.SUCCEED, TaskState.FAILED, TaskState.CANCELLED)

    @property
    def cancellable(self) -> bool:
        return self in (TaskState.PENDING, TaskState.CREATING_RAW_READER, TaskState.RUNNING)


S = TaskState
TRANSITIONS: Mapping[TaskState, frozenset[TaskState]] = {
    S.PENDING: frozenset({S.CREATING_RAW_READER, S.CANCELLED, S.FAILED}),
    S.CREATING_RAW_READER: frozenset({S.RUNNING, S.SUCCEED, S.FAILED, S.CANCELLED}),
    S.RUNNING: frozenset({S.ENDING_WITH_SWITCH_LEDGER, S.SUCCEED, S.FAILED, S.CANCELLED}),
    S.ENDING_WITH_SWITCH_LEDGER: frozenset({S.SUCCEED, S.FAILED}),
    S.SUCCEED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}

#: The points at which the work calls ``checkpoint``, in order.
CHECKPOINTS = (
    "pending",  # before leaving Pending
    "creating_raw_reader",  # offsets fixed, ledger chosen, before Running
    "running",  # in Running, before the Spark job is submitted
    "written",  # in Running, the new ledger written and fsynced, before the switch
    "switch",  # in Ending_with_switch_ledger, before the pointer is replaced
    "switched",  # in Ending_with_switch_ledger, pointer replaced, before the old ledger is deleted
)


StateListener = Callable[["CompactionTaskCtx", TaskState, TaskState], None]
EndRecorder = Callable[["CompactionTaskCtx", TaskState], None]


class WorkDone(threading.Event):
    """``worker_done``: an event that also calls back, on the thread that sets it, what ``when_set`` was given
    (at once when already set): the registry frees a task's slot so, with no thread of its own."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], None]] = []
        self._callbacks_lock = threading.Lock()

    def set(self) -> None:
        super().set()
        with self._callbacks_lock:
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("a callback of a task's end of work failed")

    def when_set(self, callback: Callable[[], None]) -> None:
        with self._callbacks_lock:
            if not self.is_set():
                self._callbacks.append(callback)
                return
        callback()


class TaskProbe:
    """Sees every state change and checkpoint of the tasks it is given to. The default does nothing.

    Tests subclass it to observe a run or to hold it at a point (e.g. wait in ``at_checkpoint`` until
    released, or until ``task.wait_cancelled`` returns). It runs on the task's own thread; what it
    raises is logged and ignored.
    """

    def on_state(self, task: CompactionTaskCtx, old: TaskState, new: TaskState) -> None:
        """Called after every transition."""

    def at_checkpoint(self, task: CompactionTaskCtx, point: str) -> None:
        """Called when the work reaches ``point`` (one of ``CHECKPOINTS``), before the cancel check."""


class CompactionTaskCtx:
    """A compaction task: its state, timings, progress, result or error, and ``cancel()``."""

    def __init__(
        self,
        topic: str,
        *,
        rebuild: bool = False,
        probe: TaskProbe | None = None,
        reason: Reason | None = None,
        kind: str = "compaction",
    ) -> None:
        self.task_id = str(uuid.uuid4())
        self.topic = topic
        self.rebuild = rebuild
        self.reason = reason or Reason("rebuild" if rebuild else "manual")
        self.caller: str | None = None  # the client address of a manual trigger
        self.previous_ledger_id: int | None = None  # the ledger this task started from
        # "compaction", or "preview": the read and choose steps only, counted, never a ledger switch.
        self.kind = kind
        self.preview: dict[str, Any] | None = None  # a preview task's result
        self.progress = Progress()
        self.created_at = time.time()
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.state_times: dict[TaskState, float] = {TaskState.PENDING: self.created_at}
        self.error: str | None = None
        self.error_type: str | None = None
        self.ledger_id: int | None = None  # the ledger this task switched to
        self.stats = TaskStats()
        self.worker_done = WorkDone()  # background work ended and cleaned up
        self._state = TaskState.PENDING
        self._lock = threading.RLock()
        self._done = threading.Event()
        self._cancel = threading.Event()
        # Set by cancel(): the state it cancelled, and when (monotonic): the log says how long the work took to stop.
        self.cancelled_in: TaskState | None = None
        self.cancelled_mono: float | None = None
        self._cancel_hooks: list[Callable[[], None]] = []
        self._start_hook: Callable[[], None] | None = None
        self._slot_hook: Callable[[CompactionTaskCtx], bool] | None = None
        self._take_slot_hook: Callable[[CompactionTaskCtx], threading.Event | None] | None = None
        self._progress_source: Callable[[], None] | None = None
        self._probe = probe or TaskProbe()
        self._listeners: list[StateListener] = [self._probe.on_state]
        self._end_recorders: list[EndRecorder] = []

    def __repr__(self) -> str:
        return f"<CompactionTaskCtx {self.task_id} topic={self.topic!r} state={self._state.value}>"

    # -- state ----------------------------------------------------------------------------------

    @property
    def state(self) -> TaskState:
        return self._state

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def transition(self, new: TaskState, *, error: BaseException | str | None = None) -> None:
        """Move to ``new``; raise ``IllegalStateTransition`` if the table does not allow it."""
        with self._lock:
            old = self._state
            if new not in TRANSITIONS[old]:
                raise IllegalStateTransition(
                    f"task {self.task_id} of topic {self.topic!r} cannot go from {old.value} to {new.value}"
                )
            now = time.time()
            if old is TaskState.PENDING:
                self.started_at = now
            if error is not None:
                self.error = str(error) or type(error).__name__
                if isinstance(error, str):
                    code = "compaction_cancelled" if new is TaskState.CANCELLED else "compaction_failed"
                else:
                    code = getattr(error, "code", None) or type(error).__name__
                self.error_type = code
            if new.terminal:
                self.finished_at = now
                # Before the end is visible: whoever sees it (a waiter, a status request) finds it recorded.
                for record in self._end_recorders:
                    try:
                        record(self, new)
                    except Exception:
                        log.exception("end recorder failed for task %s", self.task_id)
            self._state = new
            self.state_times[new] = now
            if new.terminal:
                self._done.set()
        log.debug("task %s %s: %s -> %s", self.task_id, self.topic, old.value, new.value)
        for listener in self._listeners:
            try:
                listener(self, old, new)
            except Exception:  # a metrics or registry hook must not break the task
                log.exception("state listener failed for task %s", self.task_id)

    def add_listener(self, listener: StateListener) -> None:
        self._listeners.append(listener)

    def add_end_recorder(self, recorder: EndRecorder) -> None:
        """Call ``recorder(task, final_state)`` when the task ends, before the end is visible (its state,
        ``done``, the listeners): ``finished_at``, the error and the stats are already set. It runs under
        the task's lock; what it raises is logged and the task ends all the same."""
        self._end_recorders.append(recorder)

    def set_reason(self, reason: Reason, caller: str | None = None) -> None:
        """Say why the task runs (and, for a manual trigger, who asked); only before it starts."""
        with self._lock:
            if self._state is not TaskState.PENDING:
                raise IllegalStateTransition(
                    f"task {self.task_id} of topic {self.topic!r} is {self._state.value}: its reason is set "
                    "while it is Pending")
            self.reason, self.caller = reason, caller

    def begin_switch(self) -> None:
        """Enter Ending_with_switch_ledger, unless the task was cancelled first (then raise)."""
        with self._lock:
            if self._cancel.is_set() or self._state is TaskState.CANCELLED:
                raise CompactionCancelled(f"task {self.task_id} was cancelled before the switch")
            self.transition(TaskState.ENDING_WITH_SWITCH_LEDGER)

    def fail(self, error: BaseException | str) -> bool:
        """End the task in Failed if it has not ended; return whether it did."""
        with self._lock:
            if self._state.terminal:
                return False
            self.transition(TaskState.FAILED, error=error)
        return True

    # -- progress -------------------------------------------------------------------------------

    def follow_progress(self, update: Callable[[Progress], None]) -> None:
        """Apply ``update`` to ``progress`` unless the task has ended: the count at its end (at a cancel,
        the records read by then) is the one its status, the cancel's answer and its run record all give."""
        with self._lock:
            if not self._state.terminal:
                update(self.progress)

    def set_progress_source(self, source: Callable[[], None] | None) -> None:
        """``source`` brings ``progress`` up to date from what the work reports (the readers' files); a
        cancel or an abort calls it once more before the end is recorded."""
        self._progress_source = source

    def _last_progress(self) -> None:
        source = self._progress_source
        if source is None:
            return
        try:
            source()
        except Exception:  # the count stays the last one seen
            log.exception("progress source failed for task %s", self.task_id)

    # -- start and cancel -----------------------------------------------------------------------

    def set_start_hook(self, hook: Callable[[], None]) -> None:
        """The work to launch when a Pending task is started (set by the service)."""
        self._start_hook = hook

    def start(self) -> None:
        """Start a Pending task's work (in its own thread)."""
        with self._lock:
            if self._state is not TaskState.PENDING:
                raise IllegalStateTransition(
                    f"task {self.task_id} of topic {self.topic!r} is {self._state.value}, not Pending"
                )
            hook, self._start_hook = self._start_hook, None
        if hook is None:
            raise IllegalStateTransition(f"task {self.task_id} has no work to start")
        hook()

    def set_slot_hook(self, leave: Callable[[CompactionTaskCtx], bool],
                      take: Callable[[CompactionTaskCtx], threading.Event | None] | None = None) -> None:
        """What ``leave_slot`` and ``take_slot`` call (set by the registry that gave the task its slot)."""
        self._slot_hook, self._take_slot_hook = leave, take

    def leave_slot(self) -> None:
        """Say that the work is, or likely is, a small run read in the driver (no Spark job): the registry may
        count it apart from ``compactionMaxConcurrentTasks`` and start a waiting task. Asked again (when its
        driver runs were all taken) until it left once."""
        hook = self._slot_hook
        if hook is not None:
            try:
                if hook(self):
                    self._slot_hook = None
            except Exception:  # the task keeps its slot
                self._slot_hook = None
                log.exception("slot hook failed for task %s", self.task_id)

    def take_slot(self) -> None:
        """Before a Spark job: wait for a ``compactionMaxConcurrentTasks`` slot again if ``leave_slot`` gave it
        up (a run planned out of its slot that is not small after all). At once when the task kept its slot.

        :raises CompactionCancelled: the task was cancelled while it waited.
        """
        hook, self._take_slot_hook = self._take_slot_hook, None
        given = hook(self) if hook is not None else None
        if given is None:
            return
        self.add_cancel_hook(given.set)
        try:
            given.wait()
        finally:
            self.remove_cancel_hook(given.set)
        if self.cancelled:
            raise CompactionCancelled(f"task {self.task_id} of topic {self.topic!r} was cancelled")

    def add_cancel_hook(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` on cancel (at once if the task is already cancelled)."""
        with self._lock:
            if not self._cancel.is_set():
                self._cancel_hooks.append(hook)
                return
        self._run_hook(hook)

    def remove_cancel_hook(self, hook: Callable[[], None]) -> None:
        with self._lock:
            if hook in self._cancel_hooks:
                self._cancel_hooks.remove(hook)

    def cancel(self, reason: str = "cancelled") -> None:
        """Cancel the task: allowed in Pending, Creating_Raw_Reader and Running.

        :raises TaskNotCancellable: the task is switching ledgers, or has already ended.
        """
        with self._lock:
            state = self._state
            if state is TaskState.ENDING_WITH_SWITCH_LEDGER:
                raise TaskNotCancellable(
                    f"task {self.task_id} of topic {self.topic!r} is in {state.value}: the ledger switch "
                    "completes or fails, it cannot be cancelled"
                )
            if state.terminal:
                raise TaskNotCancellable(
                    f"task {self.task_id} of topic {self.topic!r} has already ended ({state.value})"
                )
            self._last_progress()
            self._cancel.set()
            self.cancelled_in, self.cancelled_mono = state, time.monotonic()
            hooks, self._cancel_hooks = self._cancel_hooks, []
            self.transition(TaskState.CANCELLED, error=reason)
            if state is TaskState.PENDING and self._start_hook is not None:
                self._start_hook = None
                self.worker_done.set()  # no work was ever started
        for hook in hooks:
            self._run_hook(hook)

    def abort(self, error: BaseException) -> bool:
        """End a cancellable task in Failed (e.g. it ran past ``compactionTaskTimeoutSeconds``) and stop
        its work like a cancel does; return whether it did (a switching or ended task is left alone)."""
        with self._lock:
            if not self._state.cancellable:
                return False
            self._last_progress()
            self._cancel.set()
            hooks, self._cancel_hooks = self._cancel_hooks, []
            pending = self._state is TaskState.PENDING
            self.transition(TaskState.FAILED, error=error)
            if pending and self._start_hook is not None:
                self._start_hook = None
                self.worker_done.set()
        for hook in hooks:
            self._run_hook(hook)
        return True

    def _run_hook(self, hook: Callable[[], None]) -> None:
        try:
            hook()
        except Exception:
            log.exception("cancel hook failed for task %s", self.task_id)

    def checkpoint(self, point: str) -> None:
        """Tell the probe that the work reached ``point``; raise ``CompactionCancelled`` if cancelled."""
        try:
            self._probe.at_checkpoint(self, point)
        except Exception:
            log.exception("task probe failed at %r for task %s", point, self.task_id)
        if self._cancel.is_set():
            raise CompactionCancelled(f"task {self.task_id} of topic {self.topic!r} was cancelled")

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Wait until the task is cancelled (or aborted); return whether it was."""
        return self._cancel.wait(timeout)

    # -- results --------------------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the task has ended; return whether it has."""
        return self._done.wait(timeout)

    def result(self, timeout: float | None = None) -> TaskState:
        """Wait for the end and return the final state (Succeed, Failed or Cancelled).

        :raises TimeoutError: the task did not end within ``timeout`` seconds.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"task {self.task_id} of topic {self.topic!r} still {self._state.value}")
        return self._state
