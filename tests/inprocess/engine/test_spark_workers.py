"""Spark's Python workers as the daemon runs them: forked with the reading tasks' modules already imported
(engine/pyspark_daemon.py), and the JVM's standard error read through the daemon (engine/jvm_stderr.py)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from pyspark import SparkContext


def _worker_state(_: Any) -> list[tuple[int, bool, bool]]:
    # A worker's first task sees what the worker had when it was forked: this function imports nothing of
    # compactord (cloudpickle ships it by value).
    first = not hasattr(sys, "_compactord_test_seen")
    sys._compactord_test_seen = True  # type: ignore[attr-defined]
    return [(os.getpid(), first, "compactord.engine.kafka_source" in sys.modules and "pyarrow.parquet" in sys.modules)]


def test_a_new_python_worker_starts_with_the_reading_tasks_modules(spark_manager):
    sc = spark_manager.spark.sparkContext
    slots = sc.defaultParallelism
    # Workers are pooled by their environment: one of its own gets a daemon, and workers, of its own.
    sc.environment["COMPACTORD_TEST_NEW_WORKERS"] = str(time.monotonic_ns())
    try:
        results = sc.parallelize(range(slots * 3), slots * 3).mapPartitions(
            lambda rows: _worker_state(list(rows))).collect()
    finally:
        del sc.environment["COMPACTORD_TEST_NEW_WORKERS"]
    firsts = [preloaded for _pid, first, preloaded in results if first]
    assert firsts, f"no task ran in a new worker: {results}"
    assert all(firsts), f"workers forked without the reading tasks' modules: {results}"


def test_the_jvms_standard_error_reaches_the_daemons(spark_manager, capsys):
    jvm_stderr = os.readlink(f"/proc/{SparkContext._gateway.proc.pid}/fd/2")
    assert jvm_stderr.startswith("pipe:") and jvm_stderr != os.readlink("/proc/self/fd/2")  # read, not inherited
    marker = f"compactord-test-{os.getpid()}-{time.monotonic_ns()}"
    spark_manager.spark.sparkContext._jvm.java.lang.System.err.println(marker)
    seen = ""
    for _ in range(200):  # the forwarding thread writes it soon; no bound on how soon is asserted
        seen += capsys.readouterr().err
        if marker in seen:
            break
        time.sleep(0.05)
    assert marker in seen


def _daemon_workers() -> dict[int, int]:
    """Per running ``compactord.engine.pyspark_daemon``: how many workers it has forked that are alive."""
    daemons: dict[int, int] = {}
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if b"compactord.engine.pyspark_daemon" in cmdline:
            parents[int(entry)] = parent
    for pid, parent in parents.items():
        if parent in parents:  # a worker: forked by a daemon, so its command line is the daemon's
            daemons[parent] = daemons.get(parent, 0) + 1
        else:
            daemons.setdefault(pid, 0)
    return daemons


def test_the_warm_up_starts_a_python_worker_in_every_slot(spark_manager):
    spark_manager.warm_up()
    assert max(_daemon_workers().values(), default=0) >= spark_manager.cores, _daemon_workers()
