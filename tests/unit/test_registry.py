"""The task registry's slots, with an in-process service whose work the test controls (the registry's
own logic: the engine and the daemon tests run it on real Kafka and Spark)."""

from __future__ import annotations

import threading
from typing import Any

from compactord.daemon.scheduler import TaskRegistry
from compactord.task import CompactionTaskCtx, TaskState
from tests.support.waiting import wait_for


class HeldService:
    """``compact`` returns a task whose worker runs until the test lets it go (even after a cancel)."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.release = threading.Event()

    def compact(self, *, rebuild: bool = False, start: bool = True) -> CompactionTaskCtx:
        ctx = CompactionTaskCtx(self.topic, rebuild=rebuild)

        def work() -> None:
            try:
                ctx.transition(TaskState.CREATING_RAW_READER)
                ctx.transition(TaskState.RUNNING)
                self.release.wait(30)  # Spark work that ignores the cancel for a while
                if not ctx.done:
                    ctx.begin_switch()
                    ctx.transition(TaskState.SUCCEED)
            finally:
                ctx.worker_done.set()

        ctx.set_start_hook(threading.Thread(target=work, daemon=True).start)
        if start:
            ctx.start()
        return ctx


class Factory:
    def __init__(self) -> None:
        self.services: dict[str, HeldService] = {}

    def new_topic_compaction_service(self, topic: str) -> Any:
        return self.services.setdefault(topic, HeldService(topic))


def test_a_cancelled_task_keeps_its_slot_until_its_work_has_stopped():
    factory = Factory()
    registry = TaskRegistry(factory, max_concurrent=1, monitor_interval_s=60)  # type: ignore[arg-type]
    a = registry.trigger("a")
    wait_for(lambda: a.state is TaskState.RUNNING, 10, "task a to run", interval=0.01)
    b = registry.trigger("b")
    assert b.state is TaskState.PENDING and registry.pending_count() == 1

    outcome = registry.cancel("a", timeout=0.2)
    assert a.state is TaskState.CANCELLED and not outcome.stopped  # its work is still stopping
    threading.Event().wait(0.3)
    assert b.state is TaskState.PENDING, "b started beside a's work: two jobs on one slot"
    assert registry.running_count() == 1

    factory.services["a"].release.set()  # a's work ends: its slot goes to b
    wait_for(lambda: b.state is TaskState.RUNNING, 10, "task b to run", interval=0.01)
    assert registry.running_count() == 1 and registry.pending_count() == 0
    factory.services["b"].release.set()
    assert b.result(10) is TaskState.SUCCEED
    wait_for(lambda: registry.running_count() == 0, 10, "no running task", interval=0.01)


def test_work_that_never_stops_frees_its_slot_after_the_bound():
    factory = Factory()
    registry = TaskRegistry(factory, max_concurrent=1, monitor_interval_s=60, release_after_s=0.5)  # type: ignore[arg-type]
    a = registry.trigger("a")
    wait_for(lambda: a.state is TaskState.RUNNING, 10, "task a to run", interval=0.01)
    b = registry.trigger("b")
    registry.cancel("a", timeout=0.0)
    wait_for(lambda: b.state is TaskState.RUNNING, 5, "task b to run", interval=0.01)
    factory.services["a"].release.set()
    factory.services["b"].release.set()
    assert b.result(10) is TaskState.SUCCEED


def test_a_pending_task_cancelled_never_held_a_slot():
    factory = Factory()
    registry = TaskRegistry(factory, max_concurrent=1, monitor_interval_s=60)  # type: ignore[arg-type]
    a = registry.trigger("a")
    b = registry.trigger("b")
    c = registry.trigger("c")
    registry.cancel("b", timeout=1)
    assert b.state is TaskState.CANCELLED and b.worker_done.is_set()
    factory.services["a"].release.set()
    wait_for(lambda: c.state is TaskState.RUNNING, 10, "task c to run", interval=0.01)
    factory.services["c"].release.set()
    assert a.result(10) is TaskState.SUCCEED and c.result(10) is TaskState.SUCCEED


class SmallRunService(HeldService):
    """A task whose work says, once running, that it is a small run read in the driver (``leave_slot``)."""

    def compact(self, *, rebuild: bool = False, start: bool = True) -> CompactionTaskCtx:
        ctx = CompactionTaskCtx(self.topic, rebuild=rebuild)

        def work() -> None:
            try:
                ctx.transition(TaskState.CREATING_RAW_READER)
                ctx.transition(TaskState.RUNNING)
                ctx.leave_slot()
                self.release.wait(30)
                if not ctx.done:
                    ctx.begin_switch()
                    ctx.transition(TaskState.SUCCEED)
            finally:
                ctx.worker_done.set()

        ctx.set_start_hook(threading.Thread(target=work, daemon=True).start)
        if start:
            ctx.start()
        return ctx


def test_small_runs_in_the_driver_leave_their_slot_up_to_their_own_bound():
    from compactord.daemon.scheduler import DRIVER_RUNS_AT_ONCE

    factory = Factory()
    topics = [f"t{i}" for i in range(DRIVER_RUNS_AT_ONCE + 2)]
    for t in topics:
        factory.services[t] = SmallRunService(t)
    registry = TaskRegistry(factory, max_concurrent=1, monitor_interval_s=60)  # type: ignore[arg-type]
    tasks = [registry.trigger(t) for t in topics]
    # Each small run hands its slot on, until the driver runs are as many as allowed: the next one keeps its slot.
    wait_for(lambda: sum(t.state is TaskState.RUNNING for t in tasks) == DRIVER_RUNS_AT_ONCE + 1, 10,
             "the driver runs and one slot's task to run", interval=0.01)
    assert registry.pending_count() == 1 and registry.running_count() == DRIVER_RUNS_AT_ONCE + 1
    threading.Event().wait(0.3)
    assert registry.pending_count() == 1, "a task started beyond the slot and the driver runs"

    # The slot is the waiting task's to take: it starts when the task that kept the slot ends.
    holder = next(t for t in tasks if t.task_id in registry._running)
    factory.services[holder.topic].release.set()
    wait_for(lambda: registry.pending_count() == 0, 10, "the last task to start", interval=0.01)
    for t in topics:
        factory.services[t].release.set()
    for task in tasks:
        assert task.result(10) is TaskState.SUCCEED
    wait_for(lambda: registry.running_count() == 0, 10, "no running task", interval=0.01)


def test_a_task_started_outside_the_registry_leaves_no_slot():
    ctx = CompactionTaskCtx("t")
    ctx.leave_slot()  # no registry gave it a slot: nothing to do
    assert ctx.state is TaskState.PENDING


class DrivenService:
    """``compact`` returns a task whose work the test itself does, on its own thread (no thread is started)."""

    def __init__(self, topic: str) -> None:
        self.topic = topic

    def compact(self, *, rebuild: bool = False, start: bool = True) -> CompactionTaskCtx:
        ctx = CompactionTaskCtx(self.topic, rebuild=rebuild)
        ctx.set_start_hook(lambda: None)
        return ctx


def test_a_slot_is_freed_on_the_thread_that_ends_the_work():
    """No thread of the registry's own frees it: when the work's end returns, the next task has its slot."""
    factory = Factory()
    factory.services.update(a=DrivenService("a"), b=DrivenService("b"))  # type: ignore[dict-item]
    registry = TaskRegistry(factory, max_concurrent=1, monitor_interval_s=60)  # type: ignore[arg-type]
    a, b = registry.trigger("a"), registry.trigger("b")
    assert registry.running_count() == 1 and registry.pending_count() == 1
    for state in (TaskState.CREATING_RAW_READER, TaskState.RUNNING):
        a.transition(state)
    a.begin_switch()
    a.transition(TaskState.SUCCEED)
    assert registry.pending_count() == 1, "a's slot was freed before its work ended"
    a.worker_done.set()
    assert registry.pending_count() == 0 and registry.running_count() == 1  # b holds the slot
    assert b.task_id in registry._running


class LateSparkService(HeldService):
    """A run that leaves its slot before it is planned, then (once the test says ``go``) needs a Spark job:
    it takes a slot again (``take_slot``), then holds it until released."""

    def __init__(self, topic: str) -> None:
        super().__init__(topic)
        self.go = threading.Event()
        self.took = threading.Event()
        self.error: BaseException | None = None

    def compact(self, *, rebuild: bool = False, start: bool = True) -> CompactionTaskCtx:
        ctx = CompactionTaskCtx(self.topic, rebuild=rebuild)

        def work() -> None:
            try:
                ctx.transition(TaskState.CREATING_RAW_READER)
                ctx.transition(TaskState.RUNNING)
                ctx.leave_slot()
                self.go.wait(30)
                ctx.take_slot()
                self.took.set()
                self.release.wait(30)
                ctx.begin_switch()
                ctx.transition(TaskState.SUCCEED)
            except Exception as exc:  # noqa: BLE001 (the test looks at it)
                self.error = exc
            finally:
                ctx.worker_done.set()

        ctx.set_start_hook(threading.Thread(target=work, daemon=True).start)
        return ctx


def _late_spark_registry() -> tuple[Factory, TaskRegistry, LateSparkService, list[CompactionTaskCtx]]:
    factory = Factory()
    late = LateSparkService("x")
    factory.services["x"] = late
    registry = TaskRegistry(factory, max_concurrent=1, monitor_interval_s=60)  # type: ignore[arg-type]
    tasks = [registry.trigger(t) for t in ("x", "b", "c")]
    # x left its slot: b holds it, c waits
    wait_for(lambda: tasks[1].state is TaskState.RUNNING, 10, "task b to run", interval=0.01)
    late.go.set()
    wait_for(lambda: registry._taking, 10, "x to wait for a slot", interval=0.01)
    return factory, registry, late, tasks


def test_a_run_that_left_its_slot_and_needs_a_spark_job_takes_a_slot_before_waiting_tasks():
    factory, registry, late, (x, b, c) = _late_spark_registry()
    assert not late.took.is_set() and registry.running_count() == 2
    factory.services["b"].release.set()  # b's slot goes to x, not to c
    assert late.took.wait(10)
    assert c.state is TaskState.PENDING and x.task_id in registry._running
    late.release.set()
    wait_for(lambda: c.state is TaskState.RUNNING, 10, "task c to run", interval=0.01)
    factory.services["c"].release.set()
    assert x.result(10) is TaskState.SUCCEED and b.result(10) is TaskState.SUCCEED and c.result(10) is TaskState.SUCCEED


def test_a_run_cancelled_while_it_waits_for_a_slot_again_ends_and_takes_none():
    factory, registry, late, (x, _b, c) = _late_spark_registry()
    registry.cancel("x", timeout=10)
    assert x.worker_done.wait(10) and type(late.error).__name__ == "CompactionCancelled"
    assert not late.took.is_set() and not registry._taking
    factory.services["b"].release.set()  # b's slot goes to c
    wait_for(lambda: c.state is TaskState.RUNNING, 10, "task c to run", interval=0.01)
    factory.services["c"].release.set()
    assert c.result(10) is TaskState.SUCCEED
