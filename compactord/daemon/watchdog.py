"""The daemon's watchdog: a runtime (the Spark JVM) that died or hangs makes the daemon exit, so that its
supervisor restarts it; a compaction past ``compactionTaskTimeoutSeconds`` is aborted.

A liveness check that does not answer within ``jvm_check_timeout_s`` counts as a hung JVM. Why the daemon
is exiting is a fixed phrase (the probes answer it); what caused it goes to the log only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from compactord.config import Settings
from compactord.daemon.scheduler import TaskRegistry
from compactord.errors import ConfigError
from compactord.interfaces import EngineRuntime

__all__ = ["JVM_CHECK_TIMEOUT_S", "WATCH_EVERY_S", "Watchdog"]

log = logging.getLogger(__name__)
WATCH_EVERY_S = 2.0
JVM_CHECK_TIMEOUT_S = 30.0  # a JVM that does not answer a liveness check this long is hung


class Watchdog:
    def __init__(self, settings: Settings, runtime: EngineRuntime | None, registry: TaskRegistry,
                 jvm_check_timeout_s: float, each_pass: Callable[[], None]) -> None:
        """``runtime``: what compactions run on (None: nothing to watch). ``jvm_check_timeout_s`` (positive):
        how long a liveness check may take. ``each_pass``: called at every pass the runtime survives (the
        readiness refresh)."""
        self._settings = settings
        self._runtime = runtime
        self._registry = registry
        self._jvm_check_timeout_s = jvm_check_timeout_s
        self._each_pass = each_pass
        self.fatal: str | None = None
        self.fatal_cause: BaseException | None = None  # what made it fatal, if an exception did
        self.on_fatal: Callable[[], None] | None = None  # set by the server runner: ask the HTTP server to stop

    def problem(self) -> str | None:
        """Why the daemon is exiting, or None."""
        return self.fatal

    def run(self, stop: threading.Event) -> None:
        """Watch until ``stop`` is set or the runtime is found dead (a thread's target)."""
        while not stop.wait(WATCH_EVERY_S):
            # Bounded: a hung JVM never answers the py4j call, and waiting for it would hide the hang.
            runtime = self._runtime
            if runtime is not None and runtime.warmed and not runtime.alive(timeout=self._jvm_check_timeout_s):
                self.die("the Spark JVM died or does not answer")
                return
            self._enforce_task_timeout()
            self._each_pass()

    def _enforce_task_timeout(self) -> None:
        limit = self._settings.task_timeout_seconds
        now = time.time()
        for ctx in self._registry.tasks():
            overdue = (not ctx.done and ctx.started_at is not None
                       and now - ctx.started_at > ctx.progress.timeout_allowance(limit))
            if overdue and ctx.abort(TimeoutError(f"the compaction ran longer than compactionTaskTimeoutSeconds={limit}")):
                log.error("compaction of topic %s (task %s) timed out after %ds", ctx.topic, ctx.task_id, limit)

    def die(self, reason: str, cause: BaseException | None = None) -> None:
        """``reason`` is answered by the probes, so it is a fixed phrase; ``cause`` goes to the log only."""
        detail = f" ({cause})" if cause is not None else ""
        # A bad config value fails every start the same way: the exit code says so (2), and no restart helps.
        then = "exiting: fix the config" if isinstance(cause, ConfigError) else \
            "exiting so that the supervisor restarts compactord"
        log.critical("%s%s; %s", reason, detail, then)
        self.fatal = reason
        self.fatal_cause = cause
        if self.on_fatal is not None:
            self.on_fatal()
