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
from dataclasses import dataclass
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler

from compactord.config import Settings
from compactord.daemon.metrics import Metrics
from compactord.daemon.policies import PolicyStore
from compactord.daemon.registry import TaskRegistry
from compactord.errors import CompactionAlreadyRunning, CompactordError, LedgerCorrupt
from compactord.interfaces import BrokerMetadata
from compactord.kafka.backlog import sample_tail
from compactord.ledger.store import LedgerStore
from compactord.task import TaskState

__all__ = ["Backlog", "BacklogMonitor", "triggers_fired"]

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 3600
UNCLEANABLE_AFTER = 3


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


def triggers_fired(backlog: Backlog, policy: dict[str, Any]) -> list[str]:
    """The enabled triggers whose value is strictly greater than their threshold."""
    fired = []
    if policy["thresholdBytes"] > 0 and backlog.bytes > policy["thresholdBytes"]:
        fired.append(f"backlog {backlog.bytes} bytes > {policy['thresholdBytes']}")
    if policy["thresholdMessages"] > 0 and backlog.records > policy["thresholdMessages"]:
        fired.append(f"backlog {backlog.records} records > {policy['thresholdMessages']}")
    if policy["maxLagSeconds"] > 0 and backlog.records > 0 and backlog.age_seconds > policy["maxLagSeconds"]:
        fired.append(f"oldest uncompacted record {backlog.age_seconds:.0f}s old > {policy['maxLagSeconds']}s")
    if policy["minDirtyRatio"] > 0 and backlog.records > 0 and backlog.dirty_ratio > policy["minDirtyRatio"]:
        fired.append(f"dirty ratio {backlog.dirty_ratio:.3f} > {policy['minDirtyRatio']}")
    return fired


class BacklogMonitor:
    def __init__(self, settings: Settings, broker: BrokerMetadata, store: LedgerStore, registry: TaskRegistry,
                 policies: PolicyStore, metrics: Metrics) -> None:
        self._settings = settings
        self._broker = broker
        self._store = store
        self._registry = registry
        self._policies = policies
        self._metrics = metrics
        self._pattern = re.compile(settings.topics_pattern)
        self._scheduler = BackgroundScheduler(daemon=True, timezone="UTC")
        self._lock = threading.Lock()
        self.backlogs: dict[str, Backlog] = {}
        self.missing: set[str] = set()
        self.last_run: float | None = None

    def start(self) -> None:
        self._scheduler.add_job(self.run_once, "interval", seconds=self._settings.monitor_interval_seconds,
                                id="backlog-monitor", max_instances=1, coalesce=True)
        self._scheduler.start()

    def stop(self) -> None:
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
            log.warning("backlog monitor pass failed: %s", exc)
            self._metrics.monitor_runs.labels("error").inc()
        except Exception:
            log.exception("backlog monitor pass failed")
            self._metrics.monitor_runs.labels("error").inc()
        finally:
            self.last_run = time.time()
            self._lock.release()

    def _pass(self) -> None:
        broker_topics = set(self._broker.list_topics())
        self._note_missing(broker_topics)
        uncleanable = 0
        for topic in sorted(broker_topics):
            if not self._pattern.fullmatch(topic):
                continue
            failures = self._registry.recent_failures(topic)
            self._metrics.topic_uncleanable.labels(topic).set(1 if failures >= UNCLEANABLE_AFTER else 0)
            uncleanable += failures >= UNCLEANABLE_AFTER
            if self._policies.unloaded(topic):
                continue
            try:
                self._consider(topic, failures)
            except CompactordError as exc:
                log.warning("backlog of topic %s not measured: %s", topic, exc)
        self._metrics.uncleanable.set(uncleanable)
        self._registry.kick()

    def _consider(self, topic: str, failures: int) -> None:
        backlog = self.measure(topic)
        self.backlogs[topic] = backlog
        m = self._metrics
        m.backlog_records.labels(topic).set(backlog.records)
        m.backlog_bytes.labels(topic).set(backlog.bytes)
        m.backlog_age.labels(topic).set(backlog.age_seconds)
        m.dirty_ratio.labels(topic).set(backlog.dirty_ratio)
        if self._registry.live(topic) is not None or self._in_backoff(topic, failures):
            return
        fired = triggers_fired(backlog, self._policies.get(topic).effective(self._settings))
        if not fired:
            return
        log.info("compacting topic %s: %s", topic, "; ".join(fired))
        try:
            self._registry.trigger(topic, backlog=backlog.bytes)
        except CompactionAlreadyRunning:
            pass

    def _in_backoff(self, topic: str, failures: int) -> bool:
        if failures == 0:
            return False
        last = self._registry.last(topic)
        if last is None or last.state is not TaskState.FAILED or last.finished_at is None:
            return False
        delay = min(self._settings.monitor_interval_seconds * 2 ** (failures - 1), MAX_BACKOFF_S)
        return time.time() < last.finished_at + delay

    def measure(self, topic: str) -> Backlog:
        """The topic's backlog since its horizon (the whole topic if it was never compacted)."""
        service = self._registry.service(topic)
        try:
            manifest = service.ledger_info()
            corrupt = False
        except LedgerCorrupt:
            manifest, corrupt = None, True
        corrupt = corrupt or service.corrupt_ledger() is not None
        self._metrics.ledger_corrupt.labels(topic).set(1 if corrupt else 0)
        horizon = manifest.horizon if manifest is not None else {}
        offsets = self._broker.offsets(topic)
        starts = {p: max(horizon.get(p, -1) + 1, o.log_start) for p, o in offsets.items()}
        records = sum(max(0, o.end - starts[p]) for p, o in offsets.items())
        ledger_records = manifest.records_kept + manifest.markers if manifest is not None else 0
        if records == 0:
            return Backlog(topic, 0, 0, 0.0, ledger_records)
        sample = sample_tail(self._settings, topic, {p: (starts[p], o.end) for p, o in offsets.items()})
        mean = self._mean_record_size(topic) or sample.mean_record_bytes
        age = time.time() - sample.first_timestamp_ms / 1000 if sample.first_timestamp_ms is not None else 0.0
        return Backlog(topic, records, int(mean * records), max(0.0, age), ledger_records)

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
