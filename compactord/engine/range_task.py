"""One offset range read inside a Spark task: the data source's own logic, written once for both clients.

- read_committed: records of aborted transactions never reach Spark; control records are skipped by
  the client, and the loop ends on the reader's *position*, not the last record's offset + 1,
  because transaction markers occupy offsets.
- A key's losers are dropped inside the reading task (``strategies.reducer_for``): per window of rows,
  only what the final choice may still need goes to Spark (the lever on speed: per-row Python work in
  Spark); under publishing-order, each key's last record is kept as the read goes (``latest_records``),
  and rows are made from the records' columns (``record_columns``). With ``final`` (``job.reads_are_final``: the task reads its whole partition), the windows'
  survivors are reduced once more at the end, so that only each key's winner leaves the task and Spark
  need not group. An incremental run merges the partition's ledger rows there (``merge_into_ledger``);
  a compaction's task (``write``) applies the deletion rules and writes the partition's part file
  itself, handing no row to Spark (a preview's hands its rows over, for Spark to count).
- A throttled run (``engine/throttle.py``) waits in each task's token bucket after each poll, and asks
  for fetches of about one second of its share.
- Progress and final counts go to the driver over the run's channel (``engine.channel``), at the task's
  checks; a cancel, and a throttled run's new share, come back the same way, read at those checks.
"""

from __future__ import annotations

import gc
import heapq
import time
from collections.abc import Iterator
from operator import itemgetter
from typing import Any

import pyarrow as pa

from compactord.engine.channel import TaskChannel, client_config
from compactord.engine.deletions import DeletionRules
from compactord.engine.kafka_fetch import Polled, RangeReader, open_range_reader
from compactord.engine.latest_records import LatestRecords
from compactord.engine.merge import merge_into_ledger
from compactord.engine.record_columns import RecordColumns
from compactord.engine.strategies.publishing_order import reduce_last_offset
from compactord.engine.throttle import ReadThrottle
from compactord.engine.windows import MEMORY_BUDGET_BYTES, SettledWindows
from compactord.engine.worker_store import locate, spec_store
from compactord.ledger.parts import part_name, write_part
from compactord.ledger.row_groups import FileSlice, partition_rows
from compactord.model import RECORD_SCHEMA, RecordFingerprint
from compactord.storage import ObjectStore
from compactord.task_report import RequestCounts, counting_requests

__all__ = ["FINAL_WINDOW_KEYS", "REDUCE_WINDOW", "RangeReadTask"]

# Rows reduced together: bounds a reader's memory (a window of tuples), and still cuts a topic of few hot keys.
REDUCE_WINDOW = 200_000
# Final reads under publishing-order: the most keys whose last record a task holds as the client's record
# objects (~440 bytes each with librdkafka) before it turns them into Arrow rows (~150 bytes) and starts a
# new window; the windows' rows are reduced to each key's last in Arrow at the end (``last_of_each_key``).
# Holding a whole partition of distinct keys as record objects touched ~400 MB per 250,000 records, and the
# page faults cost as much CPU as the read.
FINAL_WINDOW_KEYS = 50_000
PROGRESS_EVERY_S = 0.5
# Empty polls in a row, with the broker's high watermark at the position, before a range whose end the
# log no longer reaches fails (instead of waiting out the stall limit).
_ENDED_POLLS = 3

_ROW_OFFSET = itemgetter(1)


