"""Spark's Python daemon (``pyspark.daemon``), quiet about the tasks Spark kills.

A cancelled job's tasks are killed: the JVM closes the socket of each Python worker, whose forked
process then dies on ``BrokenPipeError`` or ``ConnectionResetError`` and prints its traceback, which
reads like a crash in the daemon's log. This module runs ``pyspark.daemon`` unchanged except that such a
traceback is not printed (every other one is). Spark starts it as its Python daemon
(``spark.python.daemon.module``, set by ``spark_session``); the executors' Python imports it, like the
Kafka data source.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

__all__ = ["print_exc"]

_original_print_exc = traceback.print_exc
# The socket to the JVM was closed under the worker: Spark killed its task.
KILLED_TASK_ERRORS = (BrokenPipeError, ConnectionResetError)


def print_exc(*args: Any, **kwargs: Any) -> None:
    """``traceback.print_exc``, silent for the exception of a killed task."""
    if isinstance(sys.exc_info()[1], KILLED_TASK_ERRORS):
        return
    _original_print_exc(*args, **kwargs)


if __name__ == "__main__":
    traceback.print_exc = print_exc  # pyspark.daemon calls traceback.print_exc() in its forked workers
    from pyspark import daemon

    daemon.manager()
