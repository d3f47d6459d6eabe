"""The one long-lived Spark session of the process, its warm-up, job groups and cancellation.

It is also the boundary where py4j/Spark errors become compactord's (``SparkError``,
``CompactionCancelled``).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import math
import os
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from compactord.config import Settings
from compactord.engine import jvm_launch
from compactord.errors import (
    CompactionCancelled,
    CompactordError,
    InsufficientDiskSpace,
    SparkError,
    StorageUnavailable,
)

if TYPE_CHECKING:
    from compactord.engine.job import JobWidths

__all__ = ["SparkSessionManager", "driver_task_errors"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# Our defaults; any spark.* key of the config overrides them.
_DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    # Compactions of a topic produce few shuffle rows (the reader drops losers); AQE coalesces them.
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.python.worker.reuse": "true",
    # The JVM and its Python workers (and the driver's Python, for results) talk over Unix domain sockets,
    # not TCP on loopback, where every Python task waited ~40 ms (its run: 41-56 ms for a function that does
    # nothing, 5-8 ms this way; an empty job of two tasks: 100-140 ms, 56-88 ms this way).
    "spark.python.unix.domain.socket.enabled": "true",
    # pyspark.daemon, without the traceback of each task a cancel kills (engine/pyspark_daemon.py)
    "spark.python.daemon.module": "compactord.engine.pyspark_daemon",
}
# A local master's driver JVM is also its executor. With reading tasks that write their part files
# themselves (``job.run_compaction_job``) it mostly schedules, and its tiered JIT's C2 compiler kept
# compiling Spark's scheduling code run after run: 0.25-0.33 CPU-s of the JVM's 0.5-0.7 per warm full
# compaction of 1,000,000 records, on the cores the reading tasks and the broker share. C2 now waits for
# 20 times the calls and loops it waits for by default: what a job calls a few thousand times stays
# compiled by C1 (the compiler's CPU fell to ~0.07 a run), while the row loops of a job whose rows do
# cross the JVM still reach C2 (5,000,000 distinct keys through the grouping job: 23.1 s, against 25.1 s
# with the defaults and 46.9 s with C1 alone, ``-XX:TieredStopAtLevel=1``). A cluster's executors keep
# their JVMs' defaults; setting ``spark.driver.extraJavaOptions`` replaces this.
# One exception, the other way: every job's closures go through Spark's closure cleaner, which reads their
# classes' bytecode with ASM (``org.apache.xbean.asm9.ClassReader``; ``readCode`` is a 5 KB method). Under the
# raised thresholds C2 compiled it in a burst around the 6th to 9th job after a start (100-240 ms of the
# compiler's CPU in each of 2-3 runs; ``-XX:+PrintCompilation`` named it), in the middle of real compactions.
# Its thresholds are scaled down (x0.01) so that C2 compiles it while the session warms up: in the first 8
# incremental runs after a start, no run's compiler CPU went over 40 ms (100-240 ms in 2-3 of them before).
LOCAL_DRIVER_JAVA_OPTIONS = ("-XX:Tier4InvocationThreshold=100000 -XX:Tier4MinInvocationThreshold=20000 "
                             "-XX:Tier4CompileThreshold=150000 -XX:Tier4BackEdgeThreshold=400000 "
                             "-XX:CompileCommand=quiet "
                             "-XX:CompileCommand=CompileThresholdScaling,org.apache.xbean.asm9.ClassReader::*,0.01")
# Cancelled job groups remembered at most: a group cancelled but never run (or already ended) is
# not cleaned up by its ``job_group``; the oldest such ids are forgotten first.
MAX_CANCELLED_GROUPS = 256
STOP_WAITS_FOR_START_S = 2.0  # stop() waits this long for a start under way
# How a full disk shows in a Java or Python stack trace of a failed job (ENOSPC, EDQUOT).
_DISK_FULL_SIGNS = ("No space left on device", "Disk quota exceeded")
# How a task's store that gave up (storageReadRetrySeconds, storageWriteRetrySeconds spent) shows in its trace.
_STORE_DOWN_SIGN = "compactord.errors.StorageUnavailable: "


# Spark's loggers of the tasks of a job: a cancelled job's tasks die with an error each (the Python worker's
# pipe closed under it), which they log with a stack trace as if it were a crash. The job's end reaches
# compactord as an exception, which it logs once, with the task id: a cancel as one INFO line, a real
# failure as one ERROR line with its cause (``_cause``). The ledger writer's "Aborting job" carries the
# same exception with its stack trace (a cancel during the write: final reads write as they read).
QUIET_LOGGERS = ("org.apache.spark.executor.Executor", "org.apache.spark.scheduler.TaskSetManager",
                 "org.apache.spark.scheduler.TaskSchedulerImpl", "org.apache.spark.api.python.PythonRunner",
                 "org.apache.spark.sql.execution.datasources.FileFormatWriter")


# A stop while a job runs (the warm-up's, at a SIGTERM during the start) ends its tasks' blocks under them: each
# logs an ERROR with a stack trace from its completion listeners ("Block broadcast_0 does not exist").
QUIET_AT_STOP_LOGGERS = ("org.apache.spark.TaskContextImpl",)


def _quiet_task_loggers(spark: Any, names: tuple[str, ...] = QUIET_LOGGERS) -> None:
    jvm = spark.sparkContext._jvm
    try:
        off = jvm.org.apache.logging.log4j.Level.OFF
        for name in names:
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, off)
    except Exception:  # another logging backend (a cluster's own log4j set-up): its levels stay as they are
        log.debug("Spark's task loggers not quietened", exc_info=True)


def _cause(text: str, exc: BaseException) -> str:
    """The telling line of a Spark error: the Python exception of a worker, else the first line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and not line.startswith(("at ", "org.apache", "py4j")):
            return line[:2000]
    return (lines[0] if lines else type(exc).__name__)[:2000]


