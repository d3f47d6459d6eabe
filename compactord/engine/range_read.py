"""One offset range read inside a Spark task: the data source's own logic, written once for both clients.

- read_committed: records of aborted transactions never reach Spark; control records are skipped by
  the client, and the loop ends on the reader's *position*, not the last record's offset + 1,
  because transaction markers occupy offsets.
- A key's losers are dropped inside the reading task (``strategies.reducer_for``): per window of rows,
  only what the final choice may still need goes to Spark (the lever on speed: per-row Python work in
  Spark). With ``final`` (``job.reads_are_final``: the task reads its whole partition), the windows'
  survivors are reduced once more at the end, so that only each key's winner leaves the task and Spark
  need not group. An incremental run merges the partition's ledger rows there (``merge_into_ledger``);
  a compaction's task (``write``) applies the deletion rules and writes the partition's part file
  itself, handing no row to Spark (a preview's hands its rows over, for Spark to count).
- A throttled run (``engine/throttle.py``) waits in each task's token bucket after each poll, and asks
  for fetches of about one second of its share.
- Progress and final counts are small JSON files in ``progress_dir`` (on the ledger root, which
  executors share); a ``CANCEL`` file there stops every reader at its next poll (``task_files``).
"""

from __future__ import annotations

import gc
import heapq
import time
from collections.abc import Iterator, Sequence
from itertools import compress, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any

import pyarrow as pa

