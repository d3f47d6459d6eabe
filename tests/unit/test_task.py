"""``CompactionTaskCtx``: the PIP-387 transition table, cancel, checkpoints and the probe, listeners, results."""

from __future__ import annotations

import threading
import time
import uuid
from itertools import product

import pytest

from compactord.errors import CompactionCancelled, IllegalStateTransition, TaskNotCancellable
from compactord.task import CHECKPOINTS, TRANSITIONS, CompactionTaskCtx, Progress, TaskProbe, TaskState
from tests.support.probes import Pauses

S = TaskState

# A way into every state from Pending.
PATHS: dict[TaskState, list[TaskState]] = {
    S.PENDING: [],
    S.CREATING_RAW_READER: [S.CREATING_RAW_READER],
    S.RUNNING: [S.CREATING_RAW_READER, S.RUNNING],
    S.ENDING_WITH_SWITCH_LEDGER: [S.CREATING_RAW_READER, S.RUNNING, S.ENDING_WITH_SWITCH_LEDGER],
    S.SUCCEED: [S.CREATING_RAW_READER, S.RUNNING, S.ENDING_WITH_SWITCH_LEDGER, S.SUCCEED],
    S.FAILED: [S.FAILED],
    S.CANCELLED: [S.CANCELLED],
}
ALLOWED = [(old, new) for old, news in TRANSITIONS.items() for new in sorted(news)]
ILLEGAL = [(old, new) for old, new in product(S, S) if new not in TRANSITIONS[old]]
CANCELLABLE = [S.PENDING, S.CREATING_RAW_READER, S.RUNNING]
NOT_CANCELLABLE = [S.ENDING_WITH_SWITCH_LEDGER, S.SUCCEED, S.FAILED, S.CANCELLED]


def task_in(state: TaskState, **kwargs: object) -> CompactionTaskCtx:
    task = CompactionTaskCtx("orders", **kwargs)  # type: ignore[arg-type]
    for step in PATHS[state]:
        task.transition(step)
    assert task.state is state
    return task


def ids(pair: tuple[TaskState, TaskState]) -> str:
    return f"{pair[0].value}->{pair[1].value}"


# -- the table --------------------------------------------------------------------------------------


def test_the_table_covers_every_state() -> None:
    assert set(TRANSITIONS) == set(S)
    assert set(PATHS) == set(S)


def test_the_pip_387_states() -> None:
    assert [s.value for s in S] == ["Pending", "Creating_Raw_Reader", "Running", "Ending_with_switch_ledger",
                                    "Succeed", "Failed", "Cancelled"]
    assert {s for s in S if s.terminal} == {S.SUCCEED, S.FAILED, S.CANCELLED}
    assert {s for s in S if s.cancellable} == set(CANCELLABLE)
    assert all(not TRANSITIONS[s] for s in S if s.terminal)


@pytest.mark.parametrize("pair", ALLOWED, ids=ids)
def test_allowed_transition(pair: tuple[TaskState, TaskState]) -> None:
    old, new = pair
    task = task_in(old)
    task.transition(new)
    assert task.state is new
    assert new in task.state_times
    assert task.done is new.terminal
    assert (task.finished_at is not None) is new.terminal
    assert task.started_at is not None


@pytest.mark.parametrize("pair", ILLEGAL, ids=ids)
def test_illegal_transition_names_task_and_states(pair: tuple[TaskState, TaskState]) -> None:
    old, new = pair
    task = task_in(old)
    with pytest.raises(IllegalStateTransition) as info:
        task.transition(new)
    message = str(info.value)
    assert task.task_id in message
    assert f"from {old.value} to {new.value}" in message
    assert task.state is old


def test_error_is_recorded() -> None:
    task = task_in(S.RUNNING)
    task.transition(S.FAILED, error=CompactionCancelled("stopped"))
    assert (task.error, task.error_type) == ("stopped", "compaction_cancelled")
    other = task_in(S.PENDING)
    other.transition(S.FAILED, error=RuntimeError())
    assert (other.error, other.error_type) == ("RuntimeError", "RuntimeError")


