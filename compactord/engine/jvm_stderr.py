"""The Spark JVM's standard error, passed on line by line, without the tracebacks of Python workers Spark
stopped.

Spark stops a Python worker that has been idle for a minute (``PythonWorkerFactory``; not configurable), and
kills the workers of a cancelled job. Such a worker finds its socket closed, and the ``pyspark.daemon`` that
forked it prints the ``BrokenPipeError`` (or ``ConnectionResetError``) with its traceback: untimed lines,
three per run a minute after it (the data source planner's daemons: ``engine/pyspark_daemon.py`` quiets the
reading tasks' own), and again at shutdown. Those daemons write to the JVM's standard error, which the
daemon reads through a pipe (``watch``): such a traceback becomes one DEBUG line of the daemon's log, and
everything else is written to the daemon's standard error as it came.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterable
from typing import IO

__all__ = ["StderrFilter", "forward", "watch"]

log = logging.getLogger(__name__)

_TRACEBACK = "Traceback (most recent call last):"
_FLUSH_FAILED = "PySpark daemon failed to flush the output to the worker process:"
# The exception line of a worker whose socket Spark closed.
_STOPPED_WORKER = ("BrokenPipeError", "ConnectionResetError")
# A traceback held longer than this many lines is not a stopped worker's: it is written out as it came.
MAX_HELD_LINES = 64


class StderrFilter:
    """Lines in, lines out (``feed``), with each stopped worker's traceback taken out and counted."""

    def __init__(self) -> None:
        self._held: list[str] = []
        self.stopped_workers = 0

    def feed(self, line: str) -> list[str]:
        """The lines to write now, given the next ``line`` (with its newline)."""
        text = line.rstrip("\r\n")
        if not self._held:
            if text in (_TRACEBACK, _FLUSH_FAILED):
                self._held.append(line)
                return []
            return [line]
        self._held.append(line)
        if text.startswith(" ") or text == _TRACEBACK:
            if len(self._held) > MAX_HELD_LINES:
                return self._release()
            return []
        # The exception line ends the traceback.
        if text.startswith(_STOPPED_WORKER) and any("pyspark" in held and "daemon.py" in held for held in self._held):
            self._held = []
            self.stopped_workers += 1
            log.debug("a Python worker of Spark ended on its closed socket (%s): Spark stopped it, idle, or "
                      "killed its task", text)
            return []
        return self._release()

    def flush(self) -> list[str]:
        """What is held, at the end of the stream."""
        return self._release()

    def _release(self) -> list[str]:
        held, self._held = self._held, []
        return held


def forward(lines: Iterable[bytes], out: Callable[[], IO[str]], stream_filter: StderrFilter | None = None) -> None:
    """Write ``lines`` through ``stream_filter`` to the stream ``out()`` gives at each line, until they end.
    Nothing here may stop reading: a JVM whose standard error is not read blocks once the pipe is full."""
    stream_filter = stream_filter or StderrFilter()
    for raw in lines:
        _write(out, stream_filter.feed(raw.decode("utf-8", "replace")))
    _write(out, stream_filter.flush())


def _write(out: Callable[[], IO[str]], lines: list[str]) -> None:
    if not lines:
        return
    try:
        stream = out()
        stream.writelines(lines)
        stream.flush()
    except Exception:  # noqa: BLE001 (a closed or broken stderr: keep draining the pipe)
        pass


def watch(pipe: IO[bytes]) -> threading.Thread:
    """Forward the JVM's standard error (``pipe``) to this process's (``sys.stderr`` at each line), in a
    daemon thread."""
    thread = threading.Thread(target=forward, args=(iter(pipe.readline, b""), lambda: sys.stderr),
                              name="spark-stderr", daemon=True)
    thread.start()
    return thread