@contextlib.contextmanager
def driver_task_errors(description: str) -> Iterator[None]:
    """The errors of a reading task run in the driver (a small run: ``kafka_source.run_writing_tasks_in_driver``)
    as ``SparkSessionManager.job_group`` gives the same task's in a Spark job: a full disk is
    ``InsufficientDiskSpace``, compactord's own errors (a store that is down, a cancel) stay as they are, and any
    other is a ``SparkError`` naming its cause.
    """
    try:
        yield
    except CompactordError:
        raise
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}"[:2000]
        full = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
        if full or any(sign in text for sign in _DISK_FULL_SIGNS):
            raise InsufficientDiskSpace(
                f"the reading task of {description} failed: no space left on the device ({text})") from exc
        raise SparkError(f"the reading task of {description} failed: {text}") from exc


def _started(rows: Iterator[Any]) -> Iterator[int]:
    """A warm-up task: its worker's process id, once every task of the stage runs."""
    from pyspark import BarrierTaskContext

    BarrierTaskContext.get().barrier()
    return iter([os.getpid()])


LIVENESS_SLICE_S = 1.0  # see SparkSessionManager.alive


def _ask_alive(spark: Any) -> bool:
    try:
        return not spark.sparkContext._jsc.sc().isStopped()
    except Exception:  # noqa: BLE001 (a JVM that cannot answer is not alive)
        return False


