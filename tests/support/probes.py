"""Task probes: the seam through which tests see and hold a compaction (``compactord.task.TaskProbe``).

- ``Hold(point)``: in-process tests. The task waits at ``point`` until ``release()`` or, at a
  cancellable point, until it is cancelled; ``reached`` is set when it gets there, so a test waits
  on an event, not on a sleep.
- ``Pauses({point: seconds})``: a daemon subprocess (through ``PausingFactory``). Pauses that long at
  each point (a cancel cuts a cancellable pause short) and logs a line a test can wait for.
- ``Gate(point, path)``: a daemon subprocess. Holds every task at ``point`` until the file ``path``
  exists (or, at a cancellable point, a cancel), so a test holds a run open as long as it needs.
- ``PausingFactory``: the default factory with ``Pauses`` from the environment variable
  ``COMPACTORD_TEST_PAUSES`` (``point:seconds[,...]``) and a ``Gate`` for each ``point:path`` of
  ``COMPACTORD_TEST_GATE`` (``point:path[,...]``); a test daemon selects it with
  ``compactionServiceFactoryClassName=tests.support.probes:PausingFactory``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from compactord.engine.factory import SparkCompactionServiceFactory
from compactord.interfaces import ServiceContext
from compactord.task import CHECKPOINTS, CompactionTaskCtx, TaskProbe, TaskState

__all__ = ["GATE_ENV", "PAUSES_ENV", "Gate", "Hold", "Pauses", "PausingFactory", "Recorder"]

log = logging.getLogger(__name__)
PAUSES_ENV = "COMPACTORD_TEST_PAUSES"
GATE_ENV = "COMPACTORD_TEST_GATE"
_UNCANCELLABLE = ("switch", "switched")


class Hold(TaskProbe):
    """Holds every task it sees at ``point`` until ``release()`` (or a cancel, where one is allowed)."""

    def __init__(self, point: str, timeout: float = 120.0) -> None:
        assert point in CHECKPOINTS, point
        self.point = point
        self.timeout = timeout
        self.reached = threading.Event()
        self._released = threading.Event()

    def at_checkpoint(self, task: CompactionTaskCtx, point: str) -> None:
        if point != self.point:
            return
        self.reached.set()
        deadline = time.monotonic() + self.timeout
        while not self._released.is_set() and time.monotonic() < deadline:
            if point not in _UNCANCELLABLE and task.wait_cancelled(0.05):
                return
            self._released.wait(0.05)

    def release(self) -> None:
        self._released.set()


class Pauses(TaskProbe):
    """Pauses ``seconds`` at each named point; a cancel cuts a cancellable pause short."""

    def __init__(self, points: dict[str, float]) -> None:
        unknown = set(points) - set(CHECKPOINTS)
        assert not unknown, f"unknown checkpoints {unknown}; known: {CHECKPOINTS}"
        self.points = points

    @classmethod
    def parse(cls, text: str) -> Pauses:
        points = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, _, seconds = item.partition(":")
            points[name] = float(seconds)
        return cls(points)

    def at_checkpoint(self, task: CompactionTaskCtx, point: str) -> None:
        pause = self.points.get(point)
        if not pause:
            return
        log.warning("task %s pausing %.1fs at test pause point %r", task.task_id, pause, point)
        if point in _UNCANCELLABLE:
            time.sleep(pause)  # the switch cannot be cancelled: nothing cuts this pause short
        else:
            task.wait_cancelled(pause)


class Gate(TaskProbe):
    """Holds every task at ``point`` until the file ``path`` exists (a cancel ends a cancellable hold);
    logs a line a test can wait for. Then ``then`` (another probe, e.g. ``Pauses``) sees the task too."""

    def __init__(self, point: str, path: Path, then: TaskProbe | None = None) -> None:
        assert point in CHECKPOINTS, point
        self.point = point
        self.path = path
        self.then = then or TaskProbe()

    @classmethod
    def parse(cls, text: str, then: TaskProbe | None = None) -> Gate:
        point, _, path = text.partition(":")
        return cls(point, Path(path), then)

    def on_state(self, task: CompactionTaskCtx, old: TaskState, new: TaskState) -> None:
        self.then.on_state(task, old, new)

    def at_checkpoint(self, task: CompactionTaskCtx, point: str) -> None:
        if point == self.point and not self.path.exists():
            log.warning("task %s held at test gate %r until %s exists", task.task_id, point, self.path)
            while not self.path.exists():
                if point not in _UNCANCELLABLE and task.wait_cancelled(0.05):
                    return
                time.sleep(0.05)
        self.then.at_checkpoint(task, point)


class Recorder(TaskProbe):
    """Calls ``on_state(task, old, new)`` and ``on_point(task, point)``."""

    def __init__(self, on_state: Callable[[CompactionTaskCtx, TaskState, TaskState], None] | None = None,
                 on_point: Callable[[CompactionTaskCtx, str], None] | None = None) -> None:
        self._on_state = on_state
        self._on_point = on_point

    def on_state(self, task: CompactionTaskCtx, old: TaskState, new: TaskState) -> None:
        if self._on_state is not None:
            self._on_state(task, old, new)

    def at_checkpoint(self, task: CompactionTaskCtx, point: str) -> None:
        if self._on_point is not None:
            self._on_point(task, point)


class PausingFactory(SparkCompactionServiceFactory):
    """The default factory, its tasks paused as ``COMPACTORD_TEST_PAUSES`` says and held at the gates
    ``COMPACTORD_TEST_GATE`` names (if any)."""

    def initialize(self, context: ServiceContext) -> None:
        probe: TaskProbe = Pauses.parse(os.environ.get(PAUSES_ENV, ""))
        for gate in reversed([part.strip() for part in os.environ.get(GATE_ENV, "").split(",") if part.strip()]):
            probe = Gate.parse(gate, then=probe)
        super().initialize(ServiceContext(context.settings, spark=context.spark, store=context.store,
                                          broker=context.broker, probe=probe))
