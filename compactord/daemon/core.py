"""``compactord run``: one process holding the compaction service factory (and its runtime: the Spark
session of the default factory), the task registry, the backlog monitor, and what the HTTP API asks of them.
``Daemon`` builds these parts and wires them; each part is a module of its own: what the probes answer
(``health``), the watchdog (``watchdog``), the topics' policies and deletion (``topics``), the recording of
ended runs (``recorder``). The HTTP server that runs it is ``compactord.server``.

Start-up: lock (or lease) the ledger root (a second daemon on the same root refuses to start), resolve the
factory, serve HTTP at once (``/healthz`` answers; ``/readyz`` answers 200 with ``"reads": true`` and
``"compactions": false``), then start and warm the factory's runtime in the background
(``interfaces.RuntimeOwner``; a factory without one has nothing to start). Compactions can run once the
runtime is warm and the broker answers; reads need neither. Each topic is recovered, and its last success and
stored policies read, at its first use or by the ledger store's paced recovery pass (``ledger/recovery.py``),
never every topic before the first read.

If the runtime (the Spark JVM) dies or hangs, the daemon exits non-zero so that its supervisor restarts it
(``watchdog``). SIGTERM: cancellable tasks are cancelled, a switching task finishes, the runtime stops,
exit code 0.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from compactord.cluster import Membership, advertised_url, coordination_topic, ensure_coordination_topic
from compactord.config import Settings
from compactord.daemon.backlogs import BacklogCache
from compactord.daemon.cluster import ClusterRole
from compactord.daemon.health import Health
from compactord.daemon.history import RunHistory
from compactord.daemon.identity import TopicIdentities
from compactord.daemon.metrics import Metrics
from compactord.daemon.monitor import BacklogMonitor
from compactord.daemon.policies import PolicyStore
from compactord.daemon.recorder import RunRecorder, delete_history
from compactord.daemon.scheduler import TaskRegistry
from compactord.daemon.topics import Topics, apply_stored_policies
from compactord.daemon.watchdog import JVM_CHECK_TIMEOUT_S, Watchdog
from compactord.errors import (
    BrokerUnavailable,
    CompactordError,
    ConfigError,
    LedgerRootUnwritable,
    NoOwner,
    PluginLoadError,
    StorageUnavailable,
)
from compactord.iceberg import open_publisher
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
from compactord.ledger.guard import WriterGuard
from compactord.ledger.ownership import OwnershipGuard
from compactord.ledger.recovery import RECOVERY_TOPICS_PER_SECOND
from compactord.ledger.store import DAEMON_DIR, LedgerStore
from compactord.refs import resolve_ref
from compactord.storage import open_store
from compactord.task import CompactionTaskCtx

__all__ = ["Daemon", "allowed_strategies", "load_factory"]

log = logging.getLogger(__name__)

JOIN_RETRY_S = 2.0  # a cluster's member asks a broker that did not answer again after this long
# How long a topic's task is given to stop before its coordination partition is handed over: below the group's
# rebalance timeout (``cluster/membership.py``), within which a revoking member must answer.
HANDOVER_WAIT_S = 120.0


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


def _open_store(settings: Settings, metrics: Metrics, membership: Membership | None = None) -> LedgerStore:
    """The open store, whose topics are recovered each at its first use (``ledger/recovery.py``; the recovery
    pass starts with the daemon). An object store is checked first (its bucket, credentials, endpoint, and that
    it enforces conditional writes); its requests feed ``metrics``. A local root is locked; an S3 root is leased
    (``ledger/lease.py``, for storageLeaseSeconds). A cluster's member (``membership``) takes neither: the root is
    marked as the cluster's and each topic is written by its owner (``ledger/ownership.py``).

    :raises LedgerRootUnwritable: the root cannot be created or written (read-only, not mounted), or an
        object store refuses the check."""
    root = settings.compacted_ledger_root
    objects = open_store(root, settings, observer=metrics.storage_request)
    objects.check("compactedLedgerRoot")
    guard: WriterGuard | None = None
    if membership is not None:
        guard = OwnershipGuard(objects, root, settings.cluster_name, membership.may_write,
                               lease_seconds=settings.storage_lease_seconds)
    store = LedgerStore(root, objects, lease_seconds=settings.storage_lease_seconds, recovery_per_second=0,
                        guard=guard)
    try:
        return store.open()
    except CompactordError:  # LedgerRootUnwritable, InsufficientDiskSpace, LedgerRootLocked: as they are
        raise
    except OSError as exc:
        raise LedgerRootUnwritable(
            f"ledger root {store.root} cannot be opened: {exc.strerror or exc}; compactedLedgerRoot must be a "
            "writable directory on a mounted file system", root=str(store.root)) from exc


class Daemon:
    def __init__(self, settings: Settings, spark: Any = None,
                 broker: BrokerMetadata | None = None, jvm_check_timeout_s: float = JVM_CHECK_TIMEOUT_S,
                 recovery_per_second: float = RECOVERY_TOPICS_PER_SECOND) -> None:
        """``spark``: a Spark session manager to share (tests), given to the factory in its ``ServiceContext``
        (which then does not stop it); None: a factory that uses Spark builds its own.
        ``broker``: the broker-metadata seam (default: kafka-python against kafkaBootstrapServers).
        ``jvm_check_timeout_s``: how long the watchdog waits for the JVM to answer before it calls it hung.
        ``recovery_per_second``: the pace of the ledger store's recovery pass, from ``start()`` (<= 0: none;
        each topic is recovered at its first use all the same)."""
        if not jvm_check_timeout_s > 0:
            raise ValueError(f"jvm_check_timeout_s must be positive, got: {jvm_check_timeout_s!r}")
        self.settings = settings
        self._recovery_per_second = recovery_per_second
        self.metrics = Metrics(snapshot=self._snapshot)  # before the store: it counts the store's requests
        footer_cache.SHARED.resize(settings.storage_metadata_cache_bytes)  # one cache for every reader
        # A cluster's member (clusterName): the group's membership decides which topics it writes.
        self.cluster: ClusterRole | None = None
        self.member_url = ""  # a cluster member's advertised URL
        membership = None
        if settings.cluster_name:
            self.member_url = advertised_url(settings, settings.http_port)
            membership = Membership(settings, self.member_url, on_assigned=lambda parts: self._cluster().gained(parts),
                                    on_revoked=lambda parts: self._cluster().revoking(parts),
                                    on_lost=lambda parts: self._cluster().lost(parts))
        self.store = _open_store(settings, self.metrics, membership)
        self.history = RunHistory(self.store.objects, settings.compaction_history_max_runs,
                                  settings.compaction_history_max_age_days, ready=self.store.ready,
                                  member=self.member_url or None)
        self.admin: BrokerMetadata = broker or KafkaAdmin(settings, observer=self.metrics.broker_request)
        self._broker_probe: BrokerMetadata = broker or KafkaAdmin(settings)
        # The reads' identity checks have a client of their own: they never queue behind a monitor pass.
        self._identity_broker: BrokerMetadata = broker or KafkaAdmin(settings)
        try:
            self.iceberg = open_publisher(settings, self.store,
                                          lambda topic, lag: self.metrics.iceberg_lag.labels(topic).set(lag))
            self.factory = load_factory(settings)
            self.factory.initialize(ServiceContext(settings, spark=spark, store=self.store, broker=self.admin))
        except BaseException:
            self._close_broker_clients()
            self.store.close()
            raise
        # What the factory runs on (Spark's session and JVM), started in the background; None: nothing to start.
        self.runtime: EngineRuntime | None = self.factory.runtime() if isinstance(self.factory, RuntimeOwner) \
            else None
        # The probes' answers; the store's watch records, once the store answers again, the runs that waited.
        self.health = Health(settings, self.store, self._broker_probe, self.runtime, self.metrics,
                             fatal=lambda: self.watchdog.fatal, on_store_up=lambda: self.runs.record_unrecorded())
        self.runs = RunRecorder(self.history, self.metrics, self.health)
        self.policies = PolicyStore(self.store, allowed_strategies(settings, self.factory))
        self.registry = TaskRegistry(self.factory, settings.max_concurrent_tasks, settings.monitor_interval_seconds,
                                     on_end=self._task_ended, release_after_s=settings.task_timeout_seconds,
                                     recorder=self.runs.record)
        self.monitor = BacklogMonitor(settings, self.admin, self.store, self.registry, self.policies, self.metrics,
                                      store_problem=self.health.write_problem, history_last=self.history.last)
        if self.iceberg is not None:  # its tables' retained snapshots keep their ledgers (expiry before deletion)
            self.store.keep_also(self.iceberg.retained)
            self.iceberg.released = self.store.delete_released
            self.iceberg.enabled = self._iceberg_enabled
        if membership is not None:
            self.cluster = ClusterRole(settings.cluster_name, membership, settings.cluster_coordination_partitions,
                                       self.member_url, take=self._take_topic, release=self.store.release_topic,
                                       stop_topic=self._stop_topic_for_handover, known_topics=self._known_topics)
            self.monitor.owns = self.cluster.owns  # it considers the topics this member owns only
            self.monitor.ignored = frozenset({coordination_topic(settings.cluster_name)})
            if self.iceberg is not None:  # only a topic's owner commits its table
                self.iceberg.owns = self.cluster.holds
        self.backlogs = BacklogCache(self.monitor, self.registry)
        self.identities = TopicIdentities(self._identity_broker, self.health.broker_problem,
                                          self.monitor.last_identity)
        self.topics = Topics(settings, self.store, self.admin, self.factory, self.registry, self.policies,
                             self.backlogs, self.runs, self.health.broker_problem,
                             forget=(self.registry.forget, self.monitor.forget, self.identities.forget,
                                     self.backlogs.forget, self.metrics.forget, self._iceberg_deleted))
        self.watchdog = Watchdog(settings, self.runtime, self.registry, jvm_check_timeout_s,
                                 each_pass=self.health.refresh)
        self.embedded_broker = False  # set by the server runner when it started the bundled broker
        self.on_warm: Any = None  # set by the server runner: called once the runtime is warm
        self._quarantined = 0  # the last count of quarantined ledgers, shown while the store is down
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # What the daemon keeps of a topic outside its folder, brought in line once the topic is recovered (at
        # its first use, or by the recovery pass that ``start`` starts), never for every topic at once.
        self.store.after_recovery(self._topic_recovered)

    # -- start and stop -------------------------------------------------------------------------

    def start(self) -> None:
        threads: list[tuple[str, Callable[..., object], tuple[Any, ...]]] = [
            ("runtime-start", self._start_runtime, ()), ("watchdog", self.watchdog.run, (self._stop,)),
            *((name, watch, (self._stop,)) for name, watch in self.health.watches())]
        if self.cluster is not None:
            threads.append(("cluster-join", self._join_cluster, ()))
        for name, target, args in threads:
            thread = threading.Thread(target=target, args=args, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        self.store.start_recovery_pass(self._recovery_per_second)
        if self.iceberg is not None:  # paced on its own thread: reads are served meanwhile
            self.iceberg.start()

    # -- a cluster's member -----------------------------------------------------------------------

    def _cluster(self) -> ClusterRole:
        assert self.cluster is not None  # the membership's callbacks run once it is built
        return self.cluster

    def _join_cluster(self) -> None:
        """Make sure of the coordination topic, then join the group; a broker that does not answer is asked again
        (the daemon serves reads meanwhile), a coordination topic of another partition count ends the daemon
        (exit 2: the config must be fixed)."""
        while not self._stop.is_set():
            try:
                ensure_coordination_topic(self.settings)
                self._cluster().membership.start()
                return
            except ConfigError as exc:
                self.watchdog.die("the cluster's coordination topic does not fit the config", exc)
                return
            except BrokerUnavailable as exc:
                log.warning("cluster %s not joined yet: %s", self.settings.cluster_name, exc)
                self._stop.wait(JOIN_RETRY_S)

    def _take_topic(self, topic: str) -> int:
        """Take the topic as its new owner: its epoch raised, what an earlier owner left removed, its policies
        and last success read again (``LedgerStore.take``, then the recovery hook)."""
        self.policies.forget(topic)  # an earlier owner may have changed them, and recorded runs
        self.history.forget(topic)
        if self.iceberg is not None:  # an earlier owner may have committed it: read again, caught up
            self.iceberg.catch_up([topic])
        return self.store.take(topic)

    def _stop_topic_for_handover(self, topic: str) -> None:
        """Stop the topic's task before it is handed over: cancelled, or waited for while it switches (bounded
        below the group's rebalance timeout); a task still running then is fenced by the next owner's epoch."""
        wait_s = min(float(self.settings.cancel_timeout_seconds), HANDOVER_WAIT_S)
        try:
            self.registry.stop_topic(topic, wait_s)
        except CompactordError as exc:
            log.warning("topic %s: its task not stopped before the handover: %s", topic, exc)

    def _known_topics(self) -> list[str]:
        """The topics there are: on the broker (matched by compactionTopicsPattern) and under the root; the
        coordination topic never."""
        ignored = coordination_topic(self.settings.cluster_name)
        found = set(self.store.topics())
        try:
            found |= {t for t in self.admin.list_topics() if self.monitor.watches(t)}
        except BrokerUnavailable as exc:
            log.warning("the broker's topics not listed (those under the root are taken): %s", exc)
        found.discard(ignored)
        return sorted(found)

    def require_owner(self, topic: str) -> None:
        """Before a request changes the topic here: in a cluster, this member must own it (taken now if its
        partition is held); elsewhere, nothing to check.

        :raises NoOwner: another member holds it, or none does (the request was forwarded while it moved)."""
        if self.cluster is not None and not self.cluster.owns(topic):
            raise NoOwner(f"topic {topic!r} is not owned by this member of cluster {self.settings.cluster_name!r} "
                          "now (it is moving between members); retry in a second", public=True)

    def _topic_recovered(self, topic: str, deleted: bool) -> None:
        """Before the topic is served: its run history goes if its recovery completed its deletion; else its last
        success and its stored policies are read (``LedgerStore.after_recovery``).

        :raises StorageUnavailable: the store does not answer (the topic is recovered again at its next use)."""
        if deleted:
            delete_history(self.history, topic)  # the rest of the topic went in its recovery
            return
        self.runs.load_last_success(self.store, topic)
        apply_stored_policies(self.policies, self.factory, topic)

    def _iceberg_enabled(self, topic: str) -> bool:
        """Whether the topic is published to its Iceberg table: unless its policy says ``iceberg: false``
        (policies that cannot be used: the default, published).

        :raises StorageUnavailable: the store does not answer (the commit is tried again at the next switch)."""
        try:
            return self.policies.get(topic).iceberg is not False
        except StorageUnavailable:
            raise
        except CompactordError:
            return True

    def _iceberg_deleted(self, topic: str) -> None:
        if self.iceberg is not None:
            self.iceberg.deleted(topic)

    def _start_runtime(self) -> None:
        if self.runtime is not None:
            try:
                folder = self.store.objects.local_root
                scratch = folder / DAEMON_DIR / "tmp" if folder is not None else None  # None: the host's
                self.runtime.start(scratch)
            except Exception as exc:  # noqa: BLE001 (whatever stops Spark starting ends the daemon, with its reason)
                if not self._stop.is_set():
                    self.watchdog.die("the Spark session could not start", exc)
                return
        if self.on_warm is not None:
            self.on_warm()
        self.monitor.start()
        waiting = "Spark is warm; waiting for the broker" if self.runtime is not None else "waiting for the broker"
        log.info("compactord is ready" if not self.health.readiness_problems() else waiting)

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
        if self.iceberg is not None:
            self.iceberg.stop()
        if self.cluster is not None:  # hands the topics over: their tasks stop, the group rebalances at once
            self.cluster.stop()
        self.registry.shutdown(timeout=max(30.0, self.settings.cancel_timeout_seconds))
        self.runs.record_at_stop()
        try:
            self.factory.close()
        finally:
            self._close_broker_clients()
            if self.watchdog.fatal is None and self.runtime is not None:
                self.runtime.stop()
            self.store.close()
            log.info("stopped in %.1fs", time.monotonic() - started)

    # -- what the API views ask (``api/views.py``) ----------------------------------------------

    def strategy_name(self, topic: str) -> str:
        return self.topics.strategy_name(topic)

    # -- after a run, and the metrics' snapshot -------------------------------------------------

    def _task_ended(self, ctx: CompactionTaskCtx) -> None:
        if ctx.kind != "compaction":
            return  # a preview changes no ledger and is no compaction to count
        self.metrics.task_ended(ctx)
        if ctx.state.value == "Succeed":
            self.runs.succeeded(ctx)
            if self.iceberg is not None:  # its table committed on the publisher's thread, never this one's
                self.iceberg.switched(ctx.topic)
            if self._keep_run_view(ctx):  # on the run's thread: no request, nothing to wait for
                return
        threading.Thread(target=self._refresh_after_task, args=(ctx,), name="refresh", daemon=True).start()

    def _keep_run_view(self, ctx: CompactionTaskCtx) -> bool:
        """What the run was told of its topic's log (``TaskStats.log_seen``: its id and offsets) kept as the
        topic's broker view, and the backlog metrics and the listing's row measured from it: the broker is not
        asked again right after the run asked. False when there is none to keep (the run was not planned, or
        the monitor never saw the topic, so its configs are unknown)."""
        seen = ctx.stats.log_seen
        if seen is None:
            return False
        try:
            return self.monitor.measure_seen(ctx.topic, seen.topic_id, dict(seen.offsets), seen.asked_at) \
                is not None
        except CompactordError as exc:  # the ledger or the history cannot be read: the next pass measures
            log.debug("backlog of topic %s not measured after its run: %s", ctx.topic, exc)
            return True

    def _refresh_after_task(self, ctx: CompactionTaskCtx) -> None:
        # What reads check against (log starts, topic id) is fresh when a run has just looked; and the
        # backlog metrics and the listing's row are the ones after the run, not before it.
        if self._keep_run_view(ctx):
            return
        known = self.monitor.refresh_quietly(ctx.topic)
        if known is not None:
            try:
                self.monitor.measure_seen(ctx.topic, known.topic_id, known.offsets, known.refreshed_at)
            except CompactordError as exc:
                log.debug("backlog of topic %s not measured after its run: %s", ctx.topic, exc)

    def _quarantined_count(self) -> int:
        # A scrape asks the store only while it answers: /metrics stays served, with the last count.
        if self.health.store_problem() is None:
            try:
                self._quarantined = len(self.store.quarantined())
            except StorageUnavailable as exc:
                self.health.store_failed(exc)
        return self._quarantined

    def _snapshot(self) -> dict[str, Any]:
        return {
            "running": self.registry.running_count(),
            "pending": self.registry.pending_count(),
            "last_success": dict(self.runs.last_success),
            "quarantined": self._quarantined_count(),
            "monitor_last_run": self.monitor.last_run,
            "storage_up": 0 if self.health.store_problem() else 1,
            "cluster": self._cluster_snapshot(),
        }

    def _cluster_snapshot(self) -> dict[str, Any] | None:
        if self.cluster is None:
            return None
        view = self.cluster.view()
        return {"members": len(view.members), "owned": view.owned_topics, "unowned": view.unowned_partitions,
                "rebalances": self.cluster.membership.rebalances, "rebalance_seconds": view.last_rebalance_seconds}
