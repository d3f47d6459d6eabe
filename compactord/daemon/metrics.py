"""Prometheus metrics (prefix ``compactord_``): Pulsar's CompactorMXBean and Kafka's cleaner metrics.

One ``CollectorRegistry`` per daemon (not the global one), served at ``/metrics``. Time-based values
(seconds since the last success, tasks running) are computed at scrape time by a custom collector.

The metrics with a ``topic`` label make series per topic; ``per_topic_for`` turns them off while the monitor
knows more topics than ``metricsPerTopicMaxTopics`` (the series are dropped and none is made; the totals
stay), and on again below it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from compactord.ledger import footer_cache
from compactord.task import CompactionTaskCtx, TaskState
from compactord.task_report import count_request

__all__ = ["Metrics"]

log = logging.getLogger(__name__)

_RESULT = {TaskState.SUCCEED: "succeeded", TaskState.FAILED: "failed", TaskState.CANCELLED: "cancelled"}
_DURATION_BUCKETS = (1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200)
# A store's request: a local disk's in microseconds, S3's in milliseconds, a retried one in seconds.
_REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


_THREAD = threading.local()  # per thread: its broker requests (``thread_broker_requests``)


class _Discarded:
    """The series of a topic while per-topic series are off: what is set or counted on it goes nowhere."""

    def set(self, value: float) -> None:
        pass

    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass


_DISCARDED = _Discarded()


class _PerTopic:
    """A metric with a ``topic`` label: ``labels`` makes a series only while ``exported()`` says so."""

    exported: Callable[[], bool]

    def labels(self, *values: Any, **named: Any) -> Any:
        if not self.exported():
            return _DISCARDED
        return super().labels(*values, **named)  # type: ignore[misc]

    def series_of(self, topic: str) -> list[tuple[str, ...]]:
        """The label values of the topic's series (prometheus-client keeps them in ``_metrics``)."""
        at = self._labelnames.index("topic")  # type: ignore[attr-defined]
        with self._lock:  # type: ignore[attr-defined]
            return [values for values in self._metrics if values[at] == topic]  # type: ignore[attr-defined]


class _TopicCounter(_PerTopic, Counter):
    pass


class _TopicGauge(_PerTopic, Gauge):
    pass


class _TopicHistogram(_PerTopic, Histogram):
    pass


class _LiveCollector(Collector):
    def __init__(self, snapshot: Callable[[], dict[str, Any]], per_topic: Callable[[], bool]) -> None:
        self._snapshot = snapshot
        self._per_topic = per_topic

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        snap = self._snapshot()
        yield GaugeMetricFamily("compactord_running_tasks", "Compactions holding a slot now", value=snap["running"])
        yield GaugeMetricFamily("compactord_pending_tasks", "Compactions waiting for a slot", value=snap["pending"])
        since = GaugeMetricFamily(
            "compactord_seconds_since_last_success", "Seconds since the topic's last successful compaction",
            labels=["topic"],
        )
        now = time.time()
        for topic, ts in snap["last_success"].items() if self._per_topic() else ():
            since.add_metric([topic], max(0.0, now - ts))
        yield since
        since_monitor = GaugeMetricFamily(
            "compactord_seconds_since_monitor_run",
            "Seconds since the backlog monitor's last pass ended (no sample before the first pass)")
        if snap.get("monitor_last_run") is not None:
            since_monitor.add_metric([], max(0.0, now - snap["monitor_last_run"]))
        yield since_monitor
        yield GaugeMetricFamily(
            "compactord_quarantined_topics",
            "Folders under @compactord/quarantine: ledgers found without their CURRENT, kept for an operator",
            value=snap.get("quarantined", 0),
        )
        cluster = snap.get("cluster")
        if cluster is not None:  # a cluster's member (clusterName)
            yield GaugeMetricFamily("compactord_cluster_members", "Members of the cluster as of the last assignment",
                                    value=cluster["members"])
            yield GaugeMetricFamily("compactord_owned_topics", "Topics this member owns now", value=cluster["owned"])
            yield GaugeMetricFamily(
                "compactord_unowned_coordination_partitions",
                "Coordination partitions no member holds, as of the last assignment (their topics are compacted "
                "by no one)", value=cluster["unowned"])
            yield CounterMetricFamily("compactord_rebalances", "Rebalances of the cluster this member took part in",
                                      value=cluster["rebalances"])
            last = GaugeMetricFamily("compactord_rebalance_seconds",
                                     "How long the last rebalance took, from this member's join to its assignment")
            if cluster["rebalance_seconds"] is not None:
                last.add_metric([], cluster["rebalance_seconds"])
            yield last
        yield GaugeMetricFamily(
            "compactord_storage_up",
            "1 while the ledger root's store answers; 0 from a failed request until a probe is answered "
            "(ledger reads answer 503 storage_unavailable meanwhile)", value=snap.get("storage_up", 1))


