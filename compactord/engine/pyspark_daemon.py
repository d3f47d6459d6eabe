"""Spark's Python daemon (``pyspark.daemon``), quiet about the tasks Spark kills.

A cancelled job's tasks are killed: the JVM closes the socket of each Python worker, whose forked
process then dies on ``BrokenPipeError`` or ``ConnectionResetError`` and prints its traceback, which
reads like a crash in the daemon's log. This module runs ``pyspark.daemon`` unchanged except that such a
traceback is not printed (every other one is). Spark starts it as its Python daemon
(``spark.python.daemon.module``, set by ``spark_session``); the executors' Python imports it, like the
Kafka data source.

It also sets the C heap's top pad (``keep_heap_pad``) before ``pyspark.daemon`` forks its workers, who
inherit it, and imports what a reading task runs (``preload``), so that a new worker starts with it:

- Spark stops a Python worker that has been idle for a minute (``PythonWorkerFactory``, not configurable),
  so the first run after a pause, and any run with more tasks than live workers (more slots than the last
  run used), forks new ones. Each imported pyspark's worker, pyarrow, confluent-kafka and the engine again:
  0.5 CPU-s a worker, 1.8-2.3 s of wall time on a busy 2-core machine, before its first record. Forked
  from a daemon that has them, a worker starts in milliseconds.
- A worker Spark stops finds its socket closed when it flushes its output, and ends on the error (the JVM
  sets ``PYTHON_DAEMON_KILL_WORKER_ON_FLUSH_FAILURE``), which ``print_exc`` keeps quiet, as a killed task's.
  The data source planner's workers run under the stock ``pyspark.daemon``: ``engine/jvm_stderr.py`` folds
  theirs.
"""

from __future__ import annotations

import ctypes
import sys
import traceback
from typing import Any

__all__ = ["HEAP_TOP_PAD", "keep_heap_pad", "preload", "print_exc"]

_original_print_exc = traceback.print_exc
# The socket to the JVM was closed under the worker: Spark killed its task.
KILLED_TASK_ERRORS = (BrokenPipeError, ConnectionResetError)
# How much free memory glibc's malloc keeps at the top of each heap instead of giving it back (``M_TOP_PAD``;
# its default is 128 KiB). A reading task allocates and frees the same tens of MB over and over (librdkafka's
# fetch buffers, each window's lists, dicts and Arrow builders): given back each time, every page of them
# was faulted in and zeroed again. One task reading 250,000 records took ~27,000 page faults, ~8,000 with
# this pad. A full compaction of 1,000,000 distinct keys in 4 tasks: Spark's Python 1.28-1.33 CPU-s, against
# 1.41-1.42 without (16 MiB: 1.38, 32 MiB: 1.35); of 10,000 keys (ten runs each): 0.58 s against 0.63, while
# an incremental run took 0.15 s against 0.14 with the same CPU (in-process medians of 16 runs: 141-183 ms
# with it, 145-148 without: noise); the workers' peak RSS, summed, +300 MB. A worker keeps up to this much
# more memory (per heap that reached it) between tasks.
HEAP_TOP_PAD = 64 * 1024 * 1024
_M_TOP_PAD = -2  # mallopt's parameter number (malloc.h)


def keep_heap_pad(pad: int = HEAP_TOP_PAD) -> bool:
    """Have glibc's malloc keep ``pad`` bytes free at the top of its heaps; False where the C library is
    not glibc (no ``mallopt``: musl, macOS), which changes nothing."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt(_M_TOP_PAD, pad) == 1


def preload() -> None:
    """Import what every reading task runs, in the daemon, before it forks its workers. pyarrow starts a
    memory allocator's background thread (jemalloc's); jemalloc's fork handlers leave a forked child's
    allocator consistent, without that thread."""
    import confluent_kafka  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    import pyspark.worker  # noqa: F401

    import compactord.engine.early_start
    import compactord.engine.kafka_source  # noqa: F401


def print_exc(*args: Any, **kwargs: Any) -> None:
    """``traceback.print_exc``, silent for the exception of a killed task."""
    if isinstance(sys.exc_info()[1], KILLED_TASK_ERRORS):
        return
    _original_print_exc(*args, **kwargs)


if __name__ == "__main__":
    traceback.print_exc = print_exc  # pyspark.daemon calls traceback.print_exc() in its forked workers
    keep_heap_pad()
    preload()
    from pyspark import daemon

    daemon.manager()
