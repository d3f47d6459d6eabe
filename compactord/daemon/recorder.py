"""What the daemon keeps of each ended run: its record in the run history (``history.RunHistory``), and each
topic's last success (the ``compactord_seconds_since_last_success`` gauge), read from its current ledger once
the topic is recovered after the start (at its first use, or by the ledger store's recovery pass), not for
every topic at once.

A run ends into the history before anyone sees its end. While the ledger root's store does not answer, the
ended runs wait in memory (``history.UnrecordedRuns``) and go in, oldest first, once it answers again, or
at the daemon's stop; those it still cannot record then are named in the log.
"""

from __future__ import annotations

import logging

from compactord.daemon.health import Health
from compactord.daemon.history import RunHistory, RunRecord, UnrecordedRuns
from compactord.daemon.metrics import Metrics
from compactord.errors import CompactordError, StorageUnavailable
from compactord.ledger.store import LedgerStore
from compactord.task import CompactionTaskCtx, TaskState

__all__ = ["RunRecorder", "delete_history"]

log = logging.getLogger(__name__)


def delete_history(history: RunHistory, topic: str) -> None:
    """The topic's run history; a failure is named in the log (the topic's deletion goes on)."""
    try:
        history.delete(topic)
    except OSError as exc:
        log.error("topic %s: its run history could not be removed: %s", topic, exc)


class RunRecorder:
    def __init__(self, history: RunHistory, metrics: Metrics, health: Health) -> None:
        self.history = history
        self._metrics = metrics
        self._health = health
        self._unrecorded = UnrecordedRuns()  # runs that ended while the store was down
        self.last_success: dict[str, float] = {}

    def record(self, ctx: CompactionTaskCtx, final: TaskState) -> None:
        """The task's end recorder: the run is in the history before anyone sees the end; or, when the store
        is down, once it answers again (``record_unrecorded``)."""
        record = RunRecord.of_task(ctx, final)
        health = self._health
        # A run refused for want of the root's lease (not renewed in time) is no sign that the store is down.
        lease_overdue = health.lease_problem() is not None
        if ctx.error_type == StorageUnavailable.code and health.store_problem() is None and not lease_overdue:
            health.store_failed(ctx.error or "a compaction's request to the store failed")
        if health.store_problem() is None:  # known down: the append would wait out the write budget in vain
            try:
                self.record_unrecorded()
                self.history.append(record)
                return
            except StorageUnavailable as exc:
                health.store_failed(exc)
            except (CompactordError, OSError) as exc:  # the topic's objects at fault: its error alone
                log.error("topic %s: run %s not recorded in the run history: %s", ctx.topic, ctx.task_id, exc)
                self._metrics.history_failures.labels(ctx.topic).inc()
                return
        log.warning("topic %s: run %s is recorded in the run history once the store answers", ctx.topic,
                    ctx.task_id)
        self._unrecorded.add(record)

    def record_unrecorded(self) -> None:
        """The runs that ended while the store was down, into the history, oldest first (once it answers,
        and before the next run's).

        :raises StorageUnavailable: the store failed again (the rest are kept)."""
        self._unrecorded.record(self.history.append)

    def record_at_stop(self) -> None:
        """The runs still waiting for the store, recorded once more before the daemon stops; those it cannot
        record are named in the log (they are kept in memory only)."""
        if not self._unrecorded:
            return
        why = self._health.store_problem()  # known down: an append would wait out the write budget in vain
        if why is None:
            try:
                self.record_unrecorded()
                return
            except (CompactordError, OSError) as exc:
                why = str(exc)
        self._unrecorded.give_up(why)

    def delete(self, topic: str) -> None:
        """The topic's run history, and its last success."""
        delete_history(self.history, topic)
        self.last_success.pop(topic, None)

    def succeeded(self, ctx: CompactionTaskCtx) -> None:
        if ctx.finished_at is not None:
            self.last_success[ctx.topic] = ctx.finished_at

    def load_last_success(self, store: LedgerStore, topic: str) -> None:
        """The topic's last success, and its ledger's gauges, from its current ledger's manifest (once the topic
        is recovered: ``LedgerStore.after_recovery``, at its first use or by the recovery pass).

        :raises StorageUnavailable: the store does not answer."""
        try:
            ledger_id = store.current_ledger_id(topic)
            if ledger_id is not None:
                manifest = store.load_manifest(topic, ledger_id)
                self.last_success.setdefault(topic, manifest.finished_at_ms / 1000)  # a run may have ended since
                self._metrics.compacted_entries.labels(topic).set(manifest.records_kept)
                self._metrics.compacted_bytes.labels(topic).set(manifest.bytes)
        except StorageUnavailable:
            raise  # not the ledger's fault: the topic is recovered again at its next use
        except CompactordError as exc:
            log.error("topic %s: %s", topic, exc)
            self._metrics.ledger_corrupt.labels(topic).set(1)
