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
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler

from compactord.config import Settings
from compactord.daemon.identity import IdentityAnswer
from compactord.daemon.metrics import Metrics
from compactord.daemon.policies import PolicyStore
from compactord.daemon.registry import TaskRegistry
from compactord.daemon.sweeper import StorageSweeper
from compactord.errors import BrokerUnavailable, CompactionAlreadyRunning, CompactordError, LedgerCorrupt
from compactord.interfaces import BrokerMetadata
from compactord.kafka.backlog import sample_tail
from compactord.kafka.identity import LogNow, new_log_reason
from compactord.ledger.store import LedgerStore
from compactord.model import LedgerManifest, PartitionOffsets, TopicConfigs
from compactord.task import Reason, TaskState

__all__ = ["Backlog", "BacklogMonitor", "BrokerTopic", "triggers_fired"]

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 3600
UNCLEANABLE_AFTER = 3
# The topics whose cleanup configs the log was told of, each with the answer told (the least recently told go
# first past this bound: such a topic is told again at its next answer).
CONFIGS_TOLD_MAX = 10_000


@dataclass(frozen=True)
class Backlog:
    topic: str
    records: int
    bytes: int
    age_seconds: float
    ledger_records: int

    @property
    def dirty_ratio(self) -> float:
        total = self.ledger_records + self.records
        return self.records / total if total else 0.0


# Strategies that need a key's losers (earlier values, older event times): a broker that compacts the
# topic itself may already have removed them.
_SAFE_UNDER_BROKER_COMPACTION = ("publishing-order",)


