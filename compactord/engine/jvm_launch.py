"""The session's Spark JVM, started as PySpark's builder starts it (``launch_gateway``), with three differences:

- Its standard error and output are read through a pipe from their first line (``jvm_stderr.StderrWatch``): a
  JVM that exits before its gateway answers gives its own reason, and the setting behind it is named
  (``failed_start``).
- It ignores SIGTERM. ``timeout``, ``docker stop`` without an init and a supervisor that signals the whole
  process group send it to the JVM too, and a JVM that died under the daemon's shutdown made it log py4j
  tracebacks and PySpark's EOFError. The daemon stops its JVM itself, as after a SIGTERM to the daemon alone
  (systemd's ``KillMode=mixed``); SIGKILL still ends it. Spark's Python workers are in a process group of their
  own (``pyspark.daemon``'s), which such a signal does not reach.
- ``stop_jvm`` waits for it to exit. The JVM leaves when its standard input closes (PySpark's gateway reads it
  for that), which would otherwise be at this process's exit: the JVM outlived the process for a moment.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compactord.config import Settings
from compactord.engine import jvm_stderr
from compactord.errors import CompactordError, ConfigError, SparkError

__all__ = ["Jvm", "failed_start", "start_jvm", "stop_jvm"]

log = logging.getLogger(__name__)

STDERR_END_WAIT_S = 10.0  # a failed start: how long its standard error may take to end, after the JVM exited
EXIT_WAIT_S = 30.0  # stop_jvm: how long the JVM may take to exit once its standard input is closed
_MEMORY = "a memory size that the JVM accepts and this host can give, e.g. 1g or 512m"
_POSITIVE = "a positive whole number"
# Signs, in a failed start's reason, of the setting behind it: (signs, the spark.* key, what it should be). The
# JVM's own words, then spark-submit's checks of its arguments.
_SETTING_SIGNS = (
    (("heap size", "object heap"), "spark.driver.memory", _MEMORY),
    (("Unrecognized VM option", "Unrecognized option", "Improperly specified VM option"),
     "spark.driver.extraJavaOptions", "options that this host's Java accepts"),
    (("Driver memory",), "spark.driver.memory", _MEMORY),
    (("Executor memory",), "spark.executor.memory", _MEMORY),
    (("Executor cores",), "spark.executor.cores", _POSITIVE),
    (("Total executor cores",), "spark.cores.max", _POSITIVE),
    (("Number of executors",), "spark.executor.instances", _POSITIVE),
)
_NO_JAVA = ("JAVA_HOME is not set", "bin/java: No such file or directory", "java: not found",
            "java: command not found")


@dataclass(frozen=True)
class Jvm:
    """A JVM this process started: its process, and PySpark's gateway to it."""

    process: subprocess.Popen[bytes]
    gateway: Any


def _ignore_sigterm() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class _PopenArgs(dict[str, Any]):
    """``launch_gateway``'s Popen arguments. It sets its own ``preexec_fn`` (SIGINT ignored), which would
    replace ours: ours runs after it instead."""

    def __setitem__(self, key: str, value: Any) -> None:
        if key == "preexec_fn" and value is not _ignore_sigterm:
            value = _then_ignore_sigterm(value)
        super().__setitem__(key, value)


def _then_ignore_sigterm(theirs: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        theirs()
        _ignore_sigterm()

    return both


def start_jvm(app_name: str, master: str, conf: dict[str, str], settings: Settings) -> Jvm | None:
    """Start the JVM and PySpark's gateway to it; None when this process has one already, or was started by
    spark-submit (which made it).

    :raises ConfigError: the JVM did not start, because of the value of the key it names.
    :raises SparkError: the JVM did not start, for the reason it says (no Java, too little memory...).
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return None
    spark_conf = SparkConf().setAppName(app_name).setMaster(master).setAll(list(conf.items()))
    read_end, write_end = os.pipe()
    watch = jvm_stderr.StderrWatch(os.fdopen(read_end, "rb"))
    try:
        gateway = launch_gateway(spark_conf, popen_kwargs=_PopenArgs(
            # HotSpot writes why it cannot start ("Could not reserve enough space for ... object heap") on its
            # standard output: both are read.
            stdout=write_end, stderr=write_end, preexec_fn=_ignore_sigterm))
    except Exception as exc:
        os.close(write_end)  # the JVM exited: the pipe ends once this copy of its end is closed
        reason = jvm_stderr.start_failure(watch.held_lines(STDERR_END_WAIT_S)) or str(exc)
        raise failed_start(reason, master, settings) from exc
    os.close(write_end)
    watch.release()
    SparkContext._ensure_initialized(gateway=gateway)
    return Jvm(gateway.proc, gateway)


def failed_start(reason: str, master: str, settings: Settings) -> CompactordError:
    """The error of a JVM that did not start for ``reason`` (its own words): a ``ConfigError`` when a key of the
    config caused it, else a ``SparkError`` that names the setting to look at, where it can."""
    user = settings.spark_conf
    hint = ""
    for signs, key, allowed in _SETTING_SIGNS:
        if any(sign in reason for sign in signs):
            if key in user:
                return ConfigError(key, user[key], f"the Spark JVM did not start: {reason}; expected {allowed}")
            hint = f" (see {key})"
            break
    else:
        named = [key for key in user if key in reason]
        if named:
            return ConfigError(named[0], user[named[0]], f"the Spark JVM did not start: {reason}")
        if any(sign in reason for sign in _NO_JAVA):
            hint = " (no Java found: install Java 17, or set JAVA_HOME)"
    return SparkError(f"the Spark JVM did not start on master {master!r}: {reason}{hint}")


def stop_jvm(jvm: Jvm, wait_s: float = EXIT_WAIT_S) -> None:
    """Once its session stopped: close the gateway and the JVM's standard input, and wait for the JVM to exit
    (killed after ``wait_s``). A later session in this process starts a JVM of its own."""
    from pyspark import SparkContext

    try:
        jvm.gateway.shutdown()
    except Exception:  # its connections may be gone with the JVM
        log.debug("closing the gateway to the Spark JVM failed", exc_info=True)
    SparkContext._gateway = None
    SparkContext._jvm = None
    if jvm.process.stdin is not None:
        with contextlib.suppress(OSError):
            jvm.process.stdin.close()
    try:
        jvm.process.wait(wait_s)
    except subprocess.TimeoutExpired:
        log.warning("the Spark JVM (pid %d) did not exit within %.0fs of its session's stop: killed",
                    jvm.process.pid, wait_s)
        jvm.process.kill()
        jvm.process.wait()
