"""The backlog monitor: an APScheduler job that triggers compactions past a threshold.

Every ``brokerServiceCompactionMonitorIntervalInSeconds``, for each topic whose whole name matches
``compactionTopicsPattern`` and that is not unloaded, it measures the backlog since the horizon and
triggers a compaction when any enabled trigger's value is strictly greater than its threshold:

- bytes (``brokerServiceCompactionThresholdInBytes``, Pulsar),
- records (``compactionThresholdInMessages``, Pulsar issue #26091),
- age of the oldest record after the horizon (``compactionMaxLagSeconds``: Kafka's
  max.compaction.lag.ms, RocketMQ's time trigger),
- dirty ratio, tail / (ledger + tail) records (``compactionMinDirtyRatio``: Kafka's
  min.cleanable.dirty.ratio; never on an empty topic).

Bytes come from the broker's log-dir sizes where it answers DescribeLogDirs; the test broker does not,
and most deployments do not grant it, so the estimate is the mean record size (of the last run, or of
a sample read after the horizon) times the tail records. A failed topic is retried with exponential
backoff (one interval doubling up to an hour); three failures in a row make it "uncleanable".

A pass asks the broker for every topic at once (``BrokerMetadata.describe_many``: one metadata request, one
DescribeConfigs, ListOffsets per broker), measures every topic on the broker (``backlogs.BacklogMeter``) and
keeps what the topic listing shows (``listing.TopicRow``): ``GET /v1/topics`` answers from it, asking neither
the broker nor the store. The first pass runs when the monitor starts.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler

from compactord.config import Settings
from compactord.daemon.backlogs import Backlog, BacklogMeter, triggers_fired
from compactord.daemon.broker_view import BrokerTopic
from compactord.daemon.identity import IdentityAnswer
from compactord.daemon.listing import TopicRow, TopicRows
from compactord.daemon.metrics import Metrics
from compactord.daemon.periodic import PeriodicPass
from compactord.daemon.policies import PolicyStore
from compactord.daemon.scheduler import TaskRegistry
from compactord.daemon.sweeper import StorageSweeper
from compactord.errors import CompactionAlreadyRunning, CompactordError, LedgerCorrupt, TopicNotFound
from compactord.interfaces import BrokerMetadata
from compactord.ledger.store import LedgerStore
from compactord.model import LedgerManifest, PartitionOffsets, TopicConfigs
from compactord.task import CompactionTaskCtx, Reason, TaskState

__all__ = ["Backlog", "BacklogMonitor", "BrokerTopic", "triggers_fired"]

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 3600
UNCLEANABLE_AFTER = 3
# The topics whose cleanup configs the log was told of, each with the answer told (the least recently told go
# first past this bound: such a topic is told again at its next answer).
CONFIGS_TOLD_MAX = 10_000


class BacklogMonitor:
    def __init__(self, settings: Settings, broker: BrokerMetadata, store: LedgerStore, registry: TaskRegistry,
                 policies: PolicyStore, metrics: Metrics,
                 store_problem: Callable[[], str | None] = lambda: None,
                 history_last: Callable[[str], Any] = lambda _topic: None) -> None:
        """``store_problem``: why no compaction may start for want of the ledger root's store (it is known down, or
        the root's lease is not held; None: it may); no pass runs then. ``history_last``: a topic's last recorded
        run (``RunHistory.last``), for the listing."""
        self._settings = settings
        # In a cluster: whether this member owns a topic (it considers those only), and the topics never listed or
        # compacted (the coordination topic).
        self.owns: Callable[[str], bool] = lambda _topic: True
        self.ignored: frozenset[str] = frozenset()
        self._store_problem = store_problem
        self._history_last = history_last
        self._broker = broker
        self._store = store
        self._registry = registry
        self._policies = policies
        self._metrics = metrics
        self._pattern = re.compile(settings.topics_pattern)
        self._scheduler = BackgroundScheduler(daemon=True, timezone="UTC")
        self._periodic: PeriodicPass[None] = PeriodicPass(
            "backlog-monitor-pass", "backlog monitor pass", self._pass, None,
            lambda result: metrics.monitor_runs.labels(result).inc())
        self._stopping = self._periodic.stopping
        self.backlogs: dict[str, Backlog] = {}
        self.missing: set[str] = set()
        self.topics: dict[str, BrokerTopic] = {}  # what the broker last said of each topic seen
        self.rows = TopicRows()  # what the listing shows of each topic, as of the last pass
        self.meter = BacklogMeter(settings, registry, metrics, store=store)
        self._configs_told: OrderedDict[str, TopicConfigs] = OrderedDict()
        self._configs_lock = threading.Lock()
        self.sweeper = StorageSweeper(settings, store, registry, metrics)  # its timer is this scheduler's

    @property
    def last_run(self) -> float | None:
        return self._periodic.last_run

    @property
    def passed(self) -> threading.Event:
        """Set once a pass has ended (whatever its result)."""
        return self._periodic.passes

    def start(self) -> None:
        """The first pass now, then one every interval."""
        self._scheduler.add_job(self._periodic.start_pass, "interval", seconds=self._settings.monitor_interval_seconds,
                                id="backlog-monitor", max_instances=1, coalesce=True,
                                next_run_time=datetime.now(UTC))
        if self._settings.storage_sweep_interval_seconds:  # 0: the start's removal only
            self._scheduler.add_job(self.sweeper.start_pass, "interval", id="storage-sweep", max_instances=1,
                                    seconds=self._settings.storage_sweep_interval_seconds, coalesce=True)
        self._scheduler.start()

    def stop(self) -> None:
        """No new pass starts; a pass under way ends before its next topic."""
        self._periodic.stop()
        self.sweeper.stop()
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)

    def run_once(self) -> None:
        self._periodic.run_once()

    # -- what the broker says of a topic -----------------------------------------------------------

    def refresh(self, topic: str) -> BrokerTopic:
        """Ask the broker for ``topic``'s id, offsets and configs now, and keep the answer.

        :raises TopicNotFound: the broker has no such topic.
        """
        asked = time.time()  # the view is as old as its first answer
        answer = self._broker.describe_many([topic]).get(topic) or TopicNotFound(topic)
        if isinstance(answer, CompactordError):
            raise answer
        return self._keep(topic, answer, asked)

    def _keep(self, topic: str, answer: tuple[str | None, dict[int, PartitionOffsets], TopicConfigs],
              asked: float, series: bool = True) -> BrokerTopic:
        topic_id, offsets, configs = answer
        self._tell_configs(topic, configs)
        known = BrokerTopic(topic_id, offsets, configs, asked)
        self.topics[topic] = known
        self.rows.seen_on_broker(topic)
        if series:
            self._metrics.topic_broker_compacted.labels(topic).set(1 if configs.compacted_by_broker else 0)
        return known

    def _tell_configs(self, topic: str, configs: TopicConfigs) -> None:
        """One line when the broker does not describe the topic's cleanup configs, once per topic (each monitor
        pass asks again), and one again when its answer changes."""
        with self._configs_lock:
            told = self._configs_told.pop(topic, None)
            self._configs_told[topic] = configs
            while len(self._configs_told) > CONFIGS_TOLD_MAX:
                self._configs_told.popitem(last=False)
        if told == configs or (told is None and configs.known):
            return
        if not configs.known:
            log.info("topic %s: the broker did not describe its cleanup configs (DescribeConfigs); "
                     "whether it compacts the topic itself is unknown", topic)
        else:
            described = ", ".join(f"{name.replace('_', '.')}={value}"  # Kafka's config names
                                  for name, value in asdict(configs).items() if value is not None)
            log.info("topic %s: the broker describes its cleanup configs now: %s", topic, described)

    def forget(self, topic: str) -> None:
        """Drop what was seen of a deleted topic."""
        self.topics.pop(topic, None)
        self.backlogs.pop(topic, None)
        self.missing.discard(topic)
        self.rows.forget(topic)
        self.meter.forget(topic)
        self._policies.forget(topic)
        with self._configs_lock:
            self._configs_told.pop(topic, None)

    def known(self, topic: str) -> BrokerTopic | None:
        return self.topics.get(topic)

    def last_identity(self, topic: str) -> IdentityAnswer | None:
        """The topic's id and offsets as last seen (None: never seen); never asks the broker."""
        known = self.topics.get(topic)
        return None if known is None else IdentityAnswer(known.topic_id, known.offsets, known.refreshed_at)

    def log_starts(self, topic: str) -> dict[int, int]:
        """The log starts last seen (empty if never seen): what a read of the ledger must not go below."""
        known = self.topics.get(topic)
        return {} if known is None else known.log_starts()

    def refresh_quietly(self, topic: str) -> BrokerTopic | None:
        try:
            return self.refresh(topic)
        except CompactordError as exc:
            log.debug("topic %s not refreshed: %s", topic, exc)
            return None

    # -- one pass -------------------------------------------------------------------------------

    def _pass(self) -> None:
        problem = self._store_problem()
        if problem is not None:  # a compaction could not write its ledger: none is started
            log.debug("no backlog pass: %s", problem)
            return
        started, cpu, requests = time.monotonic(), time.thread_time(), self._metrics.thread_broker_requests()
        asked = time.time()
        broker_topics = set(self._broker.list_topics()) - self.ignored
        store_topics = set(self._store.topics())
        # The topics with metric series: matched by the pattern, or with a ledger (at most: a folder under the root).
        watched = {t for t in broker_topics if self._pattern.fullmatch(t)}
        self._metrics.per_topic_for(len(watched | store_topics), self._settings.metrics_per_topic_max_topics)
        self._note_missing(broker_topics, store_topics)
        # Before the measure: a task that ends (or a policy set) while this pass measures makes it stale.
        before = {t: (self._registry.last(t), self._registry.live(t) is not None) for t in broker_topics}
        answers = self._broker.describe_many(sorted(broker_topics), self._stopping.is_set)
        if self._stopping.is_set():
            return
        views: dict[str, tuple[LedgerManifest | None, BrokerTopic]] = {}
        rows: dict[str, TopicRow] = {}
        for topic in sorted(broker_topics | store_topics):
            rows[topic] = row = self._row(topic, on_root=topic in store_topics)
            if row.manifest is not None or row.error is not None:
                watched.add(topic)
            answer = answers.get(topic)
            if answer is None:
                continue
            if isinstance(answer, CompactordError):
                (log.warning if self._pattern.fullmatch(topic) else log.debug)(
                    "backlog of topic %s not measured: %s", topic, answer)
                continue
            views[topic] = (row.manifest, self._keep(topic, answer, asked, series=topic in watched))
        backlogs = self.meter.measure_many(views)
        for topic, backlog in backlogs.items():
            self.record_backlog(backlog, series=topic in watched)
        self.rows.replace(rows, broker_topics, asked)
        self._trigger(views, backlogs, before)
        self._metrics.monitor_pass_seconds.set(time.monotonic() - started)
        self._metrics.monitor_pass_cpu_seconds.set(time.thread_time() - cpu)
        self._metrics.monitor_pass_broker_requests.set(self._metrics.thread_broker_requests() - requests)
        self._metrics.monitor_pass_topics.set(len(views))

    def watches(self, topic: str) -> bool:
        """Whether the topic is one to compact: matched by compactionTopicsPattern, and not an ignored one."""
        return topic not in self.ignored and self._pattern.fullmatch(topic) is not None

    def _row(self, topic: str, on_root: bool = True) -> TopicRow:
        """What the listing shows of the topic's ledger, last run and policies, as kept in memory (each read once,
        then as this daemon changes it); ``on_root=False``: the root has no folder of the topic."""
        error: CompactordError | None = None
        manifest = None
        try:
            manifest = self.meter.ledger(topic, raising=True, on_root=on_root)
        except CompactordError as exc:
            error = exc
        try:
            run = self._history_last(topic)
        except (CompactordError, OSError) as exc:
            log.debug("topic %s: its last run not read: %s", topic, exc)
            run = None
        try:
            policies = self._policies.get(topic)
            policy = dict(policies.effective(self._settings))
            strategy = policies.strategy or self._settings.compaction_strategy
        except CompactordError:
            policy, strategy = None, self._settings.compaction_strategy
        try:
            unloaded = self._policies.unloaded(topic)
        except CompactordError:
            unloaded = False
        return TopicRow(manifest, run, error, strategy, policy, unloaded)

    def _trigger(self, views: dict[str, tuple[LedgerManifest | None, BrokerTopic]], backlogs: dict[str, Backlog],
                 before: dict[str, tuple[CompactionTaskCtx | None, bool]]) -> None:
        uncleanable = 0
        failing: set[str] = set()
        monitored: list[str] = []
        for topic in sorted(views):
            if self._stopping.is_set():
                return
            if not self.watches(topic) or not self.owns(topic):
                continue
            monitored.append(topic)
            failures = self._registry.recent_failures(topic)
            if failures:
                failing.add(topic)
            self._metrics.topic_uncleanable.labels(topic).set(1 if failures >= UNCLEANABLE_AFTER else 0)
            uncleanable += failures >= UNCLEANABLE_AFTER
            if self._policies.unloaded(topic):
                continue
            try:
                self._consider(topic, failures, views[topic], backlogs[topic], before.get(topic, (None, True)))
            except CompactordError as exc:
                log.warning("topic %s not considered for compaction: %s", topic, exc)
        self._metrics.uncleanable.set(uncleanable)
        self._set_cleanliness(monitored, failing)
        self._registry.kick()

    def _set_cleanliness(self, monitored: list[str], failing: set[str]) -> None:
        """The gauges over every monitored topic (Kafka's cleaner's): the largest compaction delay and
        dirty ratio, and the backlog that failing compactions leave behind."""
        measured = [(t, b) for t in monitored if (b := self.backlogs.get(t)) is not None]
        m = self._metrics
        m.max_compaction_delay.set(max((b.age_seconds for _t, b in measured if b.records), default=0.0))
        m.max_dirty_ratio.set(max((b.dirty_ratio for _t, b in measured), default=0.0))
        m.uncleanable_bytes.set(sum(b.bytes for t, b in measured if t in failing))

    def _consider(self, topic: str, failures: int, view: tuple[LedgerManifest | None, BrokerTopic],
                  backlog: Backlog, before: tuple[CompactionTaskCtx | None, bool]) -> None:
        manifest, known = view
        policy = dict(self._policies.get(topic).effective(self._settings))
        policy["maxLagSeconds"] = known.effective_max_lag(policy["maxLagSeconds"])
        self._metrics.topic_max_lag.labels(topic).set(policy["maxLagSeconds"])  # what the delay alert compares
        last_before, running_before = before
        stale = running_before or self._registry.last(topic) is not last_before
        if stale or self._registry.live(topic) is not None or self._in_backoff(topic, failures):
            return
        fired = triggers_fired(backlog, policy) + self._view_triggers(manifest, known)
        if not fired:
            return
        reason = Reason.combine(fired)
        log.info("compacting topic %s (reason %s): %s", topic, reason.kind, reason.detail)
        try:
            self._registry.trigger(topic, backlog=backlog.bytes, reason=reason)
        except CompactionAlreadyRunning:
            pass

    def record_backlog(self, backlog: Backlog, series: bool = True) -> None:
        """Keep a measure of a topic's backlog (``GET /v1/topics``) and set its metrics (``series``; a topic
        neither watched nor with a ledger is listed without any)."""
        topic = backlog.topic
        self.backlogs[topic] = backlog
        if not series:
            return
        m = self._metrics
        m.backlog_records.labels(topic).set(backlog.records)
        m.backlog_bytes.labels(topic).set(backlog.bytes)
        m.backlog_age.labels(topic).set(backlog.age_seconds)
        m.dirty_ratio.labels(topic).set(backlog.dirty_ratio)

    @staticmethod
    def _view_triggers(manifest: LedgerManifest | None, known: BrokerTopic) -> list[Reason]:
        """Reasons to compact that are not a backlog: the ledger is of a log that no longer exists, or the
        log start moved past entries the ledger still holds (retention)."""
        if manifest is None:
            return []
        recreated = known.new_log(manifest)
        if recreated is not None:
            return [Reason("recreated", f"the topic was recreated ({recreated})")]
        moved = [p for p, start in known.log_starts().items()
                 if start > manifest.log_start.get(p, 0) and start <= manifest.horizon.get(p, -1)]
        return [Reason("log_start", f"the log start moved in partitions {moved} (retention)")] if moved else []

    def _in_backoff(self, topic: str, failures: int) -> bool:
        if failures == 0:
            return False
        last = self._registry.last(topic)
        if last is None or last.state is not TaskState.FAILED or last.finished_at is None:
            return False
        delay = min(self._settings.monitor_interval_seconds * 2 ** (failures - 1), MAX_BACKOFF_S)
        return time.time() < last.finished_at + delay

    def measure(self, topic: str, offsets: dict[int, PartitionOffsets] | None = None) -> Backlog:
        """The topic's backlog since its horizon (the whole topic if it was never compacted); ``offsets``:
        the broker's answer already in hand (else the topic is refreshed)."""
        known = self.topics.get(topic)
        if offsets is None or known is None:
            known = self.refresh(topic)
        if offsets is not None:
            known = BrokerTopic(known.topic_id, offsets, known.configs, known.refreshed_at)
        return self.meter.measure_many({topic: (self.meter.ledger(topic), known)})[topic]

    def measure_now(self, topic: str) -> Backlog:
        """Refresh and measure ``topic`` now, and keep both (a task's end): the listing shows them at once."""
        backlog = self.measure(topic)
        self.record_backlog(backlog)
        self.rows.update(topic, self._row(topic))
        return backlog

    def measure_seen(self, topic: str, topic_id: str | None, offsets: dict[int, PartitionOffsets],
                     asked: float) -> Backlog | None:
        """As ``measure_now``, from what a run was just told of the topic's log (its id and ``offsets``, asked at
        ``asked``) with the configs last seen, without asking the broker; None (nothing kept) when the topic was
        never seen. A view asked later than ``asked`` (a pass's) is kept as it is."""
        known = self.topics.get(topic)
        if known is None:
            return None
        if known.refreshed_at <= asked:
            known = self._keep(topic, (topic_id, offsets, known.configs), asked)
        backlog = self.meter.measure_many({topic: (self.meter.ledger(topic), known)})[topic]
        self.record_backlog(backlog)
        self.rows.update(topic, self._row(topic))
        return backlog

    def _note_missing(self, broker_topics: set[str], store_topics: set[str]) -> None:
        store = self._store
        missing = set()
        for topic in store_topics - broker_topics:
            try:
                has_ledger = store.current_ledger_id(topic) is not None
            except LedgerCorrupt:
                has_ledger = True
            if has_ledger:
                missing.add(topic)
        for topic in missing - self.missing:
            log.warning("topic %s has a compacted ledger but the broker no longer lists it; the ledger stays "
                        "until DELETE /v1/topics/%s or an operator removes it", topic, topic)
        for topic in self.missing - missing:
            self._metrics.topic_missing.labels(topic).set(0)
        for topic in missing:
            self._metrics.topic_missing.labels(topic).set(1)
        self._metrics.missing_topics.set(len(missing))
        self.missing = missing