@dataclass(frozen=True)
class BrokerTopic:
    """What the broker last said of a topic (refreshed every monitor pass): its id, offsets and cleanup
    configs. Reads use it instead of asking the broker."""

    topic_id: str | None
    offsets: dict[int, PartitionOffsets]
    configs: TopicConfigs
    refreshed_at: float  # when the broker was asked (before its first answer)

    def log_starts(self) -> dict[int, int]:
        return {p: o.log_start for p, o in self.offsets.items()}

    def new_log(self, manifest: LedgerManifest) -> str | None:
        """Why the topic's log is not the one ``manifest``'s ledger was made of, or None. A view older
        than the ledger tells nothing (the run that made it saw the log later)."""
        if self.refreshed_at * 1000 < manifest.finished_at_ms:
            return None
        return new_log_reason(manifest, self.offsets, LogNow(self.topic_id))

    def implicit_max_lag_seconds(self) -> int | None:
        """For a topic the broker compacts itself: half its ``delete.retention.ms``, so that no tombstone
        is cleaned away by the broker before a compaction has seen it."""
        if self.configs.compacted_by_broker and self.configs.delete_retention_ms:
            return max(1, self.configs.delete_retention_ms // 2000)
        return None

    def effective_max_lag(self, configured: int) -> int:
        """The max lag in force (0: none): ``configured``, or ``implicit_max_lag_seconds`` where it is shorter."""
        implicit = self.implicit_max_lag_seconds()
        return implicit if implicit is not None and (configured <= 0 or implicit < configured) else configured

    def warnings(self, strategy: str) -> list[str]:
        if self.configs.compacted_by_broker and strategy not in _SAFE_UNDER_BROKER_COMPACTION:
            return [(f"the broker compacts this topic itself (cleanup.policy={self.configs.cleanup_policy}); "
                     f"the {strategy} strategy needs records the broker's cleaner may already have removed")]
        return []


def triggers_fired(backlog: Backlog, policy: dict[str, Any]) -> list[Reason]:
    """The enabled triggers whose value is strictly greater than their threshold."""
    fired = []
    if policy["thresholdBytes"] > 0 and backlog.bytes > policy["thresholdBytes"]:
        fired.append(Reason("backlog_bytes", f"backlog {backlog.bytes} bytes > threshold {policy['thresholdBytes']}"))
    if policy["thresholdMessages"] > 0 and backlog.records > policy["thresholdMessages"]:
        fired.append(Reason("backlog_records",
                            f"backlog {backlog.records} records > threshold {policy['thresholdMessages']}"))
    if policy["maxLagSeconds"] > 0 and backlog.records > 0 and backlog.age_seconds > policy["maxLagSeconds"]:
        fired.append(Reason("max_lag", f"oldest uncompacted record {backlog.age_seconds:.0f}s old > threshold "
                                       f"{policy['maxLagSeconds']}s"))
    if policy["minDirtyRatio"] > 0 and backlog.records > 0 and backlog.dirty_ratio > policy["minDirtyRatio"]:
        fired.append(Reason("dirty_ratio",
                            f"dirty ratio {backlog.dirty_ratio:.3f} > threshold {policy['minDirtyRatio']}"))
    return fired


class BacklogMonitor:
    def __init__(self, settings: Settings, broker: BrokerMetadata, store: LedgerStore, registry: TaskRegistry,
                 policies: PolicyStore, metrics: Metrics,
                 store_problem: Callable[[], str | None] = lambda: None) -> None:
        """``store_problem``: why no compaction may start for want of the ledger root's store (it is known down, or
        the root's lease is not held; None: it may); no pass runs then."""
        self._settings = settings
        self._store_problem = store_problem
        self._broker = broker
        self._store = store
        self._registry = registry
        self._policies = policies
        self._metrics = metrics
        self._pattern = re.compile(settings.topics_pattern)
        self._scheduler = BackgroundScheduler(daemon=True, timezone="UTC")
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.backlogs: dict[str, Backlog] = {}
        self.missing: set[str] = set()
        self.last_run: float | None = None
        self.topics: dict[str, BrokerTopic] = {}  # what the broker last said of each topic seen
        self._configs_told: OrderedDict[str, TopicConfigs] = OrderedDict()
        self._configs_lock = threading.Lock()
        self.sweeper = StorageSweeper(settings, store, registry, metrics)  # its timer is this scheduler's

    def start(self) -> None:
        self._scheduler.add_job(self._start_pass, "interval", seconds=self._settings.monitor_interval_seconds,
                                id="backlog-monitor", max_instances=1, coalesce=True)
        if self._settings.storage_sweep_interval_seconds:  # 0: the start's removal only
            self._scheduler.add_job(self.sweeper.start_pass, "interval", id="storage-sweep", max_instances=1,
                                    seconds=self._settings.storage_sweep_interval_seconds, coalesce=True)
        self._scheduler.start()

    def _start_pass(self) -> None:
        """A pass runs in a daemon thread of its own, not in the scheduler's pool: the pool's threads are
        joined when the process exits, and a pass stuck in a broker call (kafka-python's bootstrap can
        wait without a bound when its network thread is closed under it) kept a stopped process alive."""
        if not self._stopping.is_set():
            threading.Thread(target=self.run_once, name="backlog-monitor-pass", daemon=True).start()

    def stop(self) -> None:
        """No new pass starts; a pass under way ends before its next topic."""
        self._stopping.set()
        self.sweeper.stop()
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)

    # -- one pass -------------------------------------------------------------------------------

    def run_once(self) -> None:
        if not self._lock.acquire(blocking=False):
            return  # the previous pass is still running
        try:
            self._pass()
            self._metrics.monitor_runs.labels("ok").inc()
        except CompactordError as exc:
            # A broker that does not answer is logged by the daemon's broker probe, once per change.
            (log.debug if isinstance(exc, BrokerUnavailable) else log.warning)("backlog monitor pass failed: %s", exc)
            self._metrics.monitor_runs.labels("error").inc()
        except Exception:
            log.exception("backlog monitor pass failed")
            self._metrics.monitor_runs.labels("error").inc()
        finally:
            self.last_run = time.time()
            self._lock.release()

    # -- what the broker says of a topic -----------------------------------------------------------

    def refresh(self, topic: str) -> BrokerTopic:
        """Ask the broker for ``topic``'s id, offsets and configs now, and keep the answer.

        :raises TopicNotFound: the broker has no such topic.
        """
        broker = self._broker
        asked = time.time()  # the view is as old as its first answer
        offsets = broker.offsets(topic)
        configs = broker.topic_configs(topic)
        self._tell_configs(topic, configs)
        known = BrokerTopic(broker.topic_id(topic), offsets, configs, asked)
        self.topics[topic] = known
        self._metrics.topic_broker_compacted.labels(topic).set(1 if configs.compacted_by_broker else 0)
        return known

    def _tell_configs(self, topic: str, configs: TopicConfigs) -> None:
        """One line when the broker does not describe the topic's cleanup configs, once per topic (each monitor
        pass and each compaction's end ask again), and one again when its answer changes."""
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

    def _pass(self) -> None:
        problem = self._store_problem()
        if problem is not None:  # a compaction could not write its ledger: none is started
            log.debug("no backlog pass: %s", problem)
            return
        broker_topics = set(self._broker.list_topics())
        self._note_missing(broker_topics)
        for topic in sorted(broker_topics & set(self._store.topics())):
            if self._stopping.is_set():
                return
            if not self._pattern.fullmatch(topic):  # matching topics are refreshed by _consider
                try:
                    self.refresh(topic)
                except CompactordError as exc:
                    self._unless_down(exc)
                    log.debug("topic %s not refreshed: %s", topic, exc)
        uncleanable = 0
        failing: set[str] = set()
        monitored: list[str] = []
        for topic in sorted(broker_topics):
            if self._stopping.is_set():
                return
            if not self._pattern.fullmatch(topic):
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
                self._consider(topic, failures)
            except CompactordError as exc:
                self._unless_down(exc)
                log.warning("backlog of topic %s not measured: %s", topic, exc)
        self._metrics.uncleanable.set(uncleanable)
        self._set_cleanliness(monitored, failing)
        self._registry.kick()

    def _unless_down(self, exc: CompactordError) -> None:
        """Re-raise ``exc`` when no broker answers at all: the pass ends there instead of waiting out a
        timeout per topic (the daemon's broker probe logs the outage, once). A broker unreachable for one
        topic only (its partitions' leader is down) does not stop the others."""
        if not isinstance(exc, BrokerUnavailable):
            return
        try:
            self._broker.ping()
        except CompactordError:
            raise exc from None

    def _set_cleanliness(self, monitored: list[str], failing: set[str]) -> None:
        """The gauges over every monitored topic (Kafka's cleaner's): the largest compaction delay and
        dirty ratio, and the backlog that failing compactions leave behind."""
        measured = [(t, b) for t in monitored if (b := self.backlogs.get(t)) is not None]
        m = self._metrics
        m.max_compaction_delay.set(max((b.age_seconds for _t, b in measured if b.records), default=0.0))
        m.max_dirty_ratio.set(max((b.dirty_ratio for _t, b in measured), default=0.0))
        m.uncleanable_bytes.set(sum(b.bytes for t, b in measured if t in failing))

    def refresh_quietly(self, topic: str) -> BrokerTopic | None:
        try:
            return self.refresh(topic)
        except CompactordError as exc:
            log.debug("topic %s not refreshed: %s", topic, exc)
            return None

    def _consider(self, topic: str, failures: int) -> None:
        # The policy and the topic's last task as they were before the measure: a task that ends (or a
        # policy set) while this pass measures makes the measure stale, and the next pass decides.
        policy = dict(self._policies.get(topic).effective(self._settings))
        last_before = self._registry.last(topic)
        running_before = self._registry.live(topic) is not None
        known = self.refresh(topic)
        policy["maxLagSeconds"] = known.effective_max_lag(policy["maxLagSeconds"])
        self._metrics.topic_max_lag.labels(topic).set(policy["maxLagSeconds"])  # what the delay alert compares
        backlog = self.measure(topic, known.offsets)
        self.record_backlog(backlog)
        stale = running_before or self._registry.last(topic) is not last_before
        if stale or self._registry.live(topic) is not None or self._in_backoff(topic, failures):
            return
        fired = triggers_fired(backlog, policy) + self._view_triggers(topic, known)
        if not fired:
            return
        reason = Reason.combine(fired)
        log.info("compacting topic %s (reason %s): %s", topic, reason.kind, reason.detail)
        try:
            self._registry.trigger(topic, backlog=backlog.bytes, reason=reason)
        except CompactionAlreadyRunning:
            pass

    def record_backlog(self, backlog: Backlog) -> None:
        """Keep a measure of a topic's backlog (``GET /v1/topics``) and set its metrics."""
        topic = backlog.topic
        self.backlogs[topic] = backlog
        m = self._metrics
        m.backlog_records.labels(topic).set(backlog.records)
        m.backlog_bytes.labels(topic).set(backlog.bytes)
        m.backlog_age.labels(topic).set(backlog.age_seconds)
        m.dirty_ratio.labels(topic).set(backlog.dirty_ratio)

    def _view_triggers(self, topic: str, known: BrokerTopic) -> list[Reason]:
        """Reasons to compact that are not a backlog: the ledger is of a log that no longer exists, or the
        log start moved past entries the ledger still holds (retention)."""
        try:
            manifest = self._registry.service(topic).ledger_info()
        except LedgerCorrupt:
            return []
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
        the broker's answer already in hand (else it is asked)."""
        service = self._registry.service(topic)
        try:
            manifest = service.ledger_info()
            corrupt = False
        except LedgerCorrupt:
            manifest, corrupt = None, True
        corrupt = corrupt or service.corrupt_ledger() is not None
        self._metrics.ledger_corrupt.labels(topic).set(1 if corrupt else 0)
        offsets = self._broker.offsets(topic) if offsets is None else offsets
        if manifest is not None and self._new_log(topic, manifest, offsets) is not None:
            manifest = None  # the ledger is of a log that no longer exists: the whole new log is the backlog
        horizon = manifest.horizon if manifest is not None else {}
        starts = {p: max(horizon.get(p, -1) + 1, o.log_start) for p, o in offsets.items()}
        records = sum(max(0, o.end - starts[p]) for p, o in offsets.items())
        ledger_records = manifest.records_kept + manifest.markers if manifest is not None else 0
        if records == 0:
            return Backlog(topic, 0, 0, 0.0, ledger_records)
        sample = sample_tail(self._settings, topic, {p: (starts[p], o.end) for p, o in offsets.items()})
        mean = self._mean_record_size(topic) or sample.mean_record_bytes
        age = time.time() - sample.first_timestamp_ms / 1000 if sample.first_timestamp_ms is not None else 0.0
        return Backlog(topic, records, int(mean * records), max(0.0, age), ledger_records)

    def _new_log(self, topic: str, manifest: LedgerManifest, offsets: dict[int, PartitionOffsets]) -> str | None:
        """Why ``offsets`` (with the topic id last seen, unless seen before the ledger was made) are not of
        the log ``manifest``'s ledger was made of, or None."""
        known = self.topics.get(topic)
        topic_id = known.topic_id if known is not None and known.refreshed_at * 1000 >= manifest.finished_at_ms \
            else None
        return new_log_reason(manifest, offsets, LogNow(topic_id))

    def _mean_record_size(self, topic: str) -> float | None:
        for ctx in reversed(self._registry.history(topic)):
            tail, read = ctx.stats.tail_records, ctx.stats.bytes_read
            if tail and read:
                return float(read) / tail
        return None

    def _note_missing(self, broker_topics: set[str]) -> None:
        store = self._store
        missing = set()
        for topic in store.topics():
            try:
                has_ledger = store.current_ledger_id(topic) is not None
            except LedgerCorrupt:
                has_ledger = True
            if has_ledger and topic not in broker_topics:
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
