"""The Spark JVM's standard error without the tracebacks of Python workers Spark stopped, held while the JVM starts,
and the reason of a failed start in the JVM's words (engine/jvm_stderr.py, engine/jvm_launch.py)."""

from __future__ import annotations

import io
import os

import pytest

from compactord.config import Settings
from compactord.engine.jvm_launch import failed_start
from compactord.engine.jvm_stderr import MAX_HELD_LINES, StderrFilter, StderrWatch, forward, start_failure
from compactord.errors import ConfigError, SparkError
from tests.support.waiting import wait_for

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
  File "/srv/app/compactord/engine/range_task.py", line 12, in run
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


# -- the JVM's start ---------------------------------------------------------------------------------

# What a JVM printed (standard error and output) when it did not start.
BAD_HEAP = """Invalid maximum heap size: -Xmxlots
Error: Could not create the Java Virtual Machine.
Error: A fatal exception has occurred. Program will exit.
"""
NO_HEAP = """Error occurred during initialization of VM
Could not reserve enough space for 107374182400KB object heap
"""
SUBMIT_REFUSED = """WARNING: Using incubator modules: jdk.incubator.vector
Using Spark's default log4j profile: org/apache/spark/log4j2-defaults.properties
26/11/28 19:41:29 WARN Utils: Set SPARK_LOCAL_IP if you need to bind to another address
Exception in thread "main" org.apache.spark.SparkException: Executor cores must be a positive number
	at org.apache.spark.deploy.SparkSubmitArguments.error(SparkSubmitArguments.scala:652)
	at org.apache.spark.deploy.SparkSubmit.main(SparkSubmit.scala)
"""
NO_JAVA = "/opt/v/pyspark/bin/spark-class: line 71: /nonexistent/bin/java: No such file or directory\n"
STARTED = """WARNING: Using incubator modules: jdk.incubator.vector
Using Spark's default log4j profile: org/apache/spark/log4j2-defaults.properties
Setting default log level to "WARN".
"""


def _watch(text: str) -> tuple[StderrWatch, io.StringIO, int]:
    """A watch of a real pipe holding ``text``, and the write end (still open)."""
    read_end, write_end = os.pipe()
    os.write(write_end, text.encode())
    out = io.StringIO()
    return StderrWatch(os.fdopen(read_end, "rb"), lambda: out), out, write_end


def test_a_starting_jvm_s_lines_are_held_then_released_in_order_through_the_filter() -> None:
    watch, out, write_end = _watch(STARTED)
    try:
        wait_for(lambda: watch.held_lines(0) == STARTED.splitlines(), 30, "the lines to be read and held")
        assert out.getvalue() == ""
        watch.release()
        assert out.getvalue() == STARTED
        os.write(write_end, (STOPPED_WORKER + "after\n").encode())
    finally:
        os.close(write_end)
    assert watch.held_lines(10) == []
    assert out.getvalue() == STARTED + "after\n"


def test_a_jvm_that_exited_while_starting_leaves_its_lines_held() -> None:
    watch, out, write_end = _watch(BAD_HEAP)
    os.close(write_end)
    assert watch.held_lines(10) == BAD_HEAP.splitlines()
    assert out.getvalue() == ""


@pytest.mark.parametrize(("text", "reason"), [
    (BAD_HEAP, ("Invalid maximum heap size: -Xmxlots; Error: Could not create the Java Virtual Machine.; "
                "Error: A fatal exception has occurred. Program will exit.")),
    (NO_HEAP, ("Error occurred during initialization of VM; Could not reserve enough space for 107374182400KB "
               "object heap")),
    (SUBMIT_REFUSED, ('Exception in thread "main" org.apache.spark.SparkException: Executor cores must be a '
                      'positive number')),
    ("", ""),
])
def test_a_failed_start_s_reason_is_its_last_telling_lines(text: str, reason: str) -> None:
    assert start_failure(text.splitlines()) == reason


def test_a_reason_of_a_key_the_config_set_is_that_key_s_config_error() -> None:
    settings = Settings(spark_conf={"spark.driver.memory": "lots"})
    error = failed_start(start_failure(BAD_HEAP.splitlines()), "local[2]", settings)
    assert isinstance(error, ConfigError)
    assert (error.key, error.value) == ("spark.driver.memory", "lots")
    assert str(error).startswith("config key spark.driver.memory='lots' is invalid: the Spark JVM did not start: "
                                 "Invalid maximum heap size: -Xmxlots;")
    cores = failed_start(start_failure(SUBMIT_REFUSED.splitlines()), "local[2]",
                         Settings(spark_conf={"spark.executor.cores": "abc"}))
    assert isinstance(cores, ConfigError) and cores.key == "spark.executor.cores"


def test_a_reason_of_no_key_the_config_set_is_a_spark_error_naming_where_to_look() -> None:
    no_heap = failed_start(start_failure(NO_HEAP.splitlines()), "local[2]", Settings())
    assert type(no_heap) is SparkError
    assert str(no_heap) == ("the Spark JVM did not start on master 'local[2]': Error occurred during initialization "
                            "of VM; Could not reserve enough space for 107374182400KB object heap "
                            "(see spark.driver.memory)")
    no_java = failed_start(start_failure([NO_JAVA]), "local[2]", Settings())
    assert type(no_java) is SparkError and "install Java 17, or set JAVA_HOME" in str(no_java)
    assert "/nonexistent/bin/java: No such file or directory" in str(no_java)
