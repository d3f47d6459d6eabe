"""Spark's Python daemon (``pyspark.daemon``), quiet about the tasks Spark kills.

A cancelled job's tasks are killed: the JVM closes the socket of each Python worker, whose forked
process then dies on ``BrokenPipeError`` or ``ConnectionResetError`` and prints its traceback, which
reads like a crash in the daemon's log. This module runs ``pyspark.daemon`` unchanged except that such a
traceback is not printed (every other one is). Spark starts it as its Python daemon
(``spark.python.daemon.module``, set by ``spark_session``); the executors' Python imports it, like the
Kafka data source.

It also sets the C heap's top pad (``keep_heap_pad``) before ``pyspark.daemon`` forks its workers, who
inherit it.
"""

from __future__ import annotations

import ctypes
import sys
import traceback
from typing import Any

__all__ = ["HEAP_TOP_PAD", "keep_heap_pad", "print_exc"]

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


def print_exc(*args: Any, **kwargs: Any) -> None:
    """``traceback.print_exc``, silent for the exception of a killed task."""
    if isinstance(sys.exc_info()[1], KILLED_TASK_ERRORS):
        return
    _original_print_exc(*args, **kwargs)


if __name__ == "__main__":
    traceback.print_exc = print_exc  # pyspark.daemon calls traceback.print_exc() in its forked workers
    keep_heap_pad()
    from pyspark import daemon

    daemon.manager()
