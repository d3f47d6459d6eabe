"""One compaction task's work, on its own thread (PIP-387's states in order):

1. Creating_Raw_Reader: fix every partition's end, load and verify the current ledger, plan an
   incremental run (ledger + tail after the horizon) or a full rebuild. Where there is a ledger, the reading
   tasks are launched first, and open their readers while the run is planned (``early_start``).
2. Running: the Spark job writes the new ledger; checksums, manifest and fsync (``run_finish``).
3. Ending_with_switch_ledger: replace the CURRENT pointer (atomic), swap the in-memory ledger, delete
   the old ledger once no read uses it (``run_finish``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compactord.engine.channel import RunChannel, TailRead, driver_address
from compactord.engine.early_start import EarlyStart
from compactord.engine.job import job_spec, run_compaction_job, writing_tasks_spec
from compactord.engine.kafka_source import run_writing_tasks_in_driver
from compactord.engine.planning import CompactionPlan, plan_compaction
from compactord.engine.preview import exact_preview, ledger_totals
from compactord.engine.run_finish import after_switch, finalize
from compactord.engine.seams import TopicLedger
from compactord.engine.spark_session import driver_task_errors
from compactord.engine.throttle import per_task_rate, running_share
from compactord.engine.worker_store import new_output, store_secrets
from compactord.errors import CompactionCancelled, CompactordError, LedgerCorrupt
from compactord.interfaces import OrderedCompactionStrategy
from compactord.kafka.identity import LogNow
from compactord.ledger.reads import LedgerHandle
from compactord.model import LedgerManifest, PartitionOffsets
from compactord.task import CompactionTaskCtx, Progress, TaskState
from compactord.task_report import LogSeen, counting_requests

__all__ = ["CompactionRun"]

log = logging.getLogger(__name__)
PROGRESS_POLL_S = 0.5


def log_stopped(ctx: CompactionTaskCtx) -> None:
    """The one line of a cancelled (or aborted) task: its state then and how long its work took to stop."""
    if ctx.cancelled_in is None or ctx.cancelled_mono is None:
        log.info("compaction of topic %s (task %s) stopped: %s", ctx.topic, ctx.task_id, ctx.error)
        return
    log.info("compaction of topic %s (task %s) cancelled in %s; stopped in %.1fs", ctx.topic, ctx.task_id,
             ctx.cancelled_in.value, time.monotonic() - ctx.cancelled_mono)


class CompactionRun:
    """The work of one task of ``service``: plan, Spark job, finalise, switch."""

    def __init__(self, service: TopicLedger, ctx: CompactionTaskCtx) -> None:
        self.service = service
        self.ctx = ctx
        self.factory = service.factory
        self.store = service.factory.store
        self.topic = service.topic
        self.key_ttl_ms = 0  # fixed when the task starts, as its other limits
        self._session_cores: int | None = None

    def __call__(self) -> None:
        with counting_requests(self.ctx.stats.storage_requests):  # the store's requests made for the run
            self._run()

    def _run(self) -> None:
        ctx = self.ctx
        new_ledger: int | None = None
        switched = False
        # The run's channel to its reading tasks: their progress, the cancel, the throttled share, the early
        # start's plan, and the Kafka client's secrets, which nothing shipped to the tasks carries.
        channel = RunChannel(self.factory.settings.kafka_client_secrets(), store_secrets(self.store.objects))
        early: EarlyStart | None = None
        try:
            ctx.checkpoint("pending")
            ctx.transition(TaskState.CREATING_RAW_READER)
            base = self.store.switch_base(self.topic)  # the switch commits only if the pointer is still this
            self.key_ttl_ms = self.factory.key_ttl_ms_for(self.topic)
            ctx.progress.max_read_bytes_per_second = self.factory.max_read_rate_for(self.topic)
            cancel_hook = self._cancel_hook(channel)
            early = self._start_early(channel, cancel_hook)
            if early is None and self._likely_small():
                ctx.leave_slot()  # planned out of the slot: ``take_slot`` before a Spark job, if one is needed
            plan = self._plan()
            ctx.progress.records_total = plan.ledger_rows + plan.tail_records
            ctx.checkpoint("creating_raw_reader")
            if ctx.kind == "preview":
                self._preview(plan, channel)
                ctx.transition(TaskState.SUCCEED)
                return
            if plan.nothing_to_do(self.factory.settings, self.key_ttl_ms):
                if early is not None:
                    early.abort()
                    ctx.remove_cancel_hook(cancel_hook)
                log.info("topic %s: nothing new since the horizon; the ledger stays", self.topic)
                ctx.progress.records_read = 0
                ctx.stats.skipped = True
                ctx.transition(TaskState.SUCCEED)
                return
            ctx.transition(TaskState.RUNNING)
            ctx.checkpoint("running")
            self.store.check_free_space(plan.previous.bytes if plan.previous else 0)
            ledger_id, _ = self.store.allocate_ledger(self.topic)
            new_ledger = ledger_id
            if early is None:
                ctx.add_cancel_hook(cancel_hook)
            started = time.time()
            tail = self._spark_job(plan, self.store.ledger_key(self.topic, ledger_id), channel, early=early)
            ctx.remove_cancel_hook(cancel_hook)
            ctx.checkpoint("running")
            self._follow(plan, tail)
            manifest = finalize(self.service, ctx, plan, ledger_id, tail, started, self.key_ttl_ms)
            handle = LedgerHandle(self.store.open_reader(self.topic, ledger_id, manifest))
            ctx.checkpoint("written")
            ctx.begin_switch()
            ctx.checkpoint("switch")
            old, problem = self.service.switch_to(handle, ledger_id, base)
            switched = True
            if problem is not None:
                ctx.stats.switch_warning = f"ledger {ledger_id} is current, but the switch then failed: {problem}"
                log.warning("topic %s (task %s): %s", self.topic, ctx.task_id, ctx.stats.switch_warning)
            after_switch(self.service, ctx, old, plan, ledger_id)
            ctx.ledger_id = ledger_id
            ctx.transition(TaskState.SUCCEED)
            log.info("topic %s compacted into ledger %d (reason %s): %d read, %d kept, %d removed in %.1fs",
                     self.topic, ledger_id, ctx.reason.kind, manifest.records_read, manifest.records_kept,
                     manifest.removed, manifest.finished_at_ms / 1000 - started)
        except CompactionCancelled as exc:
            if not ctx.done:
                ctx.fail(exc)
            log_stopped(ctx)
        except Exception as exc:
            if ctx.cancelled:  # the cancel broke the Spark job: its error is the cancel's, not a failure
                log_stopped(ctx)
            else:
                log.error("compaction of topic %s (task %s, reason %s) failed: %s", self.topic, ctx.task_id,
                          ctx.reason.kind, exc,
                          exc_info=not hasattr(exc, "code"))
                ctx.fail(exc)
        finally:
            try:  # never raises: the task's slot is released below whatever happens here
                if early is not None:
                    early.abort()  # tasks not handed a plan end without a read; the job is waited for
                if new_ledger is not None and not switched:
                    self.store.delete_ledger(self.topic, new_ledger)
                channel.close()  # tasks of the run still connected (none, normally) stop
            except CompactordError as exc:  # the store failed, or the root's lease is not held: one line
                log.warning("topic %s (task %s): could not remove the unused ledger %s (removed at next "
                            "start-up): %s", self.topic, ctx.task_id, new_ledger, exc)
            except Exception:
                log.warning("topic %s (task %s): could not remove the unused ledger %s (removed at next "
                            "start-up)", self.topic, ctx.task_id, new_ledger, exc_info=True)
            finally:
                ctx.worker_done.set()

    # -- the steps ------------------------------------------------------------------------------

    def _plan(self) -> CompactionPlan:
        reasons: list[str] = []
        previous: LedgerManifest | None = None
        corrupt_id: int | None = None
        handle: LedgerHandle | None = None
        try:
            # Checked again, not only when loaded: a ledger whose files went bad since must not be
            # the base of the next one (it would fail every run, or carry the damage over).
            handle = self.service.current(recheck=True)
            previous = handle.manifest if handle is not None else None
            self.ctx.previous_ledger_id = previous.ledger_id if previous is not None else None
        except LedgerCorrupt as exc:
            reasons.append(f"the current ledger is corrupt ({exc})")
            with contextlib.suppress(LedgerCorrupt):
                corrupt_id = self.store.current_ledger_id(self.topic)  # None: the pointer itself is bad
        offsets, log_now = self._log_now(previous)
        return plan_compaction(
            self.topic, offsets=offsets, previous=previous, log_now=log_now,
            first_offsets=self._first_offsets(handle, offsets),
            previous_dir=self.store.ledger_key(self.topic, previous.ledger_id) if previous else None,
            strategy=self.factory.strategy_for(self.topic), rebuild=self.ctx.rebuild, reasons=reasons,
            cores=self._cores(), ranges_per_core=self.factory.settings.compaction_read_ranges_per_core,
            corrupt_id=corrupt_id,
        )

    @staticmethod
    def _first_offsets(handle: LedgerHandle | None, offsets: dict[int, PartitionOffsets]) -> dict[int, int]:
        """Per partition whose log start moved past the ledger's, the offset of its first ledger entry."""
        if handle is None:
            return {}
        moved = [p for p, o in offsets.items() if o.log_start > handle.manifest.log_start.get(p, 0)]
        if not moved:
            return {}
        reader = handle.acquire()
        try:
            found = {p: reader.read(p, 0, 1, include_markers=True) for p in moved}
        finally:
            handle.release()
        return {p: entries[0].offset for p, entries in found.items() if entries}

    def _log_now(self, previous: LedgerManifest | None) -> tuple[dict[int, PartitionOffsets], LogNow]:
        """Every partition's offsets, fixed now, and the log's identity now: its topic id, and the records at
        the previous ledger's fingerprints (one small fetch per partition, read while the offsets are fixed;
        skipped for a rebuild, which needs no comparison)."""
        broker = self.factory.broker
        at = {p: f.offset for p, f in previous.fingerprints.items()} \
            if previous is not None and not self.ctx.rebuild and previous.fingerprints else {}
        asked = time.time()  # the answer is as old as the request
        offsets, found, topic_id = broker.offsets_and_identity(self.topic, at)
        self.ctx.stats.log_seen = LogSeen(topic_id, offsets, asked)  # kept by the daemon at the run's end
        return offsets, (LogNow(topic_id, found) if at else LogNow(topic_id))

    def _start_early(self, channel: RunChannel, cancel_hook: Callable[[], None]) -> EarlyStart | None:
        """Launch the reading tasks of a run before it is planned (``early_start``), where the current ledger
        gives every partition's likely start (an incremental run's horizon; a rebuild's log start) and the
        run is likely to be read by a task per partition (an ordered strategy, no read budget).
        ``cancel_hook`` is then in force from now on."""
        ctx = self.ctx
        if ctx.kind != "compaction" or ctx.progress.max_read_bytes_per_second:
            return None
        try:
            handle = self.service.current()
        except LedgerCorrupt:
            return None  # planning finds it again
        previous = handle.manifest if handle is not None else None
        if previous is not None and previous.records_kept + previous.markers <= self._driver_max():
            return None  # a small ledger: the run is likely small, its task read in the driver
        strategy = self.factory.strategy_for(self.topic)
        if previous is None or not previous.horizon or not isinstance(strategy.strategy, OrderedCompactionStrategy):
            return None
        if ctx.rebuild or previous.strategy != strategy.settings:  # a full rebuild: from each log start
            starts = {p: previous.log_start.get(p, 0) for p in previous.horizon}
        else:
            starts = {p: h + 1 for p, h in previous.horizon.items()}
        spark = self.factory.spark
        try:
            cores = spark.cores  # starts the session if it is not up
            endpoint = channel.endpoint(driver_address(spark.spark))
        except Exception as exc:  # noqa: BLE001 (the run's own job meets it again, where a run that needs one does)
            log.debug("topic %s: no early reading tasks: %s", self.topic, exc)
            return None
        ctx.add_cancel_hook(cancel_hook)
        return EarlyStart.launch(spark, ctx.task_id, f"compaction of {self.topic} ({ctx.task_id})", channel,
                                 starts, EarlyStart.stub(self.factory.settings, self.topic, endpoint), cores)

    def _cancel_hook(self, channel: RunChannel) -> Callable[[], None]:
        def hook() -> None:
            # The group first: a reader stopped by the channel fails the job, which must be seen as
            # cancelled (``CompactionCancelled``), not as a Spark failure.
            self.factory.spark.cancel_group(self.ctx.task_id)
            channel.cancel()  # stops the Kafka readers at their next check

        return hook

    def _preview(self, plan: CompactionPlan, channel: RunChannel) -> None:
        """The read and choose steps of the run ``plan`` describes, counted: ``ctx.preview``."""
        ctx = self.ctx
        ctx.transition(TaskState.RUNNING)
        ctx.checkpoint("running")
        cancel_hook = self._cancel_hook(channel)
        ctx.add_cancel_hook(cancel_hook)
        started = time.time()
        counted: dict[str, int] = {}
        tail = self._spark_job(plan, "", channel, count=counted)
        ctx.remove_cancel_hook(cancel_hook)
        ctx.checkpoint("running")
        read = plan.ledger_rows + tail.records
        read_bytes = ledger_totals(plan.previous_files, store=self.store.objects).bytes + tail.bytes
        ctx.progress.records_read, ctx.progress.bytes_read = read, tail.bytes
        ctx.preview = {
            "records_kept": counted["records_kept"],
            "records_removed": max(0, read - counted["records_kept"] - counted["markers"]),
            "bytes_kept": counted["bytes_kept"],
            "bytes_removed": max(0, read_bytes - counted["bytes_kept"]),
            "markers": counted["markers"], "kept_digest": counted["kept_digest"],
            "records_read": read, "tail_records": tail.records, "full_rebuild": plan.full,
            "seconds": round(time.time() - started, 3),
        }

    def _spark_job(self, plan: CompactionPlan, output: str, channel: RunChannel,
                   count: dict[str, int] | None = None, early: EarlyStart | None = None) -> TailRead:
        """Run the job: write the ledger to ``output``, or (``count``) fill ``count`` with the
        preview's counts of what it would write. ``early``: the run's tasks launched before it was planned,
        which write it if they can, and are otherwise ended first."""
        spark = self.factory.spark
        cores = self._cores()
        budget = self.ctx.progress.max_read_bytes_per_second
        readers = min(len(plan.ranges), cores)
        self.ctx.progress.read_tasks = readers if budget else 0
        spec = job_spec(
            self.factory.settings, plan.strategy, topic=self.topic, ranges=plan.ranges,
            ledger_files=plan.previous_files, output_path=output, log_start=plan.log_start,
            channel=channel.endpoint(driver_address(spark.spark)), widths=spark.job_widths(plan.ledger_rows + plan.tail_records),
            now_ms=int((self.ctx.started_at or time.time()) * 1000), key_ttl_ms=self.key_ttl_ms,
            read_bytes_per_second=per_task_rate(budget, len(plan.ranges), cores), cores=cores,
            store=self.store.objects, ledger_facts=plan.previous_facts,
        )
        in_driver = early is None and count is None and not budget and self._small(plan)
        tasks = writing_tasks_spec(spec, plan.strategy.strategy) if (early is not None or in_driver) \
            and count is None else None
        if early is not None and (tasks is None or not early.fits(tasks)):
            early.abort()
            early = None
        stop = threading.Event()
        share = (budget, len(plan.ranges), cores)
        # A read in the driver has no throttled share to hand over, and its progress is read when asked (the
        # progress source): no thread follows it.
        poller = None if in_driver and tasks is not None else \
            threading.Thread(target=self._poll_progress, args=(plan, channel, stop, share), daemon=True)
        self.ctx.set_progress_source(lambda: self._follow(plan, channel.progress()))
        if poller is not None:
            poller.start()
        try:
            if not (in_driver and tasks is not None):
                self.ctx.take_slot()  # a Spark job holds a slot
            if count is not None:
                count.update(spark.run(self.ctx.task_id, f"preview of {self.topic} ({self.ctx.task_id})",
                                       lambda: exact_preview(spark.spark, spec, plan.strategy.strategy)))
            elif in_driver and tasks is not None:
                self.ctx.leave_slot()  # no Spark job: the registry may start the next task beside this one
                self.ctx.stats.in_driver = True
                new_output(tasks.get("store"), output)
                with driver_task_errors(f"compaction of {self.topic} ({self.ctx.task_id})"):
                    run_writing_tasks_in_driver(tasks)
            elif early is not None and tasks is not None and self._hand_over(early, tasks, output):
                self.ctx.stats.early_tasks = True
                early.wait()
            else:
                spark.run(self.ctx.task_id, f"compaction of {self.topic} ({self.ctx.task_id})",
                          lambda: run_compaction_job(spark.spark, spec, plan.strategy.strategy))
        finally:
            self.ctx.set_progress_source(None)
            stop.set()
            if poller is not None:
                poller.join()
        return channel.progress()

    def _cores(self) -> int:
        """The Spark session's cores, asked once a run (a call into the JVM each time: 0.2-0.3 ms, ~3% of a
        burst of small runs' CPU)."""
        if self._session_cores is None:
            self._session_cores = self.factory.spark.cores
        return self._session_cores

    def _likely_small(self) -> bool:
        """A compaction without a read budget whose current ledger is small (``compactionDriverRunMaxRecords``): its
        run is likely small too, read in the driver, and is planned out of its slot."""
        ctx = self.ctx
        if ctx.kind != "compaction" or ctx.rebuild or ctx.progress.max_read_bytes_per_second:
            return False
        try:
            handle = self.service.current()
        except LedgerCorrupt:
            return False
        return handle is not None and handle.manifest.records_kept + handle.manifest.markers <= self._driver_max()

    def _driver_max(self) -> int:
        """The most records of a run (the previous ledger's rows and the tail) whose reads are final
        (``job.reads_are_final``: each partition's winners chosen by its reading task) for its reading task to
        run in the driver, on the run's thread (``kafka_source.run_writing_tasks_in_driver``), not in a Spark
        job: the same code and part files, without a job's fixed cost (its submission, a Python worker's task,
        the results). Early reading tasks are not launched for a ledger this small. ``compactionDriverRunMaxRecords``;
        -1 where it is 0 (every run a Spark job)."""
        configured = self.factory.settings.driver_run_max_records
        return configured if configured > 0 else -1

    def _small(self, plan: CompactionPlan) -> bool:
        """A run small enough for its reading task to run in the driver (``compactionDriverRunMaxRecords``)."""
        return plan.ledger_rows + plan.tail_records <= self._driver_max()

    @staticmethod
    def _hand_over(early: EarlyStart, tasks: dict[str, Any], output: str) -> bool:
        """Give the early tasks the run's spec; False (the early job ended) when they had stopped waiting."""
        new_output(tasks.get("store"), output)  # one that holds something already is an error
        if early.go(tasks):
            return True
        early.abort()
        if tasks.get("store") is None:
            Path(output).rmdir()  # the job that now runs makes it again
        log.info("the early reading tasks of %s stopped waiting for their plan; the run's job starts now",
                 early.description)
        return False

    def _poll_progress(self, plan: CompactionPlan, channel: RunChannel, stop: threading.Event,
                       share: tuple[int, int, int]) -> None:
        """Follow the readers' progress; in a throttled run, hand the share of the tasks that ended to
        those still reading (``throttle.running_share``)."""
        budget, ranges, cores = share
        written = per_task_rate(budget, ranges, cores)
        while not stop.wait(PROGRESS_POLL_S):
            tail = channel.progress()
            self._follow(plan, tail)
            rate = running_share(budget, ranges, cores, tail.ended)
            if budget > 0 and rate != written:
                written = rate
                channel.set_rate(rate)

    def _follow(self, plan: CompactionPlan, tail: TailRead) -> None:
        def update(progress: Progress) -> None:
            progress.records_read = plan.ledger_rows + tail.records
            progress.bytes_read = tail.bytes
            progress.read_started_at, progress.read_ended_at = tail.started_at, tail.ended_at
            progress.throttled_seconds = tail.throttled_seconds

        self.ctx.follow_progress(update)  # an ended task's count stays the one it ended with
