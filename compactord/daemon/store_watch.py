"""The daemon's watch on its ledger root's store (an S3 bucket, or the local disk).

Unlike the broker, the store is not pinged while it answers: the daemon's own requests show that it does.
Once one fails with ``StorageUnavailable`` (a ledger read, a compaction's write, the run history), the daemon
marks the store down (``failed``), and a thread of its own probes it every ``PROBE_EVERY_S`` (a HEAD of one
key under ``@compactord/``, within the read budget: any answer, "not found" included, shows that it answers).
While it is down the ledger reads answer 503 storage_unavailable at once, rather than each waiting out the
read budget, ``/readyz`` says ``"reads": false``, and no compaction is started; the first probe that is
answered serves everything again, without a restart.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from compactord.daemon.watch import Watch
from compactord.errors import CompactordError, StorageUnavailable
from compactord.ledger import layout
from compactord.storage import ObjectStore

__all__ = ["PROBE_EVERY_S", "PROBE_KEY", "StoreWatch"]

log = logging.getLogger(__name__)

PROBE_EVERY_S = 1.0
PROBE_KEY = layout.store_probe_key()  # need not exist: a 404 is an answer


class StoreWatch(Watch):
    def __init__(self, objects: ObjectStore, timeout_s: float,
                 on_up: Callable[[], None] | None = None) -> None:
        """``objects``: the daemon's store. ``timeout_s``: how long a probe may take before the store counts
        as not answering (its read budget, and some). ``on_up``: called in the probing thread once the store
        answers again (to write what waited for it); what it raises is logged, and the store counts as up
        all the same: one that reads but refuses writes still serves the ledgers."""
        super().__init__(self._probe_store, timeout_s, subject="the ledger root's store", up=True,
                         down_log="the ledger root's store does not answer (probed again every "
                                  f"{PROBE_EVERY_S:g}s; ledger reads answer 503 storage_unavailable and no "
                                  "compaction starts until it answers)")
        self._objects = objects
        self._on_up = on_up
        self._wake = threading.Event()  # set by a failure: the prober starts at once

    def _probe_store(self) -> None:
        try:
            self._objects.head(PROBE_KEY)
        except StorageUnavailable:
            raise
        except OSError as exc:  # a local disk's, unmapped
            where = self._objects.describe()
            raise StorageUnavailable(f"{where}: {exc}", store=where) from exc

    def failed(self, reason: str) -> None:
        super().failed(reason)
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        """Probe while the store is down, until ``stop`` is set (a thread's target)."""
        while not stop.is_set():
            if self.up:
                # Woken by a failure; the timeout only lets ``stop`` be seen.
                self._wake.wait(PROBE_EVERY_S)
                self._wake.clear()
                continue
            if not self.check():
                stop.wait(PROBE_EVERY_S)
            elif self._on_up is not None:
                try:
                    self._on_up()
                except (CompactordError, OSError) as exc:
                    log.warning("the ledger root's store answers again; what waited for it failed: %s", exc)