class SparkSessionManager:
    """Starts the session once, registers the Kafka data source, runs jobs under a job group."""

    def __init__(self, settings: Settings, app_name: str = "compactord") -> None:
        self._settings = settings
        self._app_name = app_name
        self._lock = threading.Lock()
        self._spark: Any = None
        self._jvm: jvm_launch.Jvm | None = None  # the JVM this manager started (None: none, or not its own)
        self._stopped = False
        self.warmed = False
        # The job groups this process cancelled: a failure of such a group's job is its cancellation.
        self._cancelled: OrderedDict[str, None] = OrderedDict()
        self._cancelled_lock = threading.Lock()

    @property
    def spark(self) -> Any:
        if self._spark is None:
            self.start()
        return self._spark

    def start(self) -> Any:
        with self._lock:
            if self._spark is not None:
                return self._spark
            if self._stopped:
                raise SparkError("the Spark session was stopped (the daemon is shutting down)")
            # Executors must run this interpreter (it has pyarrow, confluent-kafka and compactord).
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
            master = self._settings.spark_master
            if master.startswith("local"):
                os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            from pyspark.sql import SparkSession

            builder = SparkSession.builder.appName(self._app_name).master(master)
            conf = dict(_DEFAULT_CONF)
            if master.startswith("local"):
                conf["spark.driver.extraJavaOptions"] = LOCAL_DRIVER_JAVA_OPTIONS
            conf.update(self._settings.spark_conf)
            conf.setdefault("spark.executorEnv.PYSPARK_PYTHON", os.environ["PYSPARK_PYTHON"])
            for key, value in conf.items():
                builder = builder.config(key, value)
            try:
                self._jvm = jvm_launch.start_jvm(self._app_name, master, conf, self._settings) or self._jvm
                spark = builder.getOrCreate()
            except CompactordError:  # the JVM did not start: its reason, and the key behind it
                raise
            except Exception as exc:
                raise SparkError(f"the Spark session could not start on master {master!r}: "
                                 f"{_cause(str(exc), exc)}") from exc
            if self._stopped:  # stop() was called while it started, and did not wait
                spark.stop()
                if self._jvm is not None:
                    jvm_launch.stop_jvm(self._jvm)
                    self._jvm = None
                raise SparkError("the Spark session was stopped while it started (the daemon is shutting down)")
            spark.sparkContext.setLogLevel("ERROR")
            _quiet_task_loggers(spark)
            from compactord.engine.kafka_source import KafkaRangeDataSource

            spark.dataSource.register(KafkaRangeDataSource)
            self._spark = spark
            log.info("Spark session up: master %s, %d cores", master, spark.sparkContext.defaultParallelism)
            return spark

    @property
    def cores(self) -> int:
        return max(1, int(self.spark.sparkContext.defaultParallelism))

    def job_widths(self, rows: int) -> JobWidths:
        """The shuffle widths of a compaction job over ``rows`` records: (0, 0), i.e. the session's
        own, if the config sets ``spark.sql.shuffle.partitions``."""
        from compactord.engine.job import JobWidths, shuffle_partitions_for

        if "spark.sql.shuffle.partitions" in self._settings.spark_conf:
            return JobWidths(0, 0)
        return shuffle_partitions_for(rows, self.cores)

    def alive(self, timeout: float | None = None) -> bool:
        """False once the Spark JVM has died (the daemon then exits so that its supervisor restarts it),
        or, given ``timeout``, when it does not answer within that many seconds (a hung JVM: the py4j
        call would never return; it is left to a daemon thread)."""
        spark = self._spark
        if spark is None:
            return False
        if timeout is None:
            return _ask_alive(spark)
        answer: list[bool] = []
        answered = threading.Event()

        def ask() -> None:
            answer.append(_ask_alive(spark))
            answered.set()

        threading.Thread(target=ask, name="spark-alive", daemon=True).start()
        # Waited in slices, each counted as its length however long it took: a slice that returns late means that
        # this process did not run (SIGSTOP, a suspended VM, a starved host), and an answer that came meanwhile is
        # not the JVM's delay. One wait of ``timeout`` would call the JVM hung after any pause that long.
        for _ in range(max(1, math.ceil(timeout / LIVENESS_SLICE_S))):
            if answered.wait(min(LIVENESS_SLICE_S, timeout)):
                return answer[0]
        log.error("the Spark JVM did not answer a liveness check within %.1fs: it is hung", timeout)
        return False

    def warm_up(self, scratch: str | os.PathLike[str] | None = None) -> None:
        """Run the compaction job on an empty range: a full run, then an incremental one that reads the
        first one's output as its ledger; then the grouping job over a ledger of one row, which reads it,
        plans the data source and writes its result, all in Python (``engine.ledger_io``).

        A new session's first job is about 3 times slower than a warm one (planning a Python data
        source starts several Python workers, and the JVM compiles the job's code paths); the daemon is
        ready only after this, and its first real compaction, full or incremental, runs warm.
        """
        import dataclasses

        import pyarrow as pa

        from compactord.engine.job import job_spec, run_compaction_job
        from compactord.engine.kafka_source import OffsetRange
        from compactord.engine.strategies import ResolvedStrategy
        from compactord.engine.worker_store import locate
        from compactord.ledger.parts import write_part
        from compactord.model import RECORD_SCHEMA

        strategy = ResolvedStrategy.resolve("publishing-order", "timestamp", False)
        widths = self.job_widths(0)
        with tempfile.TemporaryDirectory(prefix="compactord-warmup-", dir=scratch) as tmp:
            ledger: list[str] = []
            for run in ("full", "incremental"):
                spec = job_spec(
                    self._settings, strategy, topic="warm-up", client_config={}, ranges=[OffsetRange(0, 0, 0)],
                    ledger_files=ledger, output_path=str(Path(tmp) / run), log_start={},
                    widths=widths, cores=self.cores,
                )
                self.run("warm-up", f"compactord warm-up ({run} compaction)",
                         functools.partial(run_compaction_job, self.spark, spec, strategy.strategy))
                ledger = sorted(str(f) for f in (Path(tmp) / run).glob("*.parquet"))
            # The grouping job and previews read through the data source (a final read's tasks run as plain
            # Python tasks), and read and write ledger files in Python tasks: their workers start now too.
            seed = Path(tmp) / "seed"
            seed.mkdir()
            row = {"partition": 0, "offset": 0, "key": b"k", "value": b"v"}
            write_part(pa.Table.from_pylist([row], schema=RECORD_SCHEMA), *locate(None, str(seed / "part-0.parquet")))
            grouping = dataclasses.replace(spec, final_reads=False, ledger_files=[str(seed / "part-0.parquet")],
                                           ledger_groups={}, output_path=str(Path(tmp) / "grouped"))
            self.run("warm-up", "compactord warm-up (the grouping job)",
                     lambda: run_compaction_job(self.spark, grouping, strategy.strategy))
        self.run("warm-up", "compactord warm-up (a Python worker per slot)", self._start_workers)
        self.warmed = True
        log.info("Spark session warmed up")

    def _start_workers(self) -> None:
        """A task in every slot at once (a barrier stage: Spark launches all of them together), so that each
        slot has its Python worker: the empty jobs above ran one task, and a run's first task in a new worker
        paid ~0.2 CPU-s of the worker's own start (PySpark's set-up of a worker, beside the modules
        ``pyspark_daemon`` preloads) before its first record. Spark stops a worker idle for a minute, so a
        run after a longer pause forks them again."""
        cores = self.cores
        self.spark.sparkContext.parallelize(range(cores), cores).barrier().mapPartitions(_started).collect()

    @contextlib.contextmanager
    def job_group(self, group_id: str, description: str) -> Iterator[None]:
        """Run the body's Spark jobs under ``group_id`` (this thread only), translating errors.

        :raises CompactionCancelled: a job failed after ``cancel_group(group_id)``.
        :raises SparkError: a job failed otherwise.
        """
        sc = self.spark.sparkContext
        sc.setJobGroup(group_id, description, interruptOnCancel=True)
        try:
            yield
        except CompactionCancelled:
            raise
        except Exception as exc:
            if self.was_cancelled(group_id):
                raise CompactionCancelled(f"Spark job group {group_id} was cancelled") from exc
            if type(exc).__module__.startswith(("py4j", "pyspark")):
                text = str(exc)
                if any(sign in text for sign in _DISK_FULL_SIGNS):
                    self._release_unclosed_files()
                    raise InsufficientDiskSpace(
                        f"Spark job of {description} failed: no space left on the device ({_cause(text, exc)})"
                    ) from exc
                if _STORE_DOWN_SIGN in text:
                    cause = text.rpartition(_STORE_DOWN_SIGN)[2].splitlines()[0][:2000]
                    raise StorageUnavailable(f"Spark job of {description} failed: {cause}") from exc
                raise SparkError(f"Spark job of {description} failed: {_cause(text, exc)}") from exc
            raise
        finally:
            with self._cancelled_lock:
                self._cancelled.pop(group_id, None)
            try:
                sc.setLocalProperty("spark.jobGroup.id", None)
                sc.setLocalProperty("spark.job.description", None)
            except Exception:  # noqa: BLE001, S110 (a gone JVM has no properties left to clear)
                pass

    def _release_unclosed_files(self) -> None:
        """A Parquet writer that fails on a full disk cannot close its file ("Unable to close
        resource"); the task's cleanup deletes the file, but the JVM keeps it open and its space taken
        until the stream is collected. Ask for a collection, so that the space comes back for the
        next run instead of at some later GC."""
        try:
            self._spark._jvm.java.lang.System.gc()
        except Exception:
            log.debug("asking the JVM for a garbage collection failed", exc_info=True)

    def cancel_group(self, group_id: str) -> None:
        """Cancel the group's running jobs and the ones it submits later.

        ``cancelJobGroup`` alone does nothing while no job has been submitted yet (a cold session
        spends seconds planning a Python data source), so the JVM's ``cancelJobGroupAndFutureJobs``
        is called too. The group is remembered as cancelled first, so that a job failing because of
        this call raises ``CompactionCancelled``.
        """
        with self._cancelled_lock:
            self._cancelled[group_id] = None
            self._cancelled.move_to_end(group_id)
            while len(self._cancelled) > MAX_CANCELLED_GROUPS:
                self._cancelled.popitem(last=False)
        if self._spark is None:
            return
        sc = self._spark.sparkContext
        try:
            sc.cancelJobGroup(group_id)
            sc._jsc.sc().cancelJobGroupAndFutureJobs(group_id)
        except Exception:
            log.warning("cancelling Spark job group %s failed", group_id, exc_info=True)

    def was_cancelled(self, group_id: str) -> bool:
        """Whether ``cancel_group(group_id)`` was called and the group's ``job_group`` has not ended."""
        with self._cancelled_lock:
            return group_id in self._cancelled

    def run(self, group_id: str, description: str, fn: Callable[[], T]) -> T:
        with self.job_group(group_id, description):
            return fn()

    def stop(self, wait_start_s: float = STOP_WAITS_FOR_START_S) -> None:
        """Stop the session, and the JVM this manager started: it returns once the JVM exited. A start still
        under way (a JVM starting takes seconds, minutes on a loaded machine) is not waited for longer than
        ``wait_start_s``: it stops the session it makes itself, and the JVM of one still starting exits when
        this process does (its gateway reads this process's end of a pipe)."""
        self._stopped = True
        if not self._lock.acquire(timeout=wait_start_s):
            log.info("the Spark session is still starting: not waited for")
            return
        try:
            if self._spark is not None:
                try:
                    _quiet_task_loggers(self._spark, QUIET_AT_STOP_LOGGERS)
                    self._spark.stop()
                except Exception as exc:  # noqa: BLE001 (the JVM may already be gone, e.g. SIGTERM to the whole group)
                    log.info("Spark session stop: %s", exc)
                finally:
                    self._spark = None
                    self.warmed = False
            if self._jvm is not None:
                jvm, self._jvm = self._jvm, None
                jvm_launch.stop_jvm(jvm)
        finally:
            self._lock.release()
