"""The end of a run (``run.CompactionRun``): its ledger finalised into a manifest, with the task's stats; past
the switch, the ledger it replaced kept readable for a grace period then deleted, and a corrupt one deleted.
"""

from __future__ import annotations

import logging
import time

from compactord.engine.channel import TailRead
from compactord.engine.planning import CompactionPlan
from compactord.engine.seams import TopicLedger
from compactord.errors import CompactionCancelled
from compactord.ledger.reads import LedgerHandle
from compactord.model import LedgerManifest
from compactord.task import CompactionTaskCtx

__all__ = ["after_switch", "finalize"]

log = logging.getLogger(__name__)


def finalize(service: TopicLedger, ctx: CompactionTaskCtx, plan: CompactionPlan, ledger_id: int, tail: TailRead,
             started: float, key_ttl_ms: int) -> LedgerManifest:
    """Finalise the ledger ``ledger_id`` the run wrote (``ctx.progress`` followed to ``tail`` first): its
    manifest, and the task's stats from it."""
    manifest = LedgerManifest(
        ledger_id=ledger_id, topic=service.topic, horizon=plan.horizon, strategy=plan.strategy.settings,
        files=[], records_read=ctx.progress.records_read, created_at_ms=int(time.time() * 1000),
        started_at_ms=int((ctx.started_at or started) * 1000), full_rebuild=plan.full,
        log_start=plan.log_start, topic_id=plan.topic_id, fingerprints=plan.fingerprints_after(tail.last),
        key_ttl_ms=key_ttl_ms,
    )
    manifest.finished_at_ms = int(time.time() * 1000)
    manifest.timings = {"spark_seconds": round(time.time() - started, 3)}
    manifest = service.factory.store.finalize_ledger(service.topic, ledger_id, manifest)
    stats = ctx.stats
    stats.records_read, stats.records_kept, stats.markers = manifest.records_read, manifest.records_kept, \
        manifest.markers
    stats.removed, stats.bytes_written, stats.bytes_read = manifest.removed, manifest.bytes, tail.bytes
    stats.spilled_bytes = tail.spilled_bytes
    stats.storage_requests.add_counts(tail.storage_requests)
    stats.task_cpu_seconds, stats.task_wall_seconds = tail.cpu_seconds, tail.wall_seconds
    stats.full_rebuild, stats.tail_records, stats.ledger_rows_read = plan.full, tail.records, plan.ledger_rows
    stats.recreated = plan.recreated
    return manifest


def after_switch(service: TopicLedger, ctx: CompactionTaskCtx, old: LedgerHandle | None, plan: CompactionPlan,
                 ledger_id: int) -> None:
    """Past the commit point: what is left cannot fail the task (the new ledger is current)."""
    try:
        ctx.checkpoint("switched")
    except CompactionCancelled:
        pass  # a cancel raced the switch: too late, the ledger is current
    _retire(service, old, plan.previous)
    if plan.corrupt_id is not None and plan.corrupt_id != ledger_id:
        _delete_replaced(service, plan.corrupt_id)


def _retire(service: TopicLedger, old: LedgerHandle | None, previous: LedgerManifest | None) -> None:
    if previous is None:
        return
    store, topic, old_id = service.factory.store, service.topic, previous.ledger_id

    def delete() -> None:
        try:
            store.delete_retired(topic, old_id)  # kept while a retained Iceberg snapshot names it
        except Exception:
            log.warning("could not delete old ledger %d of topic %s (removed at next start-up)",
                        old_id, topic, exc_info=True)

    if old is None:  # never loaded in memory: a handle of its own, so that pinned reads find it
        old = LedgerHandle(store.open_reader(topic, old_id, previous))
    service.keep_retired(old, old_id, delete)


def _delete_replaced(service: TopicLedger, ledger_id: int) -> None:
    try:
        service.factory.store.delete_ledger(service.topic, ledger_id)
        log.info("topic %s: deleted corrupt ledger %d, replaced by a full rebuild", service.topic, ledger_id)
    except Exception:
        log.warning("could not delete corrupt ledger %d of topic %s (removed at next start-up)",
                    ledger_id, service.topic, exc_info=True)