# -- cancel -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", CANCELLABLE, ids=lambda s: s.value)
def test_cancel_ends_the_task(state: TaskState) -> None:
    task = task_in(state)
    calls: list[str] = []
    task.add_cancel_hook(lambda: calls.append("first"))
    task.add_cancel_hook(lambda: 1 / 0)  # a failing hook does not stop the others
    task.add_cancel_hook(lambda: calls.append("second"))
    def removed() -> None:
        calls.append("removed")
    task.add_cancel_hook(removed)
    task.remove_cancel_hook(removed)
    task.cancel("operator asked")
    assert task.state is S.CANCELLED
    assert task.cancelled
    assert task.error == "operator asked"
    assert calls == ["first", "second"]
    assert task.wait(0) is True
    assert task.result(0) is S.CANCELLED
    task.add_cancel_hook(lambda: calls.append("late"))  # added after the cancel: runs at once
    assert calls == ["first", "second", "late"]


@pytest.mark.parametrize("state", NOT_CANCELLABLE, ids=lambda s: s.value)
def test_cancel_is_refused_in_the_switch_and_after_the_end(state: TaskState) -> None:
    if state is S.CANCELLED:
        task = task_in(S.RUNNING)
        task.cancel()
    else:
        task = task_in(state)
    calls: list[str] = []
    task.add_cancel_hook(lambda: calls.append("hook"))
    with pytest.raises(TaskNotCancellable) as info:
        task.cancel()
    assert state.value in str(info.value)
    assert task.task_id in str(info.value)
    assert task.state is state
    assert calls == (["hook"] if state is S.CANCELLED else [])  # an ended task runs a new hook at once


def test_begin_switch_after_cancel_raises() -> None:
    task = task_in(S.RUNNING)
    task.cancel()
    with pytest.raises(CompactionCancelled):
        task.begin_switch()
    assert task.state is S.CANCELLED


def test_begin_switch_from_running() -> None:
    task = task_in(S.RUNNING)
    task.begin_switch()
    assert task.state is S.ENDING_WITH_SWITCH_LEDGER


def test_cancel_of_a_pending_task_drops_its_work() -> None:
    task = task_in(S.PENDING)
    started: list[bool] = []
    task.set_start_hook(lambda: started.append(True))
    task.cancel()
    assert task.worker_done.is_set()
    with pytest.raises(IllegalStateTransition, match="Cancelled"):
        task.start()
    assert started == []


def test_start_runs_the_start_hook_once() -> None:
    task = task_in(S.PENDING)
    started: list[bool] = []
    task.set_start_hook(lambda: started.append(True))
    task.start()
    assert started == [True]
    with pytest.raises(IllegalStateTransition, match="no work"):
        task.start()


# -- checkpoints and pause points -------------------------------------------------------------------


def test_checkpoint_raises_once_cancelled() -> None:
    task = task_in(S.RUNNING)
    task.checkpoint("running")
    task.cancel()
    with pytest.raises(CompactionCancelled, match=task.task_id):
        task.checkpoint("running")


def test_checkpoint_tells_the_probe_before_the_cancel_check() -> None:
    seen: list[tuple[str, bool]] = []

    class Probe(TaskProbe):
        def at_checkpoint(self, task: CompactionTaskCtx, point: str) -> None:
            seen.append((point, task.cancelled))

    task = CompactionTaskCtx("orders", probe=Probe())
    task.checkpoint("pending")
    task.cancel()
    with pytest.raises(CompactionCancelled):
        task.checkpoint("creating_raw_reader")
    assert seen == [("pending", False), ("creating_raw_reader", True)]


def test_a_failing_probe_breaks_nothing() -> None:
    class Broken(TaskProbe):
        def at_checkpoint(self, task: CompactionTaskCtx, point: str) -> None:
            raise RuntimeError("probe bug")

        def on_state(self, task: CompactionTaskCtx, old: TaskState, new: TaskState) -> None:
            raise RuntimeError("probe bug")

    task = CompactionTaskCtx("orders", probe=Broken())
    task.checkpoint("pending")
    task.transition(S.CREATING_RAW_READER)
    assert task.state is S.CREATING_RAW_READER


