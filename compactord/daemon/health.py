"""What the probes answer: whether the daemon lives (``/healthz``) and what it can serve now (``/readyz``).

Every answer comes from memory: the probes never wait on the broker nor on the store. A thread of its own
pings the broker, with a client of its own (``broker_watch.BrokerWatch``); the ledger root's store is
probed only once one of its requests has failed, until it answers again (``store_watch.StoreWatch``), and
the ledger reads answer 503 at once meanwhile.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from compactord.config import Settings
from compactord.daemon.broker_watch import BrokerWatch
from compactord.daemon.metrics import Metrics
from compactord.daemon.store_watch import StoreWatch
from compactord.errors import StorageUnavailable
from compactord.interfaces import BrokerMetadata, EngineRuntime
from compactord.ledger.store import LedgerStore

__all__ = ["Health", "Readiness"]


@dataclass(frozen=True)
class Readiness:
    """What the daemon can serve now (``/readyz``): ledger reads, compactions, and why not."""

    reads: bool
    compactions: bool
    problems: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return "ready" if self.compactions else "degraded"


class Health:
    def __init__(self, settings: Settings, store: LedgerStore, broker: BrokerMetadata,
                 runtime: EngineRuntime | None, metrics: Metrics, fatal: Callable[[], str | None],
                 on_store_up: Callable[[], None]) -> None:
        """``broker``: a client used for the pings only. ``runtime``: what compactions run on (None: nothing to
        start). ``fatal``: why the daemon is exiting, or None (the watchdog's). ``on_store_up``: called once
        the store answers again (what waited for it)."""
        self._settings = settings
        self._store = store
        self._runtime = runtime
        self._metrics = metrics
        self._fatal = fatal
        self._broker = BrokerWatch(broker, settings.kafka_request_timeout_ms / 1000)
        self._store_watch = StoreWatch(store.objects, settings.storage_read_retry_seconds + 1.0, on_up=on_store_up)
        self._root_problem = self._check_root()

    def watches(self) -> list[tuple[str, Callable[[threading.Event], None]]]:
        """The probing threads' names and targets (each runs until its event is set)."""
        return [("broker-probe", self._broker.run), ("store-probe", self._store_watch.run)]

    def broker_problem(self) -> str | None:
        """Why the broker counts as unreachable now, or None; from memory only (``BrokerWatch.problem``)."""
        return self._broker.problem()

    def store_problem(self) -> str | None:
        """Why the ledger root's store counts as down now, or None; from memory only (``StoreWatch.problem``)."""
        return self._store_watch.problem()

    def lease_problem(self) -> str | None:
        """Why this daemon may not write its S3 root until its lease is renewed (the store failed the renewals
        for two thirds of the lease), or None; from memory only (``WriterGuard.overdue``). Fixed phrases and numbers
        only: a refused trigger answers it as it is (the store's errors are in the log)."""
        overdue = self._store.guard.overdue()
        if overdue is None:
            return None
        return (f"the ledger root's lease has not been renewed for {overdue:.1f} s (storageLeaseSeconds="
                f"{self._settings.storage_lease_seconds}): no compaction starts until it is, since another daemon "
                "may take the root over (GET /readyz says when compactions can run again; the store's errors are "
                "in the daemon's log)")

    def write_problem(self) -> str | None:
        """Why no compaction may start now for want of its store (it does not answer, or the root's lease is
        not held), or None; from memory only. A trigger is refused with it, and the monitor starts no run."""
        return self.store_problem() or self.lease_problem()

    def store_failed(self, failure: StorageUnavailable | str) -> None:
        """A request to the store failed (its error, or a run's error text): the store is down until a probe
        finds it answering."""
        self._store_watch.failed(failure.message if isinstance(failure, StorageUnavailable) else failure)

    def refresh(self) -> None:
        """Look at the local root's folder again, and set the readiness gauge (the watchdog's every pass)."""
        self._root_problem = self._check_root()
        self._metrics.ready.set(0 if self.readiness_problems() else 1)

    def _check_root(self) -> str | None:
        root = self._store.objects.local_root
        if root is None:
            return None  # an object store's requests fail with storage_unavailable; there is no folder to look at
        return None if root.is_dir() and os.access(root, os.R_OK | os.X_OK) else "the ledger root is not readable"

    def liveness_problem(self) -> str | None:
        return self._fatal()

    def readiness_problems(self) -> list[str]:
        """Why compactions cannot run now (empty: they can), in fixed phrases: ``/readyz`` answers them to
        callers without a token; the details (broker addresses, exception texts) are logged where they
        happen."""
        problems = []
        fatal = self._fatal()
        if fatal:
            problems.append(fatal)
        if self._root_problem:
            problems.append(self._root_problem)
        guarded = self._store.guard.problem()
        if guarded:
            problems.append(guarded)
        if self._runtime is not None and not self._runtime.warmed:
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
        reads = not self._fatal() and not self._root_problem and not self.store_problem()
        return Readiness(reads=reads, compactions=not problems, problems=problems)