class _FooterCacheCollector(Collector):
    """The daemon's footer cache (``ledger.footer_cache.SHARED``), read at scrape time."""

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = footer_cache.SHARED.stats()
        lookups = CounterMetricFamily(
            "compactord_storage_metadata_cache_lookups",
            "Lookups of ledger files' Parquet footers in the footer cache, by result (hit, miss: read from the "
            "store)", labels=["result"])
        lookups.add_metric(["hit"], stats.hits)
        lookups.add_metric(["miss"], stats.misses)
        yield lookups
        yield GaugeMetricFamily("compactord_storage_metadata_cache_bytes",
                                "Bytes the footer cache holds (at most storageMetadataCacheBytes)", value=stats.bytes)


class Metrics:
    def __init__(self, snapshot: Callable[[], dict[str, Any]] | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._per_topic = True
        self._per_topic_lock = threading.Lock()
        self.compactions = _TopicCounter(
            "compactord_compactions", "Ended compactions by result (succeeded, failed, cancelled)",
            ["topic", "result"], registry=r,
        )
        self.tasks = Counter(
            "compactord_tasks", "Ended tasks by why they ran (a kind of compactord.task.REASON_KINDS) and result",
            ["reason", "result"], registry=r,
        )
        self.duration = _TopicHistogram(
            "compactord_compaction_duration_seconds", "Duration of ended compactions", ["topic"],
            buckets=_DURATION_BUCKETS, registry=r,
        )
        self.recreated_rebuilds = _TopicCounter(
            "compactord_recreated_rebuilds", "Full rebuilds because the topic's log was a new one (recreated)",
            ["topic"], registry=r)
        self.switch_warnings = _TopicCounter(
            "compactord_switch_warnings", "Switches that committed and then failed a later step (fsync)",
            ["topic"], registry=r)
        self.history_failures = _TopicCounter(
            "compactord_history_failures", "Runs of the topic its run history could not record (its objects at "
            "fault, not the store: logged)", ["topic"], registry=r)
        self.topic_broker_compacted = _TopicGauge(
            "compactord_topic_broker_compacted", "1 if the broker compacts the topic itself (cleanup.policy)",
            ["topic"], registry=r)
        self.removed = _TopicCounter("compactord_removed_events", "Records removed by compaction (Pulsar's removed events)",
                               ["topic"], registry=r)
        self.records_read = _TopicCounter("compactord_records_read", "Records read by compactions (ledger + tail)",
                                    ["topic"], registry=r)
        self.bytes_read = _TopicCounter("compactord_bytes_read", "Key and value bytes read from Kafka by compactions",
                                  ["topic"], registry=r)
        self.records_written = _TopicCounter("compactord_records_written", "Entries written into new ledgers",
                                       ["topic"], registry=r)
        self.bytes_written = _TopicCounter("compactord_bytes_written", "Bytes of new ledgers", ["topic"], registry=r)
        self.spilled_bytes = _TopicCounter("compactord_spilled_bytes",
                                     "Bytes reading tasks wrote to their local disk (windows past their memory budget)",
                                     ["topic"], registry=r)
        self.compacted_entries = _TopicGauge("compactord_compacted_entries", "Live entries in the current ledger",
                                       ["topic"], registry=r)
        self.compacted_bytes = _TopicGauge("compactord_compacted_bytes", "Size of the current ledger", ["topic"], registry=r)
        self.backlog_records = _TopicGauge("compactord_backlog_records", "Records after the horizon", ["topic"], registry=r)
        self.backlog_bytes = _TopicGauge("compactord_backlog_bytes", "Estimated bytes after the horizon", ["topic"],
                                   registry=r)
        self.backlog_age = _TopicGauge("compactord_backlog_age_seconds", "Age of the oldest record after the horizon",
                                 ["topic"], registry=r)
        self.topic_max_lag = _TopicGauge(
            "compactord_topic_max_lag_seconds",
            "The topic's effective max lag at the monitor's last pass: compactionMaxLagSeconds or the topic's "
            "maxLagSeconds policy, lowered to half its delete.retention.ms where the broker compacts it; 0: none",
            ["topic"], registry=r)
        self.dirty_ratio = _TopicGauge("compactord_dirty_ratio", "Tail records / (ledger + tail records)", ["topic"],
                                 registry=r)
        self.fenced_switches = Counter(
            "compactord_fenced_switches", "Switches refused because another writer took the topic (a newer epoch) "
            "or the store let two conditional writes win: the task failed fenced, the view is the winner's",
            registry=r)
        self.uncleanable = Gauge("compactord_uncleanable_topics", "Topics whose last 3 compactions failed",
                                 registry=r)
        self.topic_uncleanable = _TopicGauge("compactord_topic_uncleanable", "1 if the topic's last 3 compactions failed",
                                       ["topic"], registry=r)
        self.ledger_corrupt = _TopicGauge("compactord_ledger_corrupt", "1 if the topic's current ledger fails verification",
                                    ["topic"], registry=r)
        self.missing_topics = Gauge("compactord_topics_missing_on_broker",
                                    "Topics with a ledger that the broker no longer lists", registry=r)
        self.topic_missing = _TopicGauge("compactord_topic_missing_on_broker", "1 if the broker no longer lists the topic",
                                   ["topic"], registry=r)
        self.listener_connections = Gauge("compactord_listener_connections",
                                          "Open connections to the Kafka listener (kafkaListeners)", registry=r)
        self.listener_requests = Counter(
            "compactord_listener_requests", "Requests the Kafka listener answered, by API and the protocol's error "
            "the answer gives the request as a whole (NONE when served)", ["api", "error"], registry=r)
        self.listener_bytes = Counter("compactord_listener_bytes", "Record bytes the Kafka listener answered "
                                      "fetches with, from ledgers or relayed from the broker", ["source"], registry=r)
        self.listener_fetch_seconds = Histogram("compactord_listener_fetch_seconds",
                                                "Time the Kafka listener took to answer a Fetch",
                                                buckets=_REQUEST_BUCKETS, registry=r)
        self.max_compaction_delay = Gauge(
            "compactord_max_compaction_delay_seconds",
            "Largest age of an uncompacted record (the oldest after the horizon) over the monitored topics, at "
            "the monitor's last pass (Kafka's max-compaction-delay-secs)", registry=r)
        self.max_dirty_ratio = Gauge("compactord_max_dirty_ratio",
                                     "Largest dirty ratio over the monitored topics (Kafka's max-dirty-percent / 100)",
                                     registry=r)
        self.uncleanable_bytes = Gauge(
            "compactord_uncleanable_bytes",
            "Backlog bytes of the monitored topics whose last compaction failed (Kafka's uncleanable-bytes)",
            registry=r)
        self.last_run_kept_ratio = _TopicGauge(
            "compactord_last_run_kept_ratio",
            "Of the records the topic's last successful compaction read, the share it kept (entries and "
            "deletion markers written / records read)", ["topic"], registry=r)
        self.task_cpu_ratio = _TopicGauge(
            "compactord_task_cpu_ratio",
            "The topic's last compaction's reading tasks: CPU seconds per wall second, summed over the tasks "
            "(near 1: each had a core; far below: they waited for one, or for the broker)", ["topic"], registry=r)
        self.iceberg_lag = _TopicGauge(
            "compactord_iceberg_lag_ledgers", "Switches of the topic not yet committed to its Iceberg table "
            "(icebergCatalogUri): 0 when the table's snapshot is the current ledger", ["topic"], registry=r)
        self.monitor_runs = Counter("compactord_monitor_runs", "Backlog monitor passes", ["result"], registry=r)
        self.broker_requests = Counter(
            "compactord_broker_requests", "Requests of the daemon's broker client (the monitor, the API's topic checks, "
            "the compactions' planning) by kind: metadata, describe_configs, list_offsets, fetch; one batched call "
            "for many topics counts once", ["op"], registry=r)
        self.monitor_pass_seconds = Gauge("compactord_monitor_pass_seconds", "Wall time of the backlog monitor's "
                                          "last pass", registry=r)
        self.monitor_pass_cpu_seconds = Gauge("compactord_monitor_pass_cpu_seconds", "CPU time of the backlog "
                                              "monitor's last pass (its thread's)", registry=r)
        self.monitor_pass_broker_requests = Gauge(
            "compactord_monitor_pass_broker_requests", "Broker requests of the backlog monitor's last pass (bounded "
            "whatever the number of topics, but for the tail samples of topics whose horizon moved)", registry=r)
        self.monitor_pass_topics = Gauge("compactord_monitor_pass_topics", "Topics the backlog monitor's last pass "
                                         "measured", registry=r)
        self.storage_requests = Counter(
            "compactord_storage_requests", "Requests to the ledger root's store by operation (list, head, get, "
            "put, put_if_absent, put_if_match, put_file, delete), each retry counted", ["op"], registry=r)
        self.storage_request_seconds = Histogram(
            "compactord_storage_request_seconds", "Latency of one request to the ledger root's store, by operation",
            ["op"], buckets=_REQUEST_BUCKETS, registry=r)
        self.swept_objects = Counter("compactord_swept_objects", "Objects the periodic sweep of the ledger root "
                                     "removed (of ledgers no pointer names, temporary files)", registry=r)
        self.swept_bytes = Counter("compactord_swept_bytes", "Bytes of the objects the periodic sweep removed",
                                   registry=r)
        self.swept_uploads = Counter("compactord_swept_uploads", "Unfinished uploads the periodic sweep aborted",
                                     registry=r)
        self.sweeps = Counter("compactord_sweeps", "Periodic sweeps of the ledger root", ["result"], registry=r)
        self.ready = Gauge("compactord_ready", "1 when the daemon is ready (broker answers, Spark warm)", registry=r)
        self.http_response_buffer = Gauge(
            "compactord_http_response_buffer_bytes",
            "Bytes of large answers held for clients still receiving them (bounded by httpResponseBufferBytes)",
            registry=r)
        self.per_topic_series = Gauge(
            "compactord_per_topic_series", "1 while the series per topic are exported (the monitor's last pass "
            "knew at most metricsPerTopicMaxTopics topics), 0 while only the totals are", registry=r)
        self.per_topic_series.set(1)
        for metric in self._topic_metrics():
            metric.exported = self.per_topic_exported
        r.register(_FooterCacheCollector())
        if snapshot is not None:
            r.register(_LiveCollector(snapshot, self.per_topic_exported))

    def _topic_metrics(self) -> list[_PerTopic]:
        return [m for m in vars(self).values() if isinstance(m, _PerTopic)]

    def per_topic_exported(self) -> bool:
        return self._per_topic

    def per_topic_for(self, topics: int, max_topics: int) -> None:
        """Export the series per topic while ``topics`` (the topics the monitor knows) is at most ``max_topics``;
        past it drop them (none is made until it is no more), and say so once in the log."""
        exported = topics <= max_topics
        with self._per_topic_lock:
            if exported == self._per_topic:
                return
            self._per_topic = exported
            if not exported:
                for metric in self._topic_metrics():
                    metric.clear()  # type: ignore[attr-defined]
        self.per_topic_series.set(1 if exported else 0)
        if exported:
            log.info("metrics: series per topic exported again (%d topics, metricsPerTopicMaxTopics=%d)",
                     topics, max_topics)
        else:
            log.info("metrics: no series per topic past metricsPerTopicMaxTopics=%d (%d topics); the totals stay",
                     max_topics, topics)

    def task_ended(self, ctx: CompactionTaskCtx) -> None:
        topic, result = ctx.topic, _RESULT.get(ctx.state)
        if result is None:
            return
        self.compactions.labels(topic, result).inc()
        if ctx.error_type in ("fenced", "store_not_atomic"):
            self.fenced_switches.inc()
        self.tasks.labels(ctx.reason.kind, result).inc()
        if ctx.started_at is not None and ctx.finished_at is not None:
            self.duration.labels(topic).observe(ctx.finished_at - ctx.started_at)
        stats = ctx.stats
        if ctx.state is TaskState.SUCCEED and not stats.skipped:
            self.removed.labels(topic).inc(stats.removed)
            self.records_read.labels(topic).inc(stats.records_read)
            self.bytes_read.labels(topic).inc(stats.bytes_read)
            self.records_written.labels(topic).inc(stats.records_kept + stats.markers)
            self.bytes_written.labels(topic).inc(stats.bytes_written)
            self.spilled_bytes.labels(topic).inc(stats.spilled_bytes)
            self.compacted_entries.labels(topic).set(stats.records_kept)
            self.compacted_bytes.labels(topic).set(stats.bytes_written)
            if stats.task_cpu_ratio is not None:
                self.task_cpu_ratio.labels(topic).set(stats.task_cpu_ratio)
            if stats.records_read:
                self.last_run_kept_ratio.labels(topic).set((stats.records_kept + stats.markers) / stats.records_read)
            if stats.recreated:
                self.recreated_rebuilds.labels(topic).inc()
            if stats.switch_warning:
                self.switch_warnings.labels(topic).inc()

    def broker_request(self, op: str) -> None:
        """The daemon's broker client's observer (``KafkaAdmin(..., observer=metrics.broker_request)``)."""
        self.broker_requests.labels(op).inc()
        _THREAD.broker_requests = getattr(_THREAD, "broker_requests", 0) + 1

    @staticmethod
    def thread_broker_requests() -> int:
        """The broker requests this thread made so far (a pass counts its own: the difference)."""
        return int(getattr(_THREAD, "broker_requests", 0))

    def storage_request(self, op: str, seconds: float) -> None:
        """The store's observer (``open_store(..., observer=metrics.storage_request)``): one request done."""
        self.storage_requests.labels(op).inc()
        count_request(op)  # and for the run that made it (``TaskStats.storage_requests``)
        self.storage_request_seconds.labels(op).observe(seconds)

    def forget(self, topic: str) -> None:
        """Drop every series of a deleted topic, of every metric with a ``topic`` label (a series left behind
        lives as long as the process)."""
        for metric in self._topic_metrics():
            for values in metric.series_of(topic):
                with contextlib.suppress(KeyError):  # removed meanwhile (prometheus-client < 0.21 raises)
                    metric.remove(*values)  # type: ignore[attr-defined]

    def render(self) -> bytes:
        return generate_latest(self.registry)