def test_checkpoint_pauses_per_pause_points() -> None:
    task = task_in(S.RUNNING, probe=Pauses({"running": 0.3}))
    start = time.monotonic()
    task.checkpoint("written")  # no pause asked here
    assert time.monotonic() - start < 0.25
    task.checkpoint("running")
    assert time.monotonic() - start >= 0.3


def test_cancel_cuts_a_pause_short() -> None:
    task = task_in(S.RUNNING, probe=Pauses({"running": 30}))
    outcome: list[BaseException | None] = []

    def work() -> None:
        try:
            task.checkpoint("running")
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 (what the checkpoint raises is what the test looks at)
            outcome.append(exc)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    time.sleep(0.2)
    assert worker.is_alive()  # paused
    cancelled_at = time.monotonic()
    task.cancel()
    worker.join(timeout=5)
    # liveness, not performance: the 30 s pause must not run to its end
    assert not worker.is_alive()
    assert time.monotonic() - cancelled_at < 5
    assert len(outcome) == 1 and isinstance(outcome[0], CompactionCancelled)


def test_checkpoints_are_named() -> None:
    assert {"pending", "creating_raw_reader", "running", "written", "switch", "switched"} == set(CHECKPOINTS)


# -- listeners --------------------------------------------------------------------------------------


def test_listeners_see_every_transition_and_a_failing_one_breaks_nothing() -> None:
    seen: list[tuple[CompactionTaskCtx, TaskState, TaskState]] = []

    def failing(task: CompactionTaskCtx, old: TaskState, new: TaskState) -> None:
        raise RuntimeError("listener bug")

    task = CompactionTaskCtx("orders")
    task.add_listener(failing)
    task.add_listener(lambda *args: seen.append(args))
    late: list[TaskState] = []
    task.add_listener(lambda t, old, new: late.append(new))
    task.transition(S.CREATING_RAW_READER)
    task.transition(S.RUNNING)
    task.cancel()
    assert seen == [(task, S.PENDING, S.CREATING_RAW_READER), (task, S.CREATING_RAW_READER, S.RUNNING),
                    (task, S.RUNNING, S.CANCELLED)]
    assert late == [S.CREATING_RAW_READER, S.RUNNING, S.CANCELLED]
    assert task.state is S.CANCELLED


# -- fail and results -------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [s for s in S if not s.terminal], ids=lambda s: s.value)
def test_fail_from_a_live_state(state: TaskState) -> None:
    task = task_in(state)
    assert task.fail(RuntimeError("disk full")) is True
    assert task.state is S.FAILED
    assert task.error == "disk full"
    assert task.result(0) is S.FAILED


@pytest.mark.parametrize("state", [s for s in S if s.terminal], ids=lambda s: s.value)
def test_fail_after_the_end_does_nothing(state: TaskState) -> None:
    task = task_in(state)
    assert task.fail("late") is False
    assert task.state is state


def test_result_times_out() -> None:
    task = task_in(S.RUNNING)
    assert task.wait(0.01) is False
    with pytest.raises(TimeoutError, match="Running"):
        task.result(0.01)


def test_result_waits_for_the_end() -> None:
    task = task_in(S.RUNNING)
    timer = threading.Timer(0.1, lambda: task.transition(S.SUCCEED))
    timer.start()
    try:
        assert task.result(timeout=10) is S.SUCCEED
    finally:
        timer.cancel()


def test_task_id_is_a_uuid() -> None:
    first, second = CompactionTaskCtx("orders"), CompactionTaskCtx("orders")
    assert str(uuid.UUID(first.task_id)) == first.task_id
    assert first.task_id != second.task_id
    assert first.task_id in repr(first)


# -- why it runs, and what is recorded before its end is visible ------------------------------------


