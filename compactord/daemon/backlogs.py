"""A topic's backlog since its horizon (``Backlog``), the triggers it fires, and its measure (``BacklogMeter``).

The monitor's pass measures every topic on the broker at once: the offsets come from one batched answer
(``BrokerMetadata.describe_many``), and the tail sample that gives the age of the oldest uncompacted record and
the mean record size is read for all the topics that need one with one consumer (``sample_tails``). A sample
stays good while the topic's starts (its horizon and log starts) stay where they were: the first record after
them is the same record; so a pass samples only the topics whose horizon or log start moved, or that were
never sampled. ``BacklogCache`` is what the daemon asks at a task's end (one topic, measured again at once).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from compactord.config import Settings
from compactord.daemon.broker_watch import OneCallAtATime
from compactord.errors import CompactordError, LedgerCorrupt
from compactord.kafka.backlog import TailSample, sample_tails
from compactord.model import LedgerManifest
from compactord.task import Reason

if TYPE_CHECKING:
    from compactord.daemon.broker_view import BrokerTopic
    from compactord.daemon.metrics import Metrics
    from compactord.daemon.scheduler import TaskRegistry
    from compactord.interfaces import TopicCompactionService
    from compactord.ledger.store import LedgerStore

__all__ = ["Backlog", "BacklogCache", "BacklogMeter", "triggers_fired"]

log = logging.getLogger(__name__)
SAMPLES_KEPT_MAX = 100_000  # topics whose last tail sample is kept (past it, the kept ones are dropped)


@dataclass(frozen=True)
class Backlog:
    topic: str
    records: int
    bytes: int
    age_seconds: float
    ledger_records: int
    measured_at: float = 0.0  # when the broker's offsets it was computed from were asked (UTC seconds)

    @property
    def dirty_ratio(self) -> float:
        total = self.ledger_records + self.records
        return self.records / total if total else 0.0


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


@dataclass(frozen=True)
class _Tail:
    topic: str
    starts: dict[int, int]
    ends: dict[int, int]
    records: int
    ledger_records: int
    measured_at: float


class BacklogMeter:
    """Measures backlogs from the broker's offsets (``BrokerTopic``) and the topic's current ledger."""

    def __init__(self, settings: Settings, registry: TaskRegistry, metrics: Metrics,
                 sampler: Callable[..., dict[str, TailSample]] = sample_tails, store: LedgerStore | None = None) -> None:
        """``store``: the ledger root's, whose pointers say whether a manifest kept here is still the current one
        (None: every measure asks the topic's service)."""
        self._settings = settings
        self._registry = registry
        self._metrics = metrics
        self._sampler = sampler
        self._store = store
        self._samples: dict[str, tuple[tuple[tuple[int, int], ...], TailSample]] = {}
        # Each topic's current ledger's manifest as last read: a ledger never changes once written, and its id is
        # never used again, so it is read again only when the pointer names another ledger.
        self._manifests: dict[str, LedgerManifest] = {}
        self._lock = threading.Lock()

    def ledger(self, topic: str, raising: bool = False, on_root: bool = True) -> LedgerManifest | None:
        """The topic's current ledger as its service holds it (None: none, or it cannot be read; the gauge
        ``compactord_ledger_corrupt`` says which). A topic with no state here has no service made for it;
        ``on_root=False``: the root's listing has no folder of the topic (so it has no ledger), nothing is asked.

        :raises LedgerCorrupt: ``raising``, and the ledger or its pointer cannot be read."""
        if not on_root:
            with self._lock:
                self._manifests.pop(topic, None)
            return None
        service = self._registry.existing_service(topic)
        if service is None:
            return None
        failure: LedgerCorrupt | None = None
        try:
            manifest = self._current(topic, service)
        except LedgerCorrupt as exc:
            manifest, failure = None, exc
        corrupt = failure is not None or service.corrupt_ledger() is not None
        self._metrics.ledger_corrupt.labels(topic).set(1 if corrupt else 0)
        if failure is not None and raising:
            raise failure
        return manifest

    def _current(self, topic: str, service: TopicCompactionService) -> LedgerManifest | None:
        """The current ledger's manifest: the one kept while the pointer (as the store keeps it) names its ledger,
        else the service's, kept."""
        with self._lock:
            kept = self._manifests.get(topic)
        if kept is not None and self._store is not None and self._store.current_ledger_id(topic) == kept.ledger_id:
            return kept
        manifest = service.ledger_info()
        with self._lock:
            if manifest is None:
                self._manifests.pop(topic, None)
            else:
                self._manifests[topic] = manifest
        return manifest

    def measure_many(self, views: dict[str, tuple[LedgerManifest | None, BrokerTopic]]) -> dict[str, Backlog]:
        """Each topic's backlog since its horizon (the whole topic if it was never compacted, or if its ledger is
        of a log that no longer exists), with one tail sample read for all the topics that need a new one."""
        tails: dict[str, _Tail] = {}
        for topic, (manifest, known) in views.items():
            if manifest is not None and known.new_log(manifest) is not None:
                manifest = None  # the whole new log is the backlog
            horizon = manifest.horizon if manifest is not None else {}
            offsets = known.offsets
            starts = {p: max(horizon.get(p, -1) + 1, o.log_start) for p, o in offsets.items()}
            records = sum(max(0, o.end - starts[p]) for p, o in offsets.items())
            ledger_records = manifest.records_kept + manifest.markers if manifest is not None else 0
            tails[topic] = _Tail(topic, starts, {p: o.end for p, o in offsets.items()}, records, ledger_records,
                                 known.refreshed_at)
        wanted = {t: tail for t, tail in tails.items() if tail.records and self._kept_sample(tail) is None}
        if wanted:
            fresh = self._sampler(self._settings, {t: {p: (tail.starts[p], tail.ends[p]) for p in tail.starts}
                                                   for t, tail in wanted.items()})
            with self._lock:
                if len(self._samples) + len(fresh) > SAMPLES_KEPT_MAX:
                    self._samples.clear()
                for topic, sample in fresh.items():
                    if sample.first_timestamp_ms is not None:  # a sample that saw no record is asked again
                        self._samples[topic] = (_key(wanted[topic]), sample)
        out = {}
        for topic, tail in tails.items():
            if not tail.records:
                out[topic] = Backlog(topic, 0, 0, 0.0, tail.ledger_records, tail.measured_at)
                continue
            kept = self._kept_sample(tail)
            sample = kept if kept is not None else TailSample(0.0, None)
            mean = self._mean_record_size(topic) or sample.mean_record_bytes
            first = sample.first_timestamp_ms
            age = time.time() - first / 1000 if first is not None else 0.0
            out[topic] = Backlog(topic, tail.records, int(mean * tail.records), max(0.0, age), tail.ledger_records,
                                 tail.measured_at)
        return out

    def _kept_sample(self, tail: _Tail) -> TailSample | None:
        with self._lock:
            kept = self._samples.get(tail.topic)
        return kept[1] if kept is not None and kept[0] == _key(tail) else None

    def _mean_record_size(self, topic: str) -> float | None:
        for ctx in reversed(self._registry.history(topic)):
            tail, read = ctx.stats.tail_records, ctx.stats.bytes_read
            if tail and read:
                return float(read) / tail
        return None

    def forget(self, topic: str) -> None:
        with self._lock:
            self._samples.pop(topic, None)
            self._manifests.pop(topic, None)


def _key(tail: _Tail) -> tuple[tuple[int, int], ...]:
    return tuple(sorted(tail.starts.items()))


class _Monitor(Protocol):  # the backlog monitor, as far as this module needs it
    meter: BacklogMeter

    def measure_now(self, topic: str) -> Backlog: ...


class BacklogCache:
    """What the daemon asks of backlogs outside the monitor's pass: a task's end measures its topic again at once
    (for the metrics, the monitor and the listing), within a deadline if given."""

    def __init__(self, monitor: _Monitor, registry: TaskRegistry) -> None:
        self._monitor = monitor
        self._registry = registry
        self._calls = OneCallAtATime()  # a stalled broker holds one thread, not every request

    def measure(self, topic: str, *, for_listing: bool = False, within_s: float | None = None) -> Backlog | None:
        """Measure ``topic`` now and keep it as the monitor's (with its metrics); None if the broker does not
        answer (within ``within_s``, if given) or lacks the topic. ``for_listing`` is kept for the callers:
        the listing shows the monitor's measures."""
        del for_listing
        try:
            if within_s is None:
                return self._monitor.measure_now(topic)
            return self._calls.call(lambda: self._monitor.measure_now(topic), within_s, f"topic {topic}'s offsets")
        except CompactordError as exc:
            log.debug("backlog of topic %s not measured: %s", topic, exc)
            return None

    def forget(self, topic: str) -> None:
        self._monitor.meter.forget(topic)
