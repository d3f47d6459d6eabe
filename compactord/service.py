"""The Spark + Parquet implementation of the service interfaces (the default factory).

A task runs in its own thread:

1. Creating_Raw_Reader: fix every partition's end, load and verify the current ledger, decide
   between an incremental run (ledger + tail after the horizon) and a full rebuild.
2. Running: the Spark job writes the new ledger; checksums, manifest and fsync.
3. Ending_with_switch_ledger: replace the CURRENT pointer (atomic), swap the in-memory ledger, delete
   the old ledger once no read uses it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from compactord.config import Settings
from compactord.errors import (
    CompactionAlreadyRunning,
    CompactionCancelled,
    InvalidArgument,
    LedgerCorrupt,
    NotCompacted,
)
from compactord.interfaces import (
    CompactionServiceFactory,
    CompactionStrategy,
    ServiceContext,
    TopicCompactionService,
)
from compactord.kafka.admin import KafkaAdmin, PartitionOffsets
from compactord.kafka.source import CANCEL_FILE, OffsetRange, plan_ranges
from compactord.ledger.reader import LedgerHandle, LedgerReader, LedgerRetired
from compactord.ledger.store import LedgerStore
from compactord.model import Entry, Horizon, LedgerManifest, Position, StrategySettings, validate_topic_name
from compactord.spark.job import CompactionJobSpec, run_compaction_job
from compactord.spark.session import SparkSessionManager
from compactord.strategies import load_strategy, strategy_name
from compactord.task import CompactionTaskCtx, StateListener, TaskState

__all__ = ["SparkCompactionServiceFactory", "SparkTopicCompactionService"]

log = logging.getLogger(__name__)
T = TypeVar("T")
# A read retries when a switch retires the ledger it found; more than one retry needs two switches
# within one read, so this bound is never reached in practice.
_READ_ATTEMPTS = 10


@dataclass
class _Plan:
    offsets: dict[int, PartitionOffsets]
    full: bool
    ranges: list[OffsetRange]
    previous: LedgerManifest | None
    previous_files: list[str]
    horizon: Horizon
    strategy: tuple[str, CompactionStrategy, StrategySettings]  # fixed for the whole task
    reasons: list[str] = field(default_factory=list)
    corrupt_id: int | None = None  # a corrupt current ledger this run replaces (deleted after the switch)

    @property
    def tail_records(self) -> int:
        return sum(r.size for r in self.ranges)

    @property
    def ledger_rows(self) -> int:
        return 0 if self.previous is None or self.full else self.previous.records_kept + self.previous.markers


class SparkCompactionServiceFactory(CompactionServiceFactory):
    def initialize(self, context: ServiceContext) -> None:
        settings = context.settings
        self.settings: Settings = settings
        self.strategy: CompactionStrategy = load_strategy(settings.compaction_strategy)
        self.strategy_settings = self._strategy_settings(self.strategy, settings.compaction_strategy)
        self._topic_strategies: dict[str, tuple[str, CompactionStrategy, StrategySettings]] = {}
        self.spark: SparkSessionManager = context.spark or SparkSessionManager(settings)
        self._owns_store = context.store is None
        self.store: LedgerStore = context.store or LedgerStore(settings.compacted_ledger_root).open()
        self.admin = KafkaAdmin(settings)
        self.listeners: list[StateListener] = []
        self._services: dict[str, SparkTopicCompactionService] = {}
        self._lock = threading.Lock()

    def _strategy_settings(self, strategy: CompactionStrategy, ref: str) -> StrategySettings:
        return StrategySettings(
            strategy=strategy_name(strategy, ref),
            event_time_source=self.settings.compaction_event_time_source,
            retain_null_key=self.settings.topic_compaction_retain_null_key,
        )

    def set_topic_strategy(self, topic: str, ref: str | None) -> None:
        """A per-topic strategy (topic policy), or None for the configured one.

        :raises ConfigError: ``ref`` is neither a built-in name nor a strategy class reference.
        """
        validate_topic_name(topic)
        with self._lock:
            if ref is None or ref == self.settings.compaction_strategy:
                self._topic_strategies.pop(topic, None)
            else:
                strategy = load_strategy(ref, key="strategy")
                self._topic_strategies[topic] = (ref, strategy, self._strategy_settings(strategy, ref))

    def strategy_for(self, topic: str) -> tuple[str, CompactionStrategy, StrategySettings]:
        """(reference, strategy, settings recorded in manifests) in force for ``topic``."""
        with self._lock:
            override = self._topic_strategies.get(topic)
        return override or (self.settings.compaction_strategy, self.strategy, self.strategy_settings)

    def new_topic_compaction_service(self, topic: str) -> SparkTopicCompactionService:
        validate_topic_name(topic)
        with self._lock:
            service = self._services.get(topic)
            if service is None:
                service = self._services[topic] = SparkTopicCompactionService(topic, self)
            return service

    def forget(self, topic: str) -> None:
        with self._lock:
            self._services.pop(topic, None)

    def close(self) -> None:
        with self._lock:
            services, self._services = list(self._services.values()), {}
        for service in services:
            service.close()
        self.admin.close()
        if self._owns_store:
            self.store.close()


class SparkTopicCompactionService(TopicCompactionService):
    def __init__(self, topic: str, factory: SparkCompactionServiceFactory) -> None:
        self.topic = validate_topic_name(topic)
        self._f = factory
        self._lock = threading.RLock()
        self._task: CompactionTaskCtx | None = None
        self._handle: LedgerHandle | None = None
        self._handle_id: int | None = None
        self.corrupt: LedgerCorrupt | None = None

    # -- the current ledger ---------------------------------------------------------------------

    def _current(self, *, recheck: bool = False) -> LedgerHandle | None:
        """The verified current ledger (loaded once; its files checked again if ``recheck``); raises
        ``LedgerCorrupt`` for a bad one."""
        with self._lock:
            ledger_id = self._f.store.current_ledger_id(self.topic)
            if ledger_id is None:
                return None
            cached = self._handle if self._handle is not None and self._handle_id == ledger_id else None
            if cached is not None and not recheck:
                return cached
            try:
                manifest = self._f.store.verify(self.topic, ledger_id)
            except LedgerCorrupt as exc:
                if self.corrupt is None or str(self.corrupt) != str(exc):
                    log.error("compacted ledger of topic %s is not served: %s", self.topic, exc)
                self.corrupt = exc
                if cached is not None:  # its files went bad after it was loaded: stop serving it
                    self._handle = self._handle_id = None
                    cached.retire(lambda: None)
                raise
            self.corrupt = None
            if cached is not None:
                return cached
            handle = LedgerHandle(LedgerReader(self._f.store.ledger_path(self.topic, ledger_id), manifest))
            displaced = self._install(handle, ledger_id)
            if displaced is not None:
                # CURRENT moved without this service's switch (another service on the store): readers
                # of the stale ledger retry on the new one; its files are the switcher's to delete.
                displaced.retire(lambda: None)
            return handle

    def _install(self, handle: LedgerHandle, ledger_id: int) -> LedgerHandle | None:
        with self._lock:
            old, self._handle, self._handle_id = self._handle, handle, ledger_id
            return old

    def _required(self) -> LedgerHandle:
        handle = self._current()
        if handle is None:
            raise NotCompacted(self.topic)
        return handle

    def _read(self, fn: Callable[[LedgerReader], T]) -> T:
        """Run ``fn`` on the current ledger, which stays on disk until ``fn`` returns."""
        attempt = 0
        while True:
            handle = self._required()
            try:
                reader = handle.acquire()
            except LedgerRetired:
                attempt += 1
                if attempt >= _READ_ATTEMPTS:
                    raise
                continue  # a switch retired it between the lookup and the acquire: take the new one
            try:
                return fn(reader)
            finally:
                handle.release()

    def read_compacted_entries(self, start: Position, n: int, include_markers: bool = False) -> list[Entry]:
        if n < 1 or start.partition < 0 or start.offset < 0:
            raise InvalidArgument(f"need n >= 1 and a non-negative partition and offset, got {start}, n={n}")
        return self._read(lambda r: r.read(start.partition, start.offset, n, include_markers=include_markers))

    def read_last_compacted_entry(self, partition: int) -> Entry | None:
        if partition < 0:
            raise InvalidArgument(f"partition must be >= 0, got {partition}")
        return self._read(lambda reader: reader.last(partition))

    def ledger_info(self) -> LedgerManifest | None:
        ledger_id = self._f.store.current_ledger_id(self.topic)
        return None if ledger_id is None else self._f.store.load_manifest(self.topic, ledger_id)

    def get_last_compacted_position(self) -> Horizon | None:
        manifest = self.ledger_info()
        return None if manifest is None else dict(manifest.horizon)

    @property
    def task(self) -> CompactionTaskCtx | None:
        return self._task

    # -- compaction -----------------------------------------------------------------------------

    def compact(self, *, rebuild: bool = False, start: bool = True) -> CompactionTaskCtx:
        with self._lock:
            if self._task is not None and not self._task.done:
                raise CompactionAlreadyRunning(self.topic, self._task)
            ctx = CompactionTaskCtx(
                self.topic, rebuild=rebuild, pause_points=self._f.settings.test_pause_points,
                listeners=list(self._f.listeners),
            )
            thread = threading.Thread(target=self._run, args=(ctx,), name=f"compact-{self.topic}", daemon=True)
            ctx.set_start_hook(thread.start)
            self._task = ctx
        if start:
            ctx.start()
        return ctx

    def _run(self, ctx: CompactionTaskCtx) -> None:
        new_path: Path | None = None
        switched = False
        progress_dir = self._f.store.progress_dir(ctx.task_id)
        try:
            ctx.checkpoint("pending")
            ctx.transition(TaskState.CREATING_RAW_READER)
            plan = self._plan(ctx)
            ctx.progress.records_total = plan.ledger_rows + plan.tail_records
            ctx.checkpoint("creating_raw_reader")
            if self._nothing_to_do(plan):
                log.info("topic %s: nothing new since the horizon; the ledger stays", self.topic)
                ctx.progress.records_read = 0
                ctx.stats.update(skipped=True)
                ctx.transition(TaskState.SUCCEED)
                return
            ctx.transition(TaskState.RUNNING)
            ctx.checkpoint("running")
            store = self._f.store
            store.check_free_space(plan.previous.bytes if plan.previous else 0)
            ledger_id, new_path = store.allocate_ledger(self.topic)
            progress_dir.mkdir(parents=True, exist_ok=True)
            cancel_hook = self._cancel_hook(ctx, progress_dir)
            ctx.add_cancel_hook(cancel_hook)
            started = time.time()
            tail = self._spark_job(ctx, plan, str(new_path), str(progress_dir))
            ctx.remove_cancel_hook(cancel_hook)
            ctx.checkpoint("running")
            manifest = self._finalize(ctx, plan, ledger_id, tail, started)
            handle = LedgerHandle(LedgerReader(new_path, manifest))
            ctx.checkpoint("written")
            ctx.begin_switch()
            ctx.checkpoint("switch")
            # Pointer and in-memory swap under the lock that reads take to find the current ledger, so
            # that no read installs the new ledger in between and leaves the old one unretired.
            with self._lock:
                store.switch(self.topic, ledger_id)
                switched = True
                old = self._install(handle, ledger_id)
                self.corrupt = None
            ctx.checkpoint("switched")
            self._retire(old, plan.previous)
            if plan.corrupt_id is not None and plan.corrupt_id != ledger_id:
                self._delete_replaced(plan.corrupt_id)
            ctx.ledger_id = ledger_id
            ctx.transition(TaskState.SUCCEED)
            log.info("topic %s compacted into ledger %d: %d read, %d kept, %d removed in %.1fs",
                     self.topic, ledger_id, manifest.records_read, manifest.records_kept, manifest.removed,
                     manifest.finished_at_ms / 1000 - started)
        except CompactionCancelled as exc:
            if not ctx.done:
                ctx.fail(exc)
            log.info("compaction of topic %s (task %s) cancelled", self.topic, ctx.task_id)
        except Exception as exc:
            if ctx.cancelled:
                log.info("compaction of topic %s (task %s) stopped after cancel: %s", self.topic, ctx.task_id, exc)
            else:
                log.error("compaction of topic %s (task %s) failed: %s", self.topic, ctx.task_id, exc,
                          exc_info=not hasattr(exc, "code"))
                ctx.fail(exc)
        finally:
            if new_path is not None and not switched:
                self._f.store.discard(new_path)
            shutil.rmtree(progress_dir, ignore_errors=True)
            ctx.worker_done.set()

    def _cancel_hook(self, ctx: CompactionTaskCtx, progress_dir: Path) -> Any:
        def hook() -> None:
            try:
                (progress_dir / CANCEL_FILE).touch()  # stops the Kafka readers at their next poll
            except OSError:
                pass
            self._f.spark.cancel_group(ctx.task_id)

        return hook

    def _plan(self, ctx: CompactionTaskCtx) -> _Plan:
        offsets = self._f.admin.offsets(self.topic)
        reasons: list[str] = []
        previous: LedgerManifest | None = None
        corrupt_id: int | None = None
        try:
            # Checked again, not only when loaded: a ledger whose files went bad since must not be
            # the base of the next one (it would fail every run, or carry the damage over).
            handle = self._current(recheck=True)
            previous = handle.manifest if handle is not None else None
        except LedgerCorrupt as exc:
            reasons.append(f"the current ledger is corrupt ({exc})")
            with contextlib.suppress(LedgerCorrupt):
                corrupt_id = self._f.store.current_ledger_id(self.topic)  # None: the pointer itself is bad
        full = previous is None or ctx.rebuild
        if ctx.rebuild:
            reasons.append("a rebuild was requested")
        strategy = self._f.strategy_for(self.topic)
        wanted = strategy[2]
        if previous is not None and previous.strategy != wanted:
            full = True
            reasons.append(f"the strategy settings changed from {previous.strategy} to {wanted}")
        if previous is not None:
            for p, old in previous.horizon.items():
                if p in offsets and offsets[p].end - 1 < old:
                    full = True
                    reasons.append(f"partition {p} now ends at {offsets[p].end} below the horizon {old} "
                                   "(topic recreated or truncated)")
        if full and reasons:
            log.warning("topic %s: full rebuild because %s", self.topic, "; ".join(reasons))
        ranges = []
        for p, o in sorted(offsets.items()):
            start = o.log_start if full or previous is None else max(previous.horizon.get(p, -1) + 1, o.log_start)
            ranges.append(OffsetRange(p, start, o.end))
        spark = self._f.spark
        split = plan_ranges(ranges, spark.cores, self._f.settings.compaction_read_ranges_per_core)
        files = [] if full or previous is None else [
            str(self._f.store.ledger_path(self.topic, previous.ledger_id) / f["name"]) for f in previous.files
        ]
        horizon = {p: o.end - 1 for p, o in offsets.items()}
        if previous is not None and not full:
            horizon = {p: max(h, previous.horizon.get(p, -1)) for p, h in horizon.items()}
        return _Plan(offsets, full, split, previous, files, horizon, strategy, reasons, corrupt_id)

    def _nothing_to_do(self, plan: _Plan) -> bool:
        prev = plan.previous
        if plan.full or prev is None or plan.tail_records > 0:
            return False
        if any(o.log_start > prev.log_start.get(p, 0) for p, o in plan.offsets.items()):
            return False  # retention moved the log start: entries below it must go
        if set(plan.offsets) != set(prev.horizon):
            return False  # partitions were added
        retention = self._f.settings.compaction_tombstone_retention_ms
        oldest = prev.oldest_marker_at_ms
        return oldest is None or time.time() * 1000 - oldest < retention

    def _spark_job(self, ctx: CompactionTaskCtx, plan: _Plan, output: str, progress_dir: str) -> dict[str, int]:
        settings = self._f.settings
        widths = self._f.spark.job_widths(plan.ledger_rows + plan.tail_records)
        spec = CompactionJobSpec(
            topic=self.topic,
            client_config=settings.kafka_client_config(),
            ranges=plan.ranges,
            ledger_files=plan.previous_files,
            output_path=output,
            strategy_ref=plan.strategy[0],
            event_time_source=settings.compaction_event_time_source,
            retain_null_key=settings.topic_compaction_retain_null_key,
            tombstone_retention_ms=settings.compaction_tombstone_retention_ms,
            now_ms=int(time.time() * 1000),
            log_start={p: o.log_start for p, o in plan.offsets.items()},
            batch_records=settings.compaction_reader_batch_records,
            progress_dir=progress_dir,
            shuffle_partitions=widths[0],
            output_files=widths[1],
        )
        stop = threading.Event()
        poller = threading.Thread(target=self._poll_progress, args=(ctx, plan, Path(progress_dir), stop), daemon=True)
        poller.start()
        try:
            spark = self._f.spark
            spark.run(ctx.task_id, f"compaction of {self.topic} ({ctx.task_id})",
                      lambda: run_compaction_job(spark.spark, spec, plan.strategy[1]))
        finally:
            stop.set()
            poller.join()
        return _read_progress(Path(progress_dir))

    def _poll_progress(self, ctx: CompactionTaskCtx, plan: _Plan, progress_dir: Path, stop: threading.Event) -> None:
        while not stop.wait(0.5):
            tail = _read_progress(progress_dir)
            ctx.progress.records_read = plan.ledger_rows + tail["records"]
            ctx.progress.bytes_read = tail["bytes"]

    def _finalize(self, ctx: CompactionTaskCtx, plan: _Plan, ledger_id: int, tail: dict[str, int],
                  started: float) -> LedgerManifest:
        ctx.progress.records_read = plan.ledger_rows + tail["records"]
        ctx.progress.bytes_read = tail["bytes"]
        manifest = LedgerManifest(
            ledger_id=ledger_id, topic=self.topic, horizon=plan.horizon,
            strategy=plan.strategy[2],
            files=[], records_read=ctx.progress.records_read, created_at_ms=int(time.time() * 1000),
            started_at_ms=int((ctx.started_at or started) * 1000), full_rebuild=plan.full,
            log_start={p: o.log_start for p, o in plan.offsets.items()},
        )
        manifest.finished_at_ms = int(time.time() * 1000)
        manifest.timings = {"spark_seconds": round(time.time() - started, 3)}
        manifest = self._f.store.finalize_ledger(self.topic, ledger_id, manifest)
        ctx.stats.update(
            records_read=manifest.records_read, records_kept=manifest.records_kept, markers=manifest.markers,
            removed=manifest.removed, bytes_written=manifest.bytes, bytes_read=tail["bytes"],
            full_rebuild=plan.full, tail_records=tail["records"], ledger_rows_read=plan.ledger_rows,
        )
        return manifest

    def _retire(self, old: LedgerHandle | None, previous: LedgerManifest | None) -> None:
        if previous is None:
            return
        store, topic, old_id = self._f.store, self.topic, previous.ledger_id

        def delete() -> None:
            try:
                store.delete_ledger(topic, old_id)
            except Exception:
                log.warning("could not delete old ledger %d of topic %s (removed at next start-up)",
                            old_id, topic, exc_info=True)

        if old is not None:
            old.retire(delete)
        else:
            delete()

    def _delete_replaced(self, ledger_id: int) -> None:
        try:
            self._f.store.delete_ledger(self.topic, ledger_id)
            log.info("topic %s: deleted corrupt ledger %d, replaced by a full rebuild", self.topic, ledger_id)
        except Exception:
            log.warning("could not delete corrupt ledger %d of topic %s (removed at next start-up)",
                        ledger_id, self.topic, exc_info=True)

    # -- lifecycle ------------------------------------------------------------------------------

    def delete(self) -> None:
        with self._lock:
            if self._task is not None and not self._task.done:
                raise CompactionAlreadyRunning(self.topic, self._task)
            handle, self._handle, self._handle_id = self._handle, None, None
        if handle is not None:
            handle.retire(lambda: None)
        self._f.store.delete_topic(self.topic)
        self._f.forget(self.topic)

    def close(self) -> None:
        with self._lock:
            self._handle = None
            self._handle_id = None


def _read_progress(progress_dir: Path) -> dict[str, int]:
    total = {"records": 0, "bytes": 0}
    try:
        paths = list(progress_dir.glob("*.json"))
    except OSError:
        return total
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced right now
        total["records"] += int(data.get("records", 0))
        total["bytes"] += int(data.get("bytes", 0))
    return total