def test_the_reason_defaults_to_manual_or_rebuild_and_is_set_only_while_pending() -> None:
    from compactord.task import REASON_KINDS, Reason

    assert CompactionTaskCtx("orders").reason == Reason("manual")
    assert CompactionTaskCtx("orders", rebuild=True).reason == Reason("rebuild")
    task = CompactionTaskCtx("orders")
    task.set_reason(Reason("backlog_bytes", "backlog 2000 bytes > threshold 500"), caller=None)
    assert task.reason.kind == "backlog_bytes" and task.reason.detail.endswith("threshold 500")
    task.transition(S.CREATING_RAW_READER)
    with pytest.raises(IllegalStateTransition, match="Pending"):
        task.set_reason(Reason("manual"))
    with pytest.raises(ValueError, match="backlog_bytes") as raised:
        Reason("because")
    assert "'because'" in str(raised.value)
    assert Reason.combine([Reason("max_lag", "a"), Reason("dirty_ratio", "b")]) == Reason("max_lag", "a; b")
    assert len(REASON_KINDS) == len(set(REASON_KINDS))


@pytest.mark.parametrize("final", [S.SUCCEED, S.FAILED, S.CANCELLED])
def test_an_end_recorder_runs_before_the_end_is_visible(final: TaskState) -> None:
    seen: list[tuple[TaskState, bool, TaskState, float | None, str | None]] = []
    task = task_in(S.RUNNING if final is S.SUCCEED else S.PENDING)
    task.add_end_recorder(lambda t, new: seen.append((t.state, t.done, new, t.finished_at, t.error)))
    ended: list[bool] = []
    task.add_listener(lambda t, old, new: ended.append(bool(seen)))
    if final is S.SUCCEED:
        task.transition(S.SUCCEED)
    elif final is S.FAILED:
        task.fail(RuntimeError("boom"))
    else:
        task.cancel("stop")
    [(state, done, new, finished_at, error)] = seen
    assert state is not final and not done and new is final  # not yet visible to a waiter
    assert finished_at is not None and finished_at == task.finished_at  # but its end time is known
    assert error == {S.SUCCEED: None, S.FAILED: "boom", S.CANCELLED: "stop"}[final]
    assert ended == [True]  # the listeners come after the recorder


def test_a_failing_end_recorder_does_not_stop_the_end() -> None:
    task = task_in(S.PENDING)

    def broken(t: CompactionTaskCtx, new: TaskState) -> None:
        raise OSError("disk full")

    task.add_end_recorder(broken)
    task.cancel()
    assert task.done and task.state is S.CANCELLED


@pytest.mark.parametrize("end", ["cancel", "abort"])
def test_a_task_that_ends_early_records_the_count_its_source_gives_then_keeps_it(end: str) -> None:
    ctx = CompactionTaskCtx("t")
    ctx.transition(TaskState.CREATING_RAW_READER)
    reported = {"records": 10}  # what the readers' files say

    def source() -> None:
        def update(progress: Progress) -> None:
            progress.records_read = reported["records"]
        ctx.follow_progress(update)

    ctx.set_progress_source(source)
    source()
    reported["records"] = 25  # reported by the readers, not yet followed
    recorded: list[int] = []
    ctx.add_end_recorder(lambda task, _final: recorded.append(task.progress.records_read))
    if end == "cancel":
        ctx.cancel()
    else:
        ctx.abort(TimeoutError("too long"))
    assert recorded == [25] and ctx.progress.records_read == 25
    reported["records"] = 40
    source()  # a poller after the end changes nothing
    assert ctx.progress.records_read == 25


def test_a_failing_progress_source_leaves_the_last_count() -> None:
    ctx = CompactionTaskCtx("t")
    ctx.progress.records_read = 7

    def broken() -> None:
        raise OSError("gone")

    ctx.set_progress_source(broken)
    ctx.cancel()
    assert ctx.state is TaskState.CANCELLED and ctx.progress.records_read == 7
