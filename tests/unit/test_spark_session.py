"""How a job group's failure is translated: a cancellation is known by the group, not by the text.

No Spark here: the session is a stand-in that records the calls (the real cancellation is in
tests/inprocess/engine/test_cancel.py).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from compactord.config import Settings
from compactord.engine import spark_session
from compactord.engine.spark_session import SparkSessionManager
from compactord.errors import CompactionCancelled, SparkError


class _Context:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def setJobGroup(self, *args: Any, **kwargs: Any) -> None:  # Spark's names
        self.calls.append(("setJobGroup", *args))

    def setLocalProperty(self, *args: Any) -> None:
        self.calls.append(("setLocalProperty", *args))

    def cancelJobGroup(self, group: str) -> None:
        self.calls.append(("cancelJobGroup", group))


class _Py4JJavaError(Exception):
    pass


_Py4JJavaError.__module__ = "py4j.protocol"


class _Session:
    def __init__(self) -> None:
        self.sparkContext = _Context()


@pytest.fixture
def manager() -> SparkSessionManager:
    m = SparkSessionManager(Settings())
    m._spark = _Session()
    return m


def _fail(manager: SparkSessionManager, group: str, exc: Exception) -> None:
    with manager.job_group(group, "a test job"):
        raise exc


def test_a_failure_of_a_group_we_cancelled_is_a_cancellation(manager: SparkSessionManager) -> None:
    manager.cancel_group("task-1")  # the JVM half fails on the stand-in: logged, not raised
    with pytest.raises(CompactionCancelled, match="task-1"):
        _fail(manager, "task-1", _Py4JJavaError("Job 3 failed: some executor error"))
    assert not manager.was_cancelled("task-1"), "the context forgets the group on exit"


def test_the_word_cancelled_alone_is_not_a_cancellation(manager: SparkSessionManager) -> None:
    with pytest.raises(SparkError):
        _fail(manager, "task-2", _Py4JJavaError("Job 3 cancelled because SparkContext was shut down"))


def test_another_group_s_cancel_does_not_count(manager: SparkSessionManager) -> None:
    manager.cancel_group("task-3")
    with pytest.raises(SparkError):
        _fail(manager, "task-4", _Py4JJavaError("boom"))
    assert manager.was_cancelled("task-3")


def test_remembered_cancellations_are_bounded(manager: SparkSessionManager) -> None:
    for i in range(spark_session.MAX_CANCELLED_GROUPS + 10):
        manager.cancel_group(f"t{i}")
    assert not manager.was_cancelled("t0")
    assert manager.was_cancelled(f"t{spark_session.MAX_CANCELLED_GROUPS + 9}")
    assert len(manager._cancelled) == spark_session.MAX_CANCELLED_GROUPS


# A process paused in the middle of a liveness check (SIGSTOP, a suspended VM) finds, once it runs again, that more
# than the check's time has passed; the JVM's answer, which needs the process to run, is not late for that.
_PAUSED_CHECK = """
import time
from compactord.config import Settings
from compactord.engine.spark_session import SparkSessionManager

class _Sc:
    def isStopped(self):
        print("asking", flush=True)
        for _ in range(10):  # 0.5 s of this process's own running time, in steps that a pause cannot skip
            time.sleep(0.05)
        return False

class _Jsc:
    def sc(self):
        return _Sc()

class _Context:
    _jsc = _Jsc()

class _Session:
    sparkContext = _Context()

manager = SparkSessionManager(Settings())
manager._spark = _Session()
print("alive" if manager.alive(timeout=2.0) else "hung", flush=True)
"""


def test_a_pause_of_the_daemon_longer_than_the_check_is_not_a_hung_jvm() -> None:
    child = subprocess.Popen([sys.executable, "-c", _PAUSED_CHECK], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[2])
    try:
        assert child.stdout is not None and child.stdout.readline() == "asking\n"
        time.sleep(0.1)
        child.send_signal(signal.SIGSTOP)
        time.sleep(3.0)  # longer than the check's 2 s
        child.send_signal(signal.SIGCONT)
        assert child.stdout.readline() == "alive\n"
        assert child.wait(30) == 0
    finally:
        child.kill()
        child.wait()
