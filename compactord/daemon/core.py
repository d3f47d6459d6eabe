"""``compactord run``: one process holding the compaction service factory (and its runtime: the Spark
session of the default factory), the task registry, the backlog monitor and the HTTP server.

Start-up: lock (or lease) the ledger root (a second daemon on the same root refuses to start), resolve the
factory, serve HTTP at once (``/healthz`` answers; ``/readyz`` answers 200 with ``"reads": true`` and
``"compactions": false``), then start and warm the factory's runtime in the background
(``interfaces.RuntimeOwner``; a factory without one has nothing to start). Compactions can run once the
runtime is warm and the broker answers; reads need neither.

The probes never wait on the broker: a thread of its own pings it, with a client of its own
(``broker_watch.BrokerWatch``). Nor on the ledger root's store: once one of its requests fails, a thread
probes it until it answers again, and the ledger reads answer 503 at once meanwhile
(``store_watch.StoreWatch``).

If the runtime (the Spark JVM) dies or hangs (a liveness check that does not answer within
``jvm_check_timeout_s``), the daemon exits non-zero so that its supervisor restarts it. SIGTERM:
cancellable tasks are cancelled, a switching task finishes, the runtime stops, exit code 0.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from compactord.config import Settings
from compactord.daemon.backlogs import BacklogCache
from compactord.daemon.broker_watch import BrokerWatch
from compactord.daemon.identity import TopicIdentities
from compactord.daemon.history import RunHistory, RunRecord, UnrecordedRuns
from compactord.daemon.metrics import Metrics
from compactord.daemon.monitor import BacklogMonitor
from compactord.daemon.policies import PolicyStore, TopicPolicies
from compactord.daemon.registry import TaskRegistry
from compactord.daemon.store_watch import StoreWatch
from compactord.errors import (
    BrokerUnavailable,
    CompactionAlreadyRunning,
    CompactordError,
    ConfigError,
    LedgerRootUnwritable,
    PluginLoadError,
    StorageUnavailable,
)
from compactord.interfaces import (
    BrokerMetadata,
    CompactionServiceFactory,
    EngineRuntime,
    RuntimeOwner,
    ServiceContext,
    StrategyCatalog,
)
from compactord.kafka.admin import KafkaAdmin
from compactord.ledger import footer_cache
from compactord.ledger.store import DAEMON_DIR, LedgerStore
from compactord.refs import resolve_ref
from compactord.storage import open_store
from compactord.task import CompactionTaskCtx, TaskState

__all__ = ["Daemon", "Readiness"]

log = logging.getLogger(__name__)
WATCH_EVERY_S = 2.0
JVM_CHECK_TIMEOUT_S = 30.0  # a JVM that does not answer a liveness check this long is hung
EXIT_SPARK_DIED = 70


@dataclass(frozen=True)
class Readiness:
    """What the daemon can serve now (``/readyz``): ledger reads, compactions, and why not."""

    reads: bool
    compactions: bool
    problems: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return "ready" if self.compactions else "degraded"


def load_factory(settings: Settings) -> CompactionServiceFactory:
    key, ref = "compactionServiceFactoryClassName", settings.compaction_service_factory_class_name
    cls = resolve_ref(key, ref)
    if not (isinstance(cls, type) and issubclass(cls, CompactionServiceFactory)):
        raise PluginLoadError(key, ref, "the class must subclass compactord.interfaces.CompactionServiceFactory")
    return cls()


def allowed_strategies(settings: Settings, factory: CompactionServiceFactory) -> tuple[str, ...]:
    """What a topic's policy may choose: the factory's catalog (``interfaces.StrategyCatalog``), else
    ``compactionStrategy`` and the ``compactionStrategyPlugins`` references."""
    if isinstance(factory, StrategyCatalog):
        return factory.allowed_strategies()
    return tuple(dict.fromkeys([settings.compaction_strategy, *settings.strategy_plugins]))


def _open_store(settings: Settings, metrics: Metrics) -> tuple[LedgerStore, list[str]]:
    """The open store, and the topics whose deletion a restart interrupted (``open()`` completed it). An
    object store is checked first (its bucket, credentials, endpoint, and that it enforces conditional
    writes); its requests feed ``metrics``. A local root is locked; an S3 root is leased
    (``ledger/lease.py``, for storageLeaseSeconds).

    :raises LedgerRootUnwritable: the root cannot be created or written (read-only, not mounted), or an
        object store refuses the check."""
    root = settings.compacted_ledger_root
    objects = open_store(root, settings, observer=metrics.storage_request)
    check = getattr(objects, "check", None)
    if check is not None:
        check("compactedLedgerRoot")
    store = LedgerStore(root, objects, lease_seconds=settings.storage_lease_seconds)
    try:
        pending = [t for t in store.topics() if store.deletion_pending(t)]
        return store.open(), pending
    except CompactordError:  # LedgerRootUnwritable, InsufficientDiskSpace, LedgerRootLocked: as they are
        raise
    except OSError as exc:
        raise LedgerRootUnwritable(
            f"ledger root {store.root} cannot be opened: {exc.strerror or exc}; compactedLedgerRoot must be a "
            "writable directory on a mounted file system", root=str(store.root)) from exc


class Daemon:
    def __init__(self, settings: Settings, spark: Any = None,
                 broker: BrokerMetadata | None = None, jvm_check_timeout_s: float = JVM_CHECK_TIMEOUT_S) -> None:
        """``spark``: a Spark session manager to share (tests), given to the factory in its ``ServiceContext``
        (which then does not stop it); None: a factory that uses Spark builds its own.
        ``broker``: the broker-metadata seam (default: kafka-python against kafkaBootstrapServers).
        ``jvm_check_timeout_s``: how long the watchdog waits for the JVM to answer before it calls it hung."""
        if not jvm_check_timeout_s > 0:
            raise ValueError(f"jvm_check_timeout_s must be positive, got: {jvm_check_timeout_s!r}")
        self.settings = settings
        self._jvm_check_timeout_s = jvm_check_timeout_s
        self.metrics = Metrics(snapshot=self._snapshot)  # before the store: it counts the store's requests
        footer_cache.SHARED.resize(settings.storage_metadata_cache_bytes)  # one cache for every reader
        self.store, deleted = _open_store(settings, self.metrics)
        self.history = RunHistory(self.store.objects, settings.compaction_history_max_runs,
                                  settings.compaction_history_max_age_days)
        for topic in deleted:  # the rest of the topic went in open()
            self._delete_history(topic)
        self.admin: BrokerMetadata = broker or KafkaAdmin(settings, observer=self.metrics.broker_request)
        self._broker_probe: BrokerMetadata = broker or KafkaAdmin(settings)
        # The reads' identity checks have a client of their own: they never queue behind a monitor pass.
        self._identity_broker: BrokerMetadata = broker or KafkaAdmin(settings)
        try:
            self.factory = load_factory(settings)
            self.factory.initialize(ServiceContext(settings, spark=spark, store=self.store, broker=self.admin))
        except BaseException:
            self._close_broker_clients()
            self.store.close()
            raise
        # What the factory runs on (Spark's session and JVM), started in the background; None: nothing to start.
        self.runtime: EngineRuntime | None = self.factory.runtime() if isinstance(self.factory, RuntimeOwner) \
            else None
        self.policies = PolicyStore(self.store, allowed_strategies(settings, self.factory))
        self._apply_stored_strategies()
        self.registry = TaskRegistry(self.factory, settings.max_concurrent_tasks, settings.monitor_interval_seconds,
                                     on_end=self._task_ended, release_after_s=settings.task_timeout_seconds,
                                     recorder=self._record_run)
        self.monitor = BacklogMonitor(settings, self.admin, self.store, self.registry, self.policies, self.metrics,
                                      store_problem=lambda: self.write_problem(), history_last=self.history.last)
        self.backlogs = BacklogCache(self.monitor, self.registry)
        self.identities = TopicIdentities(self._identity_broker, self.broker_problem, self.monitor.last_identity)
        self.fatal: str | None = None
        self.fatal_cause: BaseException | None = None  # what made it fatal, if an exception did
        self.embedded_broker = False  # set by the server runner when it started the bundled broker
        self.on_fatal: Any = None  # set by the server runner: ask the HTTP server to stop
        self.on_warm: Any = None  # set by the server runner: called once the runtime is warm
        self._broker = BrokerWatch(self._broker_probe, settings.kafka_request_timeout_ms / 1000)
        self._quarantined = 0  # the last count of quarantined ledgers, shown while the store is down
        self._unrecorded = UnrecordedRuns()  # runs that ended while the store was down
        self._store_watch = StoreWatch(self.store.objects, settings.storage_read_retry_seconds + 1.0,
                                       on_up=self._record_unrecorded)
        self._root_problem = self._check_root()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._last_success: dict[str, float] = {}
        self._load_last_successes()

    # -- start-up and watchdogs -----------------------------------------------------------------

    def start(self) -> None:
        for name, target, args in (("runtime-start", self._start_runtime, ()), ("watchdog", self._watch, ()),
                                   ("broker-probe", self._broker.run, (self._stop,)),
                                   ("store-probe", self._store_watch.run, (self._stop,))):
            thread = threading.Thread(target=target, args=args, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _start_runtime(self) -> None:
        if self.runtime is not None:
            try:
                scratch = self.store.root / DAEMON_DIR / "tmp" if self.store.local else None  # None: the host's
                self.runtime.start(scratch)
            except Exception as exc:
                if not self._stop.is_set():
                    self._die("the Spark session could not start", exc)
                return
        if self.on_warm is not None:
            self.on_warm()
        self.monitor.start()
        waiting = "Spark is warm; waiting for the broker" if self.runtime is not None else "waiting for the broker"
        log.info("compactord is ready" if not self.readiness_problems() else waiting)

    def broker_problem(self) -> str | None:
        """Why the broker counts as unreachable now, or None; from memory only (``BrokerWatch.problem``)."""
        return self._broker.problem()

    def store_problem(self) -> str | None:
        """Why the ledger root's store counts as down now, or None; from memory only (``StoreWatch.problem``)."""
        return self._store_watch.problem()

    def lease_problem(self) -> str | None:
        """Why this daemon may not write its S3 root until its lease is renewed (the store failed the renewals
        for two thirds of the lease), or None; from memory only (``Lease.overdue``). Fixed phrases and numbers
        only: a refused trigger answers it as it is (the store's errors are in the log)."""
        overdue = self.store.lease.overdue() if self.store.lease is not None else None
        if overdue is None:
            return None
        return (f"the ledger root's lease has not been renewed for {overdue:.1f} s (storageLeaseSeconds="
                f"{self.settings.storage_lease_seconds}): no compaction starts until it is, since another daemon "
                "may take the root over (GET /readyz says when compactions can run again; the store's errors are "
                "in the daemon's log)")

    def write_problem(self) -> str | None:
        """Why no compaction may start now for want of its store (it does not answer, or the root's lease is
        not held), or None; from memory only. A trigger is refused with it, and the monitor starts no run."""
        return self.store_problem() or self.lease_problem()

    def store_failed(self, exc: StorageUnavailable) -> None:
        """A request to the store failed: it is down until a probe finds it answering."""
        self._store_watch.failed(exc.message)

    def _check_root(self) -> str | None:
        if not self.store.local:
            return None  # an object store's requests fail with storage_unavailable; there is no folder to look at
        root = self.store.root
        return None if root.is_dir() and os.access(root, os.R_OK | os.X_OK) else "the ledger root is not readable"

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_EVERY_S):
            # Bounded: a hung JVM never answers the py4j call, and waiting for it would hide the hang.
            runtime = self.runtime
            if runtime is not None and runtime.warmed and not runtime.alive(timeout=self._jvm_check_timeout_s):
                self._die("the Spark JVM died or does not answer")
                return
            self._root_problem = self._check_root()
            self._enforce_task_timeout()
            self.metrics.ready.set(0 if self.readiness_problems() else 1)

    def _enforce_task_timeout(self) -> None:
        limit = self.settings.task_timeout_seconds
        now = time.time()
        for ctx in self.registry.tasks():
            if not ctx.done and ctx.started_at is not None and now - ctx.started_at > ctx.progress.timeout_allowance(limit):
                if ctx.abort(TimeoutError(f"the compaction ran longer than compactionTaskTimeoutSeconds={limit}")):
                    log.error("compaction of topic %s (task %s) timed out after %ds", ctx.topic, ctx.task_id, limit)

    def _die(self, reason: str, cause: BaseException | None = None) -> None:
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

    def _apply_stored_strategies(self) -> None:
        for topic in self.store.topics():
            try:
                policies = self.policies.get(topic)
                if policies.strategy is not None:
                    self.factory.set_topic_strategy(topic, policies.strategy)
                self._apply_limits(topic, policies)
            except CompactordError as exc:
                log.error("topic %s: its stored policies are not applied: %s", topic, exc)

    def liveness_problem(self) -> str | None:
        return self.fatal

    def readiness_problems(self) -> list[str]:
        """Why compactions cannot run now (empty: they can), in fixed phrases: ``/readyz`` answers them to
        callers without a token; the details (broker addresses, exception texts) are logged where they
        happen."""
        problems = []
        if self.fatal:
            problems.append(self.fatal)
        if self._root_problem:
            problems.append(self._root_problem)
        if self.store.lease is not None and self.store.lease.lost:
            problems.append("another daemon took the ledger root's lease over")
        if self.lease_problem():
            problems.append("the ledger root's lease is not renewed yet (the store failed its renewals)")
        if self.runtime is not None and not self.runtime.warmed:
            problems.append("the Spark session is starting (not warmed up yet)")
        if self.broker_problem():
            problems.append("the broker does not answer")
        if self.store_problem():
            problems.append("the ledger root's store does not answer")
        return problems

    def readiness(self) -> Readiness:
        """From memory only (the probes call it on the event loop). Reads need the ledger root and its
        store, not the broker nor Spark."""
        problems = self.readiness_problems()
        reads = not self.fatal and not self._root_problem and not self.store_problem()
        return Readiness(reads=reads, compactions=not problems, problems=problems)

    def _close_broker_clients(self) -> None:
        self.admin.close()
        for client in (self._broker_probe, self._identity_broker):
            if client is not self.admin:
                client.close()

    def shutdown(self) -> None:
        """Cancel what can be cancelled, let a switching task finish, stop the runtime (Spark)."""
        log.info("shutting down")
        started = time.monotonic()
        self._stop.set()
        self.monitor.stop()
        self.registry.shutdown(timeout=max(30.0, self.settings.cancel_timeout_seconds))
        self._record_at_stop()
        try:
            self.factory.close()
        finally:
            self._close_broker_clients()
            if self.fatal is None and self.runtime is not None:
                self.runtime.stop()
            self.store.close()
            log.info("stopped in %.1fs", time.monotonic() - started)

    # -- what the API asks ----------------------------------------------------------------------

    def require_topic(self, topic: str) -> None:
        """:raises TopicNotFound: the broker lacks it. :raises BrokerUnavailable: the broker is down."""
        self.admin.partitions(topic)

    def require_known_topic(self, topic: str) -> None:
        """Before a request stores something of ``topic``: it has state here already (a ledger, a task),
        or the broker has it; no folder is made for a name that exists nowhere.

        :raises TopicNotFound: neither. :raises BrokerUnavailable: the broker is down (and it has no state).
        """
        if self.registry.existing_service(topic) is None and self.registry.live(topic) is None:
            problem = self.broker_problem()
            if problem:  # known to be down: answer at once rather than wait out a request timeout
                raise BrokerUnavailable(problem)
            self.require_topic(topic)

    def delete_topic(self, topic: str, timeout: float) -> tuple[bool, CompactionTaskCtx | None]:
        """Stop the topic's task, then remove its ledgers, horizon and policies; True if all done now."""
        # Durable first: a deletion that a crash or a restart interrupts completes at the next start.
        self.store.mark_deleting(topic)
        outcome = self.registry.stop_topic(topic, timeout * 0.8)
        task = outcome.task if outcome else None
        if outcome is None or outcome.stopped:
            self._delete_now(topic)
            return True, task

        def finish() -> None:
            assert task is not None
            task.worker_done.wait(self.settings.task_timeout_seconds)
            self._delete_now(topic)

        threading.Thread(target=finish, name=f"delete-{topic}", daemon=True).start()
        return False, task

    def _delete_now(self, topic: str) -> None:
        service = self.registry.existing_service(topic)
        try:
            if service is not None:
                service.delete()
        except CompactionAlreadyRunning:
            log.warning("topic %s: a new compaction started while it was being deleted; not deleted", topic)
            self.store.unmark_deleting(topic)
            return
        self._delete_history(topic)  # while the deletion mark stands: a restart completes the deletion
        self.store.delete_topic(topic)  # policies and marks too (the deletion mark last)
        # Everything kept in memory of the topic goes with it: history, the broker's view, metric series.
        self.factory.set_topic_strategy(topic, None)
        self._apply_limits(topic, None)
        self.registry.forget(topic)
        self.monitor.forget(topic)
        self.identities.forget(topic)
        self.backlogs.forget(topic)
        self.metrics.forget(topic)
        self._last_success.pop(topic, None)
        log.info("topic %s deleted: ledgers, horizon, policies and run history removed", topic)

    def set_policies(self, topic: str, policies: TopicPolicies | None) -> None:
        if policies is None:
            self.policies.delete(topic)
        else:
            self.policies.put(topic, policies)
        self.factory.set_topic_strategy(topic, policies.strategy if policies is not None else None)
        self._apply_limits(topic, policies)

    def _apply_limits(self, topic: str, policies: TopicPolicies | None) -> None:
        """The policy's key expiry and read budget, to the engine (None: the broker-wide settings)."""
        self.factory.set_topic_limits(
            topic, key_ttl_ms=policies.keyTtlMs if policies is not None else None,
            max_read_bytes_per_second=policies.maxReadBytesPerSecond if policies is not None else None)

    def strategy_name(self, topic: str) -> str:
        """The strategy in force for ``topic``: its policy's, else the configured one."""
        try:
            chosen = self.policies.get(topic).strategy
        except CompactordError:
            chosen = None
        return chosen or self.settings.compaction_strategy

    # -- run history ----------------------------------------------------------------------------

    def _record_run(self, ctx: CompactionTaskCtx, final: TaskState) -> None:
        """The task's end recorder: the run is in the history before anyone sees the end; or, when the store
        is down, once it answers again (``_record_unrecorded``)."""
        record = RunRecord.of_task(ctx, final)
        # A run refused for want of the root's lease (not renewed in time) is no sign that the store is down.
        lease_overdue = self.lease_problem() is not None
        if ctx.error_type == StorageUnavailable.code and self.store_problem() is None and not lease_overdue:
            self._store_watch.failed(ctx.error or "a compaction's request to the store failed")
        if self.store_problem() is None:  # known down: the append would wait out the write budget in vain
            try:
                self._record_unrecorded()
                self.history.append(record)
                return
            except StorageUnavailable as exc:
                self.store_failed(exc)
            except (CompactordError, OSError) as exc:  # the topic's objects at fault: its error alone
                log.error("topic %s: run %s not recorded in the run history: %s", ctx.topic, ctx.task_id, exc)
                self.metrics.history_failures.labels(ctx.topic).inc()
                return
        log.warning("topic %s: run %s is recorded in the run history once the store answers", ctx.topic,
                    ctx.task_id)
        self._unrecorded.add(record)

    def _record_unrecorded(self) -> None:
        """The runs that ended while the store was down, into the history, oldest first (once it answers,
        and before the next run's).

        :raises StorageUnavailable: the store failed again (the rest are kept)."""
        self._unrecorded.record(self.history.append)

    def _record_at_stop(self) -> None:
        """The runs still waiting for the store, recorded once more before the daemon stops; those it cannot
        record are named in the log (they are kept in memory only)."""
        if not self._unrecorded:
            return
        why = self.store_problem()  # known down: an append would wait out the write budget in vain
        if why is None:
            try:
                self._record_unrecorded()
                return
            except (CompactordError, OSError) as exc:
                why = str(exc)
        self._unrecorded.give_up(why)

    def _delete_history(self, topic: str) -> None:
        try:
            self.history.delete(topic)
        except OSError as exc:
            log.error("topic %s: its run history could not be removed: %s", topic, exc)

    # -- metrics --------------------------------------------------------------------------------

    def _task_ended(self, ctx: CompactionTaskCtx) -> None:
        if ctx.kind != "compaction":
            return  # a preview changes no ledger and is no compaction to count
        self.metrics.task_ended(ctx)
        if ctx.finished_at is not None and ctx.state.value == "Succeed":
            self._last_success[ctx.topic] = ctx.finished_at
        threading.Thread(target=self._refresh_after_task, args=(ctx.topic,), name="refresh", daemon=True).start()

    def _refresh_after_task(self, topic: str) -> None:
        # What reads check against (log starts, topic id) is fresh when a run has just looked; and the
        # backlog metrics are the ones after the run, not before it (GET /v1/topics measures on its own).
        if self.monitor.refresh_quietly(topic) is not None:
            self.backlogs.measure(topic, for_listing=False)

    def _load_last_successes(self) -> None:
        for topic in self.store.topics():
            try:
                ledger_id = self.store.current_ledger_id(topic)
                if ledger_id is not None:
                    manifest = self.store.load_manifest(topic, ledger_id)
                    self._last_success[topic] = manifest.finished_at_ms / 1000
                    self.metrics.compacted_entries.labels(topic).set(manifest.records_kept)
                    self.metrics.compacted_bytes.labels(topic).set(manifest.bytes)
            except CompactordError as exc:
                log.error("topic %s: %s", topic, exc)
                self.metrics.ledger_corrupt.labels(topic).set(1)

    def _quarantined_count(self) -> int:
        # A scrape asks the store only while it answers: /metrics stays served, with the last count.
        if self.store_problem() is None:
            try:
                self._quarantined = len(self.store.quarantined())
            except StorageUnavailable as exc:
                self.store_failed(exc)
        return self._quarantined

    def _snapshot(self) -> dict[str, Any]:
        return {
            "running": self.registry.running_count(),
            "pending": self.registry.pending_count(),
            "last_success": dict(self._last_success),
            "quarantined": self._quarantined_count(),
            "monitor_last_run": self.monitor.last_run,
            "storage_up": 0 if self.store_problem() else 1,
        }