from compactord.engine.deletions import DeletionRules
from compactord.engine.merge import columns_to_batch, merge_into_ledger, records_to_batch
from compactord.engine.readers import AUTO, Polled, RangeReader, open_range_reader
from compactord.engine.readers.base import RecordFields
from compactord.engine.strategies.publishing_order import reduce_last_offset
from compactord.engine.task_files import TaskFiles
from compactord.engine.throttle import ReadThrottle
from compactord.engine.windows import MEMORY_BUDGET_BYTES, SettledWindows
from compactord.ledger.parts import part_name, write_part
from compactord.ledger.row_groups import partition_rows
from compactord.model import RECORD_SCHEMA, RecordFingerprint

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
        from compactord.engine.strategies import event_time_extractor, load_strategy, plan_for

        self.spec = spec
        self.partition, self.start, self.end = partition, start, end
        self.event_time_source = spec["event_time_source"]
        self.event_time = event_time_extractor(self.event_time_source)
        self.reduce = plan_for(load_strategy(spec["strategy"])).reducer
        self.retain_null_key = bool(spec["retain_null_key"])
        self.empty_deletes = bool(spec.get("empty_value_is_tombstone", False))
        self.last: RecordFingerprint | None = None  # the last data record read (the log's identity)
        self.batch_records = int(spec["batch_records"])
        self.client = spec.get("reader_client", AUTO)
        self.final = bool(spec.get("final", False))
        # Final reads of an incremental run: the previous ledger's files and row groups that may hold this
        # partition's rows (the driver read the footers), merged into its winners at the end
        # (``merge.merge_into_ledger``), and the log start that bounds its rows.
        self.ledger_groups: list[tuple[str, list[int]]] = [
            (path, indexes) for path, indexes in spec.get("ledger_groups", {}).get(str(partition), [])]
        self.log_start = int(spec.get("log_start", {}).get(str(partition), 0))
        # Final reads of a compaction (not a preview): the task applies these deletion rules and writes its
        # partition's part file into this folder, and hands no row to Spark.
        self.write: tuple[Path, DeletionRules] | None = (
            (Path(spec["write_to"]), DeletionRules.from_json(spec["deletion_rules"])) if spec.get("write_to") else None)
        # publishing-order: each key's last record so far, as the backend's own record object; rows are
        # built only for the records still here when the window ends (``_add_latest``).
        self._latest: dict[bytes, Any] | None = {} if self.reduce is reduce_last_offset else None
        self._latest_added = 0  # keyed records read in the window
        # Final reads under publishing-order: while every key read is new to the partition, the window's rows
        # made poll by poll (``_add_latest``), and its records (to fill ``_latest`` once a key comes again).
        self._fresh: list[pa.RecordBatch] | None = [] if self._latest is not None and self.final else None
        self._fresh_keys: list[bytes] = []
        self._fresh_records: list[Any] = []
        self._fields: RecordFields | None = None  # how the backend's records give their fields
        self._held: list[tuple[Any, ...]] = []  # final reads: the survivors of the windows so far
        self._held_nulls: list[tuple[Any, ...]] = []  # final reads: the retained null-key rows so far
        # Final reads, publishing-order: each window's last rows by key, in memory up to a budget, then on
        # the executor's local disk.
        self._settled = SettledWindows(int(spec.get("window_memory_bytes", MEMORY_BUDGET_BYTES)), self._check_cancel)
        self._windows = 0
        self.files = TaskFiles(Path(spec["progress_dir"]) if spec.get("progress_dir") else None, partition, start)
        self.records = 0
        self.bytes = 0
        self._last_progress = 0.0
        self.rate = float(spec.get("read_bytes_per_second", 0))  # this task's share of the read budget
        self.throttle = ReadThrottle(self.rate, self._check_cancel) if self.rate > 0 else None
        self.started_at = time.time()
        self.read_ended_at: float | None = None  # when the last record of the range was read

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
        return open_range_reader(self.client, self.spec["client"], self.spec["topic"], self.partition,
                                 self.start, self.batch_records, self.rate)

    def run(self, reader: RangeReader | None = None) -> Iterator[pa.RecordBatch]:
        """Read the range and yield what it hands to Spark. ``reader``: its reader, opened ahead
        (``open_ahead``); the task closes it."""
        try:
            if self.end <= self.start:
                if self.ledger_groups:  # a partition without new records: its ledger rows, deletion rules to come
                    yield from self._flush([], [], last=True)
                else:
                    self._report(done=True)
                return
            self._check_cancel()  # a task cancelled before this one started: no fetch of its own
            # What the worker holds before the read (modules, Spark's worker state) lives as long as the worker:
            # out of the collector's sight. Spark's daemon collects in full after every task (``pyspark.daemon``),
            # which scanned ~73,000 such objects in 50-107 ms of a ~0.7 s task here; now what the task left.
            gc.freeze()
            if reader is None:
                reader = self._open()
            # The cyclic collector is off while a task reads: a window holds up to REDUCE_WINDOW rows, which
            # every collection re-scanned (the reader's CPU per record: ~4.4 us with it on, ~2.0 us off).
            # Reference counting still frees what the read drops; the client's few cycles wait for the end.
            collecting = gc.isenabled()
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
            return (self._latest_added if self._fresh is not None else len(self._latest)) >= FINAL_WINDOW_KEYS
        return len(self._latest) + len(nulls) >= REDUCE_WINDOW

    def _add(self, polled: Polled, keyed: list[tuple[Any, ...]], nulls: list[tuple[Any, ...]]) -> None:
        """Take one poll's records: the one record path of both backends.

        Per-record work here is what a compaction costs beyond the client's own decoding, so it runs in
        C (``map``, ``zip``, ``dict.update``) rather than as a Python loop over the records.
        """
        self._fields = polled.fields
        tail = polled.of(polled.records[-1:])
        self.last = RecordFingerprint.of(tail.offsets[0], tail.timestamps[0], tail.keys[0], tail.values[0])
        self.records += len(polled)
        nbytes = polled.nbytes()
        self.bytes += nbytes
        if self.throttle is not None:
            self.throttle.consume(nbytes)
        if self._latest is not None:
            self._add_latest(polled, nulls)
            return
        keys = polled.keys
        rows = self._rows(polled)
        if None not in keys:
            keyed.extend(rows)
        elif self.retain_null_key:
            for row in rows:
                (keyed if row[3] is not None else nulls).append(row)
        else:
            keyed.extend(row for row in rows if row[3] is not None)

    def _add_latest(self, polled: Polled, nulls: list[tuple[Any, ...]]) -> None:
        """publishing-order: a record replaces its key's earlier one in ``_latest``. Only the keys are read
        from every record; a row is built for each record that is still its key's last when the window ends:
        measured on 250,000 records of 2,500 keys, ~0.2 CPU-s less per task than a row for every record."""
        keys, records = polled.keys, polled.records
        if None in keys:
            if self.retain_null_key:
                nulls.extend(self._rows(polled.of([r for r, k in zip(records, keys) if k is None])))
            keyed = [k is not None for k in keys]
            keys, records = list(compress(keys, keyed)), list(compress(records, keyed))
        self._latest_added += len(keys)
        if self._fresh is not None:
            if self._settled.note(keys):
                # Every key is new to the partition: each record is its key's last so far. Its row is made
                # now, while the poll's records are in the CPU's caches, and no dict is filled: a final read of
                # 250,000 distinct keys took 0.280 CPU-s against 0.299 (medians of 6, alternating; values
                # into Arrow right after a poll ~57 ns a record, at the window's end from the dict ~155).
                fresh = Polled(records, polled.fields, keys)
                self._fresh.append(columns_to_batch(self.partition, *self._columns(fresh, fresh.offset_column())))
                self._fresh_keys.extend(keys)
                self._fresh_records.extend(records)
                return
            # A key came again: the window goes on as each key's last record, its earlier records included.
            self._latest.update(zip(self._fresh_keys, self._fresh_records))  # type: ignore[union-attr]
            self._fresh, self._fresh_keys, self._fresh_records = None, [], []
        self._latest.update(zip(keys, records))  # type: ignore[union-attr]

    def _columns(self, polled: Polled, offsets: Sequence[int] | pa.Array | None = None) -> tuple[Any, ...]:
        """The records' columns ``(offset, timestamp, key, value, headers, event_time)``; ``offsets``: their
        offset column, when the caller has it."""
        timestamps, headers, values = polled.timestamps, polled.headers, polled.values
        if self.empty_deletes and b"" in values:  # Pulsar's rule: an empty value deletes like a null one
            values = [None if v == b"" else v for v in values]
        return (polled.offsets if offsets is None else offsets, timestamps, polled.keys, values, headers,
                self._event_times(timestamps, headers))

    def _rows(self, polled: Polled) -> Iterator[tuple[Any, ...]]:
        """The records as rows ``(partition, offset, timestamp, key, value, headers, event_time)``."""
        return zip(repeat(self.partition, len(polled)), *self._columns(polled))

    def _latest_table(self, nulls: list[tuple[Any, ...]]) -> pa.Table:
        """Each key's last record so far and the null-key rows, in offset order, straight from the records'
        columns into Arrow (no row tuples); the window starts again."""
        tables = [self._table(nulls)] if nulls else []
        if self._fresh:  # every key of the window new: its rows, made as it was read
            tables.append(pa.Table.from_batches(self._fresh, RECORD_SCHEMA))
        elif self._latest and self._fields is not None:
            records = list(self._latest.values())
            keys: list[bytes | None] | None = None
            if len(records) < self._latest_added:  # a key came again: its record moved past others
                records.sort(key=self._fields.offset_of)
            else:
                keys = list(self._latest)  # in the records' order, and no key read from them again
            polled = Polled(records, self._fields, keys)
            batch = columns_to_batch(self.partition, *self._columns(polled, polled.offset_column()))
            tables.append(pa.Table.from_batches([batch], RECORD_SCHEMA))
        self._latest, self._latest_added = {}, 0
        self._fresh = [] if self.final else None
        self._fresh_keys, self._fresh_records = [], []
        if not tables:
            return RECORD_SCHEMA.empty_table()
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables).sort_by("offset")

    def _final_latest(self) -> pa.Table:
        """Final reads under publishing-order: each key's last record of the partition, with the retained
        null-key rows, in offset order, as one table."""
        tables = list(self._settled.last_rows())
        if not tables:
            table = RECORD_SCHEMA.empty_table()
        else:
            table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        if self._held_nulls:
            nulls = self._table(self._held_nulls)
            self._held_nulls = []
            table = pa.concat_tables([table, nulls]).sort_by("offset")
        return table

    def _write_windows(self, folder: Path, rules: DeletionRules) -> None:
        """A compaction's final read without null-key or ledger rows: the windows, each reduced to its keys'
        winners (``SettledWindows.last_rows``), pass the deletion rules into the part file one at a time,
        never joined (joined and filtered, 500,000 distinct keys peaked 49 MB higher)."""
        self._check_cancel()
        write_part(map(rules.apply_arrow, self._settled.last_rows()), folder, part_name(self.partition))

    def _event_times(self, timestamps: list[Any], headers: list[Any]) -> Sequence[int | None]:
        if self.event_time_source == "timestamp":
            # The rule (``strategies.event_time_extractor``): a timestamp is the event time unless it
            # is negative or missing. Usually every one is valid, and the column is the timestamps.
            try:
                if not timestamps or min(timestamps) >= 0:
                    return timestamps
            except TypeError:  # a missing (None) timestamp: old message format
                pass
        # librdkafka gives None for "no headers", kafka-python an empty list.
        return list(map(self.event_time, timestamps, [h or () for h in headers]))

    def _flush(self, keyed: list[tuple[Any, ...]], nulls: list[tuple[Any, ...]],
               last: bool = False) -> Iterator[pa.RecordBatch]:
        if self._latest is not None:
            if not self.final:
                yield from self._latest_table(nulls).to_batches(max_chunksize=self.batch_records)
                return
            # Final reads: the window's last record of each key becomes Arrow rows; a key may come again in a
            # later window, so the rows of all windows are reduced once more at the end.
            if self._fresh is None:  # a window that met a key again noted its keys only up to then: all of them
                self._settled.note(self._latest)
            keys = len(self._latest) if self._fresh is None else self._latest_added  # the window's, each once
            self._settled.add(self._latest_table([]), keys)
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
            yield from self._batches(kept)
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
        yield from self._finish(self._table(kept))

    def _finish(self, winners: pa.Table) -> Iterator[pa.RecordBatch]:
        """Final reads: the partition's winners in offset order, with its previous ledger rows merged in
        (an incremental run), handed to Spark; or, when the task writes (``write``), put through the
        deletion rules and written as the partition's part file, no row handed over."""
        table = winners
        if self.ledger_groups:
            self._check_cancel()
            table = merge_into_ledger(winners, partition_rows(self.ledger_groups, self.partition, self.log_start),
                                      self.reduce)
        if self.write is None:
            yield from table.to_batches(max_chunksize=self.batch_records)
            return
        self._check_cancel()
        folder, rules = self.write
        write_part(rules.apply_arrow(table), folder, part_name(self.partition))

    def _table(self, rows: list[tuple[Any, ...]]) -> pa.Table:
        return pa.Table.from_batches(list(self._batches(rows)), RECORD_SCHEMA)

    def _batches(self, kept: list[tuple[Any, ...]]) -> Iterator[pa.RecordBatch]:
        for i in range(0, len(kept), self.batch_records):
            yield records_to_batch(kept[i : i + self.batch_records])

    def _progress(self, now: float) -> None:
        if now - self._last_progress < PROGRESS_EVERY_S:
            return
        self._last_progress = now
        self._check_cancel()
        self._follow_rate()
        self._report(done=False)

    def _check_cancel(self) -> None:
        if self.files.cancelled():
            raise RuntimeError(f"compaction cancelled while reading partition {self.partition}")

    def _follow_rate(self) -> None:
        """A throttled task takes the share the driver wrote last (more, once other tasks have ended)."""
        if self.throttle is None:
            return
        rate = self.files.new_rate()
        if rate is not None:
            self.throttle.set_rate(rate)

    def _report(self, done: bool) -> None:
        self.files.report({
            "records": self.records, "bytes": self.bytes, "done": done, "partition": self.partition,
            "last": None if self.last is None else self.last.to_json(), "started_at": self.started_at,
            "read_ended_at": self.read_ended_at, "spilled_bytes": self._settled.bytes_written,
            "throttled_seconds": self.throttle.slept if self.throttle is not None else 0.0})
