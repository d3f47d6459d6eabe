"""Prometheus metrics (prefix ``compactord_``): Pulsar's CompactorMXBean and Kafka's cleaner metrics.

One ``CollectorRegistry`` per daemon (not the global one), served at ``/metrics``. Time-based values
(seconds since the last success, tasks running) are computed at scrape time by a custom collector.
"""

from __future__ import annotations

import contextlib
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

_RESULT = {TaskState.SUCCEED: "succeeded", TaskState.FAILED: "failed", TaskState.CANCELLED: "cancelled"}
_DURATION_BUCKETS = (1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200)
# A store's request: a local disk's in microseconds, S3's in milliseconds, a retried one in seconds.
_REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


_THREAD = threading.local()  # per thread: its broker requests (``thread_broker_requests``)


class _LiveCollector(Collector):
    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap = self._snapshot()
        yield GaugeMetricFamily("compactord_running_tasks", "Compactions holding a slot now", value=snap["running"])
        yield GaugeMetricFamily("compactord_pending_tasks", "Compactions waiting for a slot", value=snap["pending"])
        since = GaugeMetricFamily(
            "compactord_seconds_since_last_success", "Seconds since the topic's last successful compaction",
            labels=["topic"],
        )
        now = time.time()
        for topic, ts in snap["last_success"].items():
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
        self.compactions = Counter(
            "compactord_compactions", "Ended compactions by result (succeeded, failed, cancelled)",
            ["topic", "result"], registry=r,
        )
        self.tasks = Counter(
            "compactord_tasks", "Ended tasks by why they ran (a kind of compactord.task.REASON_KINDS) and result",
            ["reason", "result"], registry=r,
        )
        self.duration = Histogram(
            "compactord_compaction_duration_seconds", "Duration of ended compactions", ["topic"],
            buckets=_DURATION_BUCKETS, registry=r,
        )
        self.recreated_rebuilds = Counter(
            "compactord_recreated_rebuilds", "Full rebuilds because the topic's log was a new one (recreated)",
            ["topic"], registry=r)
        self.switch_warnings = Counter(
            "compactord_switch_warnings", "Switches that committed and then failed a later step (fsync)",
            ["topic"], registry=r)
        self.history_failures = Counter(
            "compactord_history_failures", "Runs of the topic its run history could not record (its objects at "
            "fault, not the store: logged)", ["topic"], registry=r)
        self.topic_broker_compacted = Gauge(
            "compactord_topic_broker_compacted", "1 if the broker compacts the topic itself (cleanup.policy)",
            ["topic"], registry=r)
        self.removed = Counter("compactord_removed_events", "Records removed by compaction (Pulsar's removed events)",
                               ["topic"], registry=r)
        self.records_read = Counter("compactord_records_read", "Records read by compactions (ledger + tail)",
                                    ["topic"], registry=r)
        self.bytes_read = Counter("compactord_bytes_read", "Key and value bytes read from Kafka by compactions",
                                  ["topic"], registry=r)
        self.records_written = Counter("compactord_records_written", "Entries written into new ledgers",
                                       ["topic"], registry=r)
        self.bytes_written = Counter("compactord_bytes_written", "Bytes of new ledgers", ["topic"], registry=r)
        self.spilled_bytes = Counter("compactord_spilled_bytes",
                                     "Bytes reading tasks wrote to their local disk (windows past their memory budget)",
                                     ["topic"], registry=r)
        self.compacted_entries = Gauge("compactord_compacted_entries", "Live entries in the current ledger",
                                       ["topic"], registry=r)
        self.compacted_bytes = Gauge("compactord_compacted_bytes", "Size of the current ledger", ["topic"], registry=r)
        self.backlog_records = Gauge("compactord_backlog_records", "Records after the horizon", ["topic"], registry=r)
        self.backlog_bytes = Gauge("compactord_backlog_bytes", "Estimated bytes after the horizon", ["topic"],
                                   registry=r)
        self.backlog_age = Gauge("compactord_backlog_age_seconds", "Age of the oldest record after the horizon",
                                 ["topic"], registry=r)
        self.topic_max_lag = Gauge(
            "compactord_topic_max_lag_seconds",
            "The topic's effective max lag at the monitor's last pass: compactionMaxLagSeconds or the topic's "
            "maxLagSeconds policy, lowered to half its delete.retention.ms where the broker compacts it; 0: none",
            ["topic"], registry=r)
        self.dirty_ratio = Gauge("compactord_dirty_ratio", "Tail records / (ledger + tail records)", ["topic"],
                                 registry=r)
        self.uncleanable = Gauge("compactord_uncleanable_topics", "Topics whose last 3 compactions failed",
                                 registry=r)
        self.topic_uncleanable = Gauge("compactord_topic_uncleanable", "1 if the topic's last 3 compactions failed",
                                       ["topic"], registry=r)
        self.ledger_corrupt = Gauge("compactord_ledger_corrupt", "1 if the topic's current ledger fails verification",
                                    ["topic"], registry=r)
        self.missing_topics = Gauge("compactord_topics_missing_on_broker",
                                    "Topics with a ledger that the broker no longer lists", registry=r)
        self.topic_missing = Gauge("compactord_topic_missing_on_broker", "1 if the broker no longer lists the topic",
                                   ["topic"], registry=r)
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
        self.last_run_kept_ratio = Gauge(
            "compactord_last_run_kept_ratio",
            "Of the records the topic's last successful compaction read, the share it kept (entries and "
            "deletion markers written / records read)", ["topic"], registry=r)
        self.task_cpu_ratio = Gauge(
            "compactord_task_cpu_ratio",
            "The topic's last compaction's reading tasks: CPU seconds per wall second, summed over the tasks "
            "(near 1: each had a core; far below: they waited for one, or for the broker)", ["topic"], registry=r)
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
        r.register(_FooterCacheCollector())
        if snapshot is not None:
            r.register(_LiveCollector(snapshot))

    def task_ended(self, ctx: CompactionTaskCtx) -> None:
        topic, result = ctx.topic, _RESULT.get(ctx.state)
        if result is None:
            return
        self.compactions.labels(topic, result).inc()
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
        """Drop every series of a deleted topic (a test checks that each metric with a topic label is
        here: a series left behind lives as long as the process)."""
        for metric in (self.duration, self.recreated_rebuilds, self.switch_warnings, self.history_failures,
                       self.topic_broker_compacted,
                       self.removed, self.records_read, self.bytes_read, self.records_written,
                       self.bytes_written, self.spilled_bytes, self.compacted_entries, self.compacted_bytes, self.backlog_records,
                       self.backlog_bytes, self.backlog_age, self.topic_max_lag, self.dirty_ratio, self.topic_uncleanable,
                       self.ledger_corrupt, self.topic_missing, self.last_run_kept_ratio,
                       self.task_cpu_ratio):
            with contextlib.suppress(KeyError):  # prometheus-client < 0.21 raises for an absent series
                metric.remove(topic)
        for result in _RESULT.values():
            with contextlib.suppress(KeyError):
                self.compactions.remove(topic, result)

    def render(self) -> bytes:
        return generate_latest(self.registry)