class RangeReadTask:
    """Reads one offset range in a Spark Python worker and yields reduced Arrow batches."""

    def __init__(self, spec: dict[str, Any], partition: int, start: int, end: int) -> None:
        from compactord.engine.strategies import load_strategy, plan_for

        self.spec = spec
        self.partition, self.start, self.end = partition, start, end
        self.reduce = plan_for(load_strategy(spec["strategy"])).reducer
        self.retain_null_key = bool(spec["retain_null_key"])
        self.last: RecordFingerprint | None = None  # the last data record read (the log's identity)
        self.batch_records = int(spec["batch_records"])
        self.columns = RecordColumns(partition, spec["event_time_source"],
                                     bool(spec.get("empty_value_is_tombstone", False)), self.batch_records)
        self.final = bool(spec.get("final", False))
        # Final reads of an incremental run: the previous ledger's files and row groups that may hold this
        # partition's rows (the driver read the footers), merged into its winners at the end
        # (``merge.merge_into_ledger``), and the log start that bounds its rows.
        self.ledger_groups: list[FileSlice] = [
            FileSlice(*entry) for entry in spec.get("ledger_groups", {}).get(str(partition), [])]
        self.log_start = int(spec.get("log_start", {}).get(str(partition), 0))
        # Final reads of a compaction (not a preview): the task applies these deletion rules and writes its
        # partition's part file into this folder, and hands no row to Spark.
        self.write: tuple[str, DeletionRules] | None = (
            (spec["write_to"], DeletionRules.from_json(spec["deletion_rules"])) if spec.get("write_to") else None)
        self._held: list[tuple[Any, ...]] = []  # final reads: the survivors of the windows so far
        self._held_nulls: list[tuple[Any, ...]] = []  # final reads: the retained null-key rows so far
        self._requests = RequestCounts()  # its requests to the ledger root's store, reported with its progress
        # Final reads, publishing-order: each window's last rows by key, in memory up to a budget, then on
        # the executor's local disk.
        self._settled = SettledWindows(int(spec.get("window_memory_bytes", MEMORY_BUDGET_BYTES)), self._check_cancel)
        # publishing-order: each key's last record so far (``latest_records``).
        self._latest = LatestRecords(self.columns, self._settled, final=self.final,
                                     retain_null_key=self.retain_null_key) \
            if self.reduce is reduce_last_offset else None
        self._windows = 0
        # The run's channel (None: a task that reports nothing, e.g. the warm-up's); the rates it brought so far.
        self.channel = TaskChannel.for_spec(spec)
        self._rate_seen = 0
        self.records = 0
        self.bytes = 0
        self._last_progress = 0.0
        self.rate = float(spec.get("read_bytes_per_second", 0))  # this task's share of the read budget
        self.throttle = ReadThrottle(self.rate, self._check_cancel) if self.rate > 0 else None
        self.started_at = time.time()
        self.read_ended_at: float | None = None  # when the last record of the range was read
        # The worker's CPU time (every thread: librdkafka's too) and the wall time since the read began: a
        # worker runs one task at a time, so their ratio tells a task that waited for a core (or the broker).
        self._cpu_from: float | None = None
        self._wall_from = 0.0

    @property
    def spilled_windows(self) -> int:
        """Final reads under publishing-order: the window files this task wrote to local disk."""
        return self._settled.files_written

    def open_ahead(self) -> RangeReader | None:
        """This range's reader, opened before its turn (``run`` takes it); None where there is nothing to
        read, or where the read is throttled (a reader fetches as soon as it is open)."""
        if self.end <= self.start or self.throttle is not None:
            return None
        return self._open()

    def take_ahead(self, reader: RangeReader) -> RangeReader | None:
        """``reader``, opened at this range's start before the range was known (``early_start``), for ``run``;
        closed, and None, where ``open_ahead`` would open none."""
        if self.end <= self.start or self.throttle is not None:
            reader.close()
            return None
        return reader

    def _open(self) -> RangeReader:
        return open_range_reader(client_config(self.spec, self.channel), self.spec["topic"], self.partition,
                                 self.start, self.batch_records, self.rate)

    def run(self, reader: RangeReader | None = None) -> Iterator[pa.RecordBatch]:
        """Read the range and yield what it hands to Spark. ``reader``: its reader, opened ahead
        (``open_ahead``); the task closes it."""
        with counting_requests(self._requests):  # its store requests (ledger rows, its part) go in its reports
            yield from self._run(reader)

    def _run(self, reader: RangeReader | None) -> Iterator[pa.RecordBatch]:
        try:
            if self.end <= self.start:
                if self.ledger_groups:  # a partition without new records: its ledger rows, deletion rules to come
                    yield from self._flush([], [], last=True)
                else:
                    self._report(done=True)
                return
            self._check_cancel()  # a task cancelled before this one started: no fetch of its own
            self._cpu_from, self._wall_from = time.process_time(), time.monotonic()
            # What the worker holds before the read (modules, Spark's worker state) lives as long as the worker:
            # out of the collector's sight. Spark's daemon collects in full after every task (``pyspark.daemon``),
            # which scanned ~73,000 such objects in 50-107 ms of a ~0.7 s task here; now what the task left.
            # A task read in the driver (``in_driver``: a small run) leaves the collector alone: the daemon's
            # other threads share it, and what it would freeze is theirs.
            in_worker = not self.spec.get("in_driver")
            if in_worker:
                gc.freeze()
            if reader is None:
                reader = self._open()
            # The cyclic collector is off while a task reads: a window holds up to REDUCE_WINDOW rows, which
            # every collection re-scanned (the reader's CPU per record: ~4.4 us with it on, ~2.0 us off).
            # Reference counting still frees what the read drops; the client's few cycles wait for the end.
            collecting = in_worker and gc.isenabled()
            if in_worker:
                gc.disable()
            try:
                yield from self._read(reader)
            finally:
                if collecting:
                    gc.enable()
        finally:
            self._settled.close()
            if reader is not None:
                reader.close()
            # Arrow's allocator keeps what a task freed for later allocations, which an idle worker never makes:
            # kept, a worker (or the driver, after a run read there) would hold its task's peak until it ends,
            # 1.2-1.5 GB after an incremental run's 1,250,000 rows a partition (see #40). Given back once the
            # task's tables are let go: ~13 ms for 440 MB, ~10 us with nothing to give.
            pa.default_memory_pool().release_unused()
        self._report(done=True)

    def _read(self, reader: RangeReader) -> Iterator[pa.RecordBatch]:
        keyed: list[tuple[Any, ...]] = []
        nulls: list[tuple[Any, ...]] = []
        end, partition, topic = self.end, self.partition, self.spec["topic"]
        stall_limit = max(30.0, 2 * int(self.spec["client"].get("request_timeout_ms", 30000)) / 1000)
        last_move = time.monotonic()
        position = self.start
        ended_polls = 0
        while position < end:
            polled = reader.poll(0.5, end - position)  # no more than the range holds: no wait at its end
            if polled:
                if polled.last_offset >= end:  # offsets grow within a partition: only the last poll
                    polled = polled.below(end)
                if polled:
                    self._add(polled, keyed, nulls)
            new_position = reader.position()
            now = time.monotonic()
            if new_position is not None and new_position != position:
                position, last_move, ended_polls = new_position, now, 0
            elif self._log_ended(reader, position):
                ended_polls += 1
                if ended_polls >= _ENDED_POLLS:
                    raise RuntimeError(
                        f"{topic}[{partition}] now ends at {reader.high_watermark()}, below the end {end} fixed "
                        f"when the run began (range {self.start}-{end}): the topic was truncated or recreated "
                        "since; the next run re-plans against the new log"
                    )
            elif now - last_move > stall_limit:
                raise RuntimeError(
                    f"reading {topic}[{partition}] made no progress at offset {position} for "
                    f"{stall_limit:.0f}s (range {self.start}-{end}); is the broker up?"
                )
            if self._window_full(keyed, nulls):
                yield from self._flush(keyed, nulls)
                keyed, nulls = [], []
            self._progress(now)
        self.read_ended_at = time.time()
        yield from self._flush(keyed, nulls, last=True)

    @staticmethod
    def _log_ended(reader: RangeReader, position: int) -> bool:
        """The broker's last fetch said the log ends at or below ``position`` (no record is coming)."""
        highwater = reader.high_watermark()
        return highwater is not None and highwater <= position

    def _window_full(self, keyed: list[tuple[Any, ...]], nulls: list[tuple[Any, ...]]) -> bool:
        """Time to reduce the rows read so far (and, unless ``final``, hand the survivors to Spark)."""
        if self._latest is None:
            return len(keyed) + len(nulls) >= REDUCE_WINDOW
        # The last records by key are the reduction itself, kept as the read goes: a final read holds
        # them to the end (as it would hold every window's survivors).
        if self.final:
            return self._latest.keys >= FINAL_WINDOW_KEYS
        return self._latest.keys + len(nulls) >= REDUCE_WINDOW

    def _add(self, polled: Polled, keyed: list[tuple[Any, ...]], nulls: list[tuple[Any, ...]]) -> None:
        """Take one poll's records.

        Per-record work here is what a compaction costs beyond the client's own decoding, so it runs in
        C (``map``, ``zip``, ``dict.update``) rather than as a Python loop over the records.
        """
        tail = polled.of(polled.records[-1:])
        self.last = RecordFingerprint.of(tail.offsets[0], tail.timestamps[0], tail.keys[0], tail.values[0])
        self.records += len(polled)
        nbytes = polled.nbytes()
        self.bytes += nbytes
        if self.throttle is not None:
            self.throttle.consume(nbytes)
        if self._latest is not None:
            self._latest.add(polled, nulls)
            return
        keys = polled.keys
        rows = self.columns.rows(polled)
        if None not in keys:
            keyed.extend(rows)
        elif self.retain_null_key:
            for row in rows:
                (keyed if row[3] is not None else nulls).append(row)
        else:
            keyed.extend(row for row in rows if row[3] is not None)

    def _final_latest(self) -> pa.Table:
        """Final reads under publishing-order: each key's last record of the partition, with the retained
        null-key rows, in offset order, as one table."""
        tables = list(self._settled.last_rows())
        if not tables:
            table = RECORD_SCHEMA.empty_table()
        else:
            table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        if self._held_nulls:
            nulls = self.columns.table(self._held_nulls)
            self._held_nulls = []
            table = pa.concat_tables([table, nulls]).sort_by("offset")
        return table

    def _write_windows(self, folder: str, rules: DeletionRules) -> None:
        """A compaction's final read without null-key or ledger rows: the windows, each reduced to its keys'
        winners (``SettledWindows.last_rows``), pass the deletion rules into the part file one at a time,
        never joined (joined and filtered, 500,000 distinct keys peaked 49 MB higher)."""
        self._check_cancel()
        write_part(map(rules.apply_arrow, self._settled.last_rows()), *self._part(folder))

    def _flush(self, keyed: list[tuple[Any, ...]], nulls: list[tuple[Any, ...]],
               last: bool = False) -> Iterator[pa.RecordBatch]:
        if self._latest is not None:
            if not self.final:
                yield from self._latest.table(nulls).to_batches(max_chunksize=self.batch_records)
                return
            self._latest.settle()
            self._held_nulls.extend(nulls)
            if last:
                if self.ledger_groups or self._held_nulls:  # a bounded partition (``job.reads_are_final``)
                    yield from self._finish(self._final_latest())
                elif self.write is not None:
                    self._write_windows(*self.write)
                else:  # a preview's: its rows to Spark, window by window
                    for table in self._settled.last_rows():
                        yield from table.to_batches(max_chunksize=self.batch_records)
            return
        kept = list(map(keyed.__getitem__, self.reduce(keyed))) if keyed else []
        if not self.final:
            kept.extend(nulls)  # order does not matter: the job sorts the ledger by (partition, offset)
            yield from self.columns.batches(kept)
            return
        # Final reads: survivors are in offset order (reducers return sorted indexes), window after
        # window; the reducer over all of them picks each key's winner among every record of the
        # partition. The rows leave in offset order, null-key rows merged in, so that they are written
        # as they come, without a sort.
        self._windows += 1 if keyed else 0
        self._held.extend(kept)
        self._held_nulls.extend(nulls)
        if not last:
            return
        held, self._held = self._held, []
        kept = list(map(held.__getitem__, self.reduce(held))) if self._windows > 1 else held
        if self._held_nulls:
            kept = list(heapq.merge(kept, self._held_nulls, key=_ROW_OFFSET))
            self._held_nulls = []
        yield from self._finish(self.columns.table(kept))

    def _finish(self, winners: pa.Table) -> Iterator[pa.RecordBatch]:
        """Final reads: the partition's winners in offset order, with its previous ledger rows merged in
        (an incremental run), handed to Spark; or, when the task writes (``write``), put through the
        deletion rules and written as the partition's part file, no row handed over."""
        table = winners
        del winners  # each table is let go once the next is made: the rows a task holds at once are the peak
        if self.ledger_groups:
            self._check_cancel()
            rows = partition_rows(self.ledger_groups, self.partition, self.log_start, self._store())
            table = merge_into_ledger(table, rows, self.reduce)
            del rows
        if self.write is None:
            yield from table.to_batches(max_chunksize=self.batch_records)
            return
        self._check_cancel()
        folder, rules = self.write
        table = rules.apply_arrow(table)
        write_part(table, *self._part(folder))

    def _store(self) -> ObjectStore | None:
        """The ledger root the spec names (its credentials from the run's channel); None: local paths."""
        return spec_store(self.spec, self.channel)

    def _part(self, folder: str) -> tuple[ObjectStore, str]:
        """Where this partition's part file goes: the store and its key."""
        return locate(self._store(), f"{folder}/{part_name(self.partition)}")

    def _progress(self, now: float) -> None:
        if now - self._last_progress < PROGRESS_EVERY_S:
            return
        self._last_progress = now
        self._check_cancel()
        self._follow_rate()
        self._report(done=False)

    def _check_cancel(self) -> None:
        """Stop when the run was cancelled (``ChannelLost`` when the channel is gone)."""
        if self.channel is None:
            return
        self.channel.check()
        if self.channel.cancelled:
            raise RuntimeError(f"compaction cancelled while reading partition {self.partition}")

    def _follow_rate(self) -> None:
        """A throttled task takes the share the driver sent last (more, once other tasks have ended); its
        ``_check_cancel`` just read what came."""
        if self.throttle is None or self.channel is None or self.channel.rate_version == self._rate_seen:
            return
        self._rate_seen = self.channel.rate_version
        if self.channel.rate is not None:
            self.throttle.set_rate(self.channel.rate)

    def _report(self, done: bool) -> None:
        if self.channel is None:
            return
        cpu = wall = 0.0
        if self._cpu_from is not None:
            cpu, wall = time.process_time() - self._cpu_from, time.monotonic() - self._wall_from
        self.channel.report(f"{self.partition}-{self.start}", {
            "cpu_seconds": cpu, "wall_seconds": wall,
            "records": self.records, "bytes": self.bytes, "done": done, "partition": self.partition,
            "last": None if self.last is None else self.last.to_json(), "started_at": self.started_at,
            "read_ended_at": self.read_ended_at, "spilled_bytes": self._settled.bytes_written,
            "storage_requests": self._requests.snapshot(),
            "throttled_seconds": self.throttle.slept if self.throttle is not None else 0.0,
            "rate": self.throttle.rate if self.throttle is not None else None})
