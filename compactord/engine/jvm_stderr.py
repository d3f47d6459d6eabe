"""The Spark JVM's standard error, passed on line by line, without the tracebacks of Python workers Spark
stopped.

Spark stops a Python worker that has been idle for a minute (``PythonWorkerFactory``; not configurable), and
kills the workers of a cancelled job. Such a worker finds its socket closed, and the ``pyspark.daemon`` that
forked it prints the ``BrokenPipeError`` (or ``ConnectionResetError``) with its traceback: untimed lines,
three per run a minute after it (the data source planner's daemons: ``engine/pyspark_daemon.py`` quiets the
reading tasks' own), and again at shutdown. Those daemons write to the JVM's standard error, which the
daemon reads through a pipe (``StderrWatch``): such a traceback becomes one DEBUG line of the daemon's log, and
everything else is written to the daemon's standard error as it came.

While the JVM starts, its lines are held: a JVM that exits before its gateway answers (a bad ``spark.*``
value, no Java, too little memory) says why in them (``start_failure``), and the start's error carries that
reason instead of PySpark's bare ``JAVA_GATEWAY_EXITED``.
"""

from __future__ import annotations

import collections
import itertools
import logging
import re
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import IO

__all__ = ["StderrFilter", "StderrWatch", "forward", "start_failure"]

log = logging.getLogger(__name__)

_TRACEBACK = "Traceback (most recent call last):"
_FLUSH_FAILED = "PySpark daemon failed to flush the output to the worker process:"
# The exception line of a worker whose socket Spark closed.
_STOPPED_WORKER = ("BrokenPipeError", "ConnectionResetError")
# A traceback held longer than this many lines is not a stopped worker's: it is written out as it came.
MAX_HELD_LINES = 64
# The JVM's lines held while it starts, at most (the last ones are kept: a failed start's reason is at the end).
MAX_START_LINES = 1000
# Lines of a failed start that say nothing of its reason: a Java stack frame, log4j's lines below ERROR, and
# what every start prints.
_STACK_FRAME = re.compile(r"\s+at |\s*\.\.\. \d+ more")
_LOG4J_BELOW_ERROR = re.compile(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN) ")
_EVERY_START = ("WARNING: Using incubator modules", "Using Spark's default log4j profile",
                "Setting default log level to", "To adjust logging level use")


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
    except Exception:  # noqa: BLE001, S110 (a closed or broken stderr: keep draining the pipe)
        pass


class StderrWatch:
    """The JVM's standard error (``pipe``), read in a daemon thread from the JVM's start: held until
    ``release`` (the JVM started), then written to the stream ``out()`` gives at each line, through a
    ``StderrFilter``, until it ends. Held lines of a JVM that exited are ``held_lines``."""

    def __init__(self, pipe: IO[bytes], out: Callable[[], IO[str]] = lambda: sys.stderr) -> None:
        self._out = out
        self._filter = StderrFilter()
        self._lock = threading.Lock()
        self._held: collections.deque[bytes] | None = collections.deque(maxlen=MAX_START_LINES)
        self._thread = threading.Thread(target=self._read, args=(iter(pipe.readline, b""),), name="spark-stderr",
                                        daemon=True)
        self._thread.start()

    def _read(self, lines: Iterator[bytes]) -> None:
        for raw in lines:
            with self._lock:
                if self._held is not None:
                    self._held.append(raw)
                    continue
            forward(itertools.chain([raw], lines), self._out, self._filter)
            return
        with self._lock:  # the end, after a release and no line since
            if self._held is None:
                _write(self._out, self._filter.flush())

    def release(self) -> None:
        """Write what is held, and from now on each line as it comes."""
        with self._lock:  # the reader waits: the held lines come out first, in their order
            held, self._held = self._held, None
            for raw in held or ():
                _write(self._out, self._filter.feed(raw.decode("utf-8", "replace")))

    def held_lines(self, wait_s: float) -> list[str]:
        """The lines held so far, once the stream ended (waited for at most ``wait_s``: the JVM exited, but a
        process it started may still hold the pipe)."""
        self._thread.join(wait_s)
        with self._lock:
            return [raw.decode("utf-8", "replace").rstrip("\r\n") for raw in self._held or ()]


def start_failure(lines: Iterable[str], most: int = 3) -> str:
    """The reason a JVM gives for a failed start: the last ``most`` of its lines that say something (no stack
    frames, no log lines below ERROR, not what every start prints), joined by "; "."""
    telling = [line.strip() for line in lines
               if line.strip() and not _STACK_FRAME.match(line) and not _LOG4J_BELOW_ERROR.match(line)
               and not line.startswith(_EVERY_START)]
    return "; ".join(telling[-most:])
