"""The periodic sweep of the ledger root: every ``storageSweepIntervalSeconds``, each topic's folder loses what
no pointer names (the ledgers of runs that crashed or were cancelled, temporary files) and its unfinished
uploads, once older than ``storageSweepMinAgeSeconds`` (docs/design.md, "The sweep").

A topic is swept only under its service's guard (``interfaces.IdleGuarded``: the one a compaction and a
deletion take), and only when no
task of it runs or is still stopping; the highest ledger id under the topic is read under that guard, and no
ledger above it is touched: a task that starts once the guard is let go allocates a higher id. The age
margin is for what this daemon cannot see: executors of a driver that died may still upload, and an object
store's clock may differ from this host's.
"""

from __future__ import annotations

import logging
import time

from compactord.config import Settings
from compactord.daemon.metrics import Metrics
from compactord.daemon.periodic import PeriodicPass
from compactord.daemon.scheduler import TaskRegistry
from compactord.errors import CompactordError
from compactord.interfaces import IdleGuarded
from compactord.ledger.removal import Swept
from compactord.ledger.store import LedgerStore

__all__ = ["StorageSweeper"]

log = logging.getLogger(__name__)


class StorageSweeper:
    """Sweeps every topic of the root, one pass at a time (``start_pass`` from a timer, or ``run_once``)."""

    def __init__(self, settings: Settings, store: LedgerStore, registry: TaskRegistry, metrics: Metrics) -> None:
        self._settings = settings
        self._store = store
        self._registry = registry
        self._metrics = metrics
        self._periodic: PeriodicPass[dict[str, Swept]] = PeriodicPass(
            "storage-sweep-pass", "sweep of the ledger root",
            lambda now=None: self._pass(time.time() if now is None else now), {},
            lambda result: metrics.sweeps.labels(result).inc())
        self.start_pass = self._periodic.start_pass

    @property
    def last_run(self) -> float | None:
        return self._periodic.last_run

    def stop(self) -> None:
        """No new pass starts; a pass under way ends before its next topic."""
        self._periodic.stop()

    def run_once(self, now: float | None = None) -> dict[str, Swept]:
        """Sweep every topic now (``now``: the time the margin counts back from; default the clock's); return
        what was removed, by topic (topics where nothing was are left out). A pass already under way: nothing."""
        return self._periodic.run_once(now)

    def _pass(self, now: float) -> dict[str, Swept]:
        older_than = now - self._settings.storage_sweep_min_age_seconds
        done: dict[str, Swept] = {}
        for topic in self._store.topics():
            if self._periodic.stopping.is_set():
                break
            try:
                swept = self.sweep_topic(topic, older_than)
            except CompactordError as exc:  # a corrupt pointer, a deletion under way: the others go on
                log.warning("topic %s not swept: %s", topic, exc)
                continue
            if swept is not None and (swept.keys or swept.uploads):
                done[topic] = swept
        return done

    def sweep_topic(self, topic: str, older_than: float) -> Swept | None:
        """Sweep one topic of what is older than ``older_than`` (UTC seconds); None when it was not swept
        (a task of it runs or is stopping, it is being deleted, or its service has no idle guard)."""
        service = self._registry.service(topic)
        if not isinstance(service, IdleGuarded):
            return None  # no guard to take, so its ledgers are left alone
        with service.idle_guard() as idle:
            if not idle or self._store.deletion_pending(topic):
                log.debug("topic %s not swept: a task of it runs, or it is being deleted", topic)
                return None
            ceiling = max(self._store.ledger_ids(topic), default=0)
        swept = self._store.sweep(topic, ceiling, older_than)
        m = self._metrics
        m.swept_objects.inc(swept.objects)
        m.swept_bytes.inc(swept.bytes)
        m.swept_uploads.inc(swept.uploads)
        if swept.keys or swept.uploads:
            log.info("topic %s swept: %d objects (%d bytes) of %s, %d unfinished uploads", topic, swept.objects,
                     swept.bytes, swept.keys or "nothing", swept.uploads)
        return swept
