"""The Spark JVM's standard error without the tracebacks of Python workers Spark stopped (engine/jvm_stderr.py)."""

from __future__ import annotations

import io

from compactord.engine.jvm_stderr import MAX_HELD_LINES, StderrFilter, forward

# As a data source planner's daemon printed it, a minute after a run, when Spark stopped its idle worker.
STOPPED_WORKER = """Traceback (most recent call last):
  File "/v/lib/python3.11/site-packages/pyspark/python/lib/pyspark.zip/pyspark/daemon.py", line 264, in manager
  File "/v/lib/python3.11/site-packages/pyspark/python/lib/pyspark.zip/pyspark/daemon.py", line 95, in worker
BrokenPipeError: [Errno 32] Broken pipe
"""
FLUSH_FAILED = "PySpark daemon failed to flush the output to the worker process:\n" + STOPPED_WORKER.replace(
    'line 264, in manager\n  File "/v/lib/python3.11/site-packages/pyspark/python/lib/pyspark.zip/pyspark/daemon.py", ',
    "").replace("BrokenPipe", "ConnectionReset")
OTHER_TRACEBACK = """Traceback (most recent call last):
  File "/srv/app/compactord/engine/range_read.py", line 12, in run
BrokenPipeError: [Errno 32] Broken pipe
"""
CRASH = """Traceback (most recent call last):
  File "/v/pyspark/daemon.py", line 95, in worker
MemoryError
"""


def _through(text: str) -> tuple[str, int]:
    out = io.StringIO()
    stream_filter = StderrFilter()
    forward((line.encode() for line in text.splitlines(keepends=True)), lambda: out, stream_filter)
    return out.getvalue(), stream_filter.stopped_workers


def test_a_stopped_workers_traceback_is_taken_out_and_counted():
    log4j = "26/11/26 23:43:30 WARN NativeCodeLoader: Unable to load native-hadoop library\n"
    written, stopped = _through(log4j + STOPPED_WORKER * 3 + FLUSH_FAILED + log4j)
    assert written == log4j * 2
    assert stopped == 4


def test_every_other_line_passes_as_it_came():
    text = OTHER_TRACEBACK + CRASH + "plain line\n" + "  indented, outside a traceback\n"
    assert _through(text) == (text, 0)


def test_a_traceback_longer_than_the_bound_is_written_out():
    long = "Traceback (most recent call last):\n" + '  File "pyspark/daemon.py", line 1, in f\n' * MAX_HELD_LINES
    written, stopped = _through(long + "BrokenPipeError: [Errno 32] Broken pipe\n")
    assert written == long + "BrokenPipeError: [Errno 32] Broken pipe\n"
    assert stopped == 0


def test_what_is_held_at_the_end_of_the_stream_is_written():
    unfinished = STOPPED_WORKER.rsplit("BrokenPipeError", 1)[0]
    assert _through(unfinished) == (unfinished, 0)
