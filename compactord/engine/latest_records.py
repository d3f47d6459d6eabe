"""publishing-order's reduction inside a reading task, kept as the read goes: each key's last record of
the window, as the backend's own record object, until the window ends and its rows are made.

Only the keys are read from every record; a row is built for each record that is still its key's last when
the window ends. In a final read (``job.reads_are_final``) the windows end in the task's
``SettledWindows``; while every key read is new to the partition, a window's rows are made poll by poll
and no dict is filled.
"""

from __future__ import annotations

from itertools import compress
from typing import Any, cast

import pyarrow as pa

from compactord.engine.kafka_fetch import Polled
from compactord.engine.kafka_fetch.base import RecordFields
from compactord.engine.merge import columns_to_batch
from compactord.engine.record_columns import RecordColumns
from compactord.engine.windows import SettledWindows
from compactord.model import RECORD_SCHEMA

__all__ = ["LatestRecords"]


class LatestRecords:
    """The window's last record of each key, of one partition's read under publishing-order."""

    def __init__(self, columns: RecordColumns, settled: SettledWindows, *, final: bool,
                 retain_null_key: bool) -> None:
        self.columns = columns
        self.settled = settled
        self.final = final
        self.retain_null_key = retain_null_key
        self.latest: dict[bytes, Any] = {}
        self.added = 0  # keyed records read in the window
        # Final reads: while every key read is new to the partition, the window's rows made poll by poll,
        # and its records (to fill ``latest`` once a key comes again).
        self.fresh: list[pa.RecordBatch] | None = [] if final else None
        self.fresh_keys: list[bytes] = []
        self.fresh_records: list[Any] = []
        self.fields: RecordFields | None = None  # how the backend's records give their fields

    @property
    def keys(self) -> int:
        """The window's keys, each counted once."""
        return len(self.latest) if self.fresh is None else self.added

    def add(self, polled: Polled, nulls: list[tuple[Any, ...]]) -> None:
        """A record replaces its key's earlier one: a task builds rows for the survivors only, not for every
        record (docs/performance.md). Null-key rows kept go to ``nulls``."""
        self.fields = polled.fields
        keys, records = polled.keys, polled.records
        if None in keys:
            if self.retain_null_key:
                nulls.extend(self.columns.rows(polled.of([r for r, k in zip(records, keys) if k is None])))
            keyed = [k is not None for k in keys]
            keys, records = list(compress(keys, keyed)), list(compress(records, keyed))
        present = cast("list[bytes]", keys)  # the null keys are taken out above
        self.added += len(keys)
        if self.fresh is not None:
            if self.settled.note(present):
                # Every key is new to the partition: each record is its key's last so far. Its row is made
                # now, while the poll's records are in the CPU's caches, and no dict is filled: a final read of
                # 250,000 distinct keys took 0.280 CPU-s against 0.299 (medians of 6, alternating; values
                # into Arrow right after a poll ~57 ns a record, at the window's end from the dict ~155).
                fresh = Polled(records, polled.fields, keys)
                self.fresh.append(columns_to_batch(self.columns.partition,
                                                   *self.columns.columns(fresh, fresh.offset_column())))
                self.fresh_keys.extend(present)
                self.fresh_records.extend(records)
                return
            # A key came again: the window goes on as each key's last record, its earlier records included.
            self.latest.update(zip(self.fresh_keys, self.fresh_records))
            self.fresh, self.fresh_keys, self.fresh_records = None, [], []
        self.latest.update(zip(present, records))

    def table(self, nulls: list[tuple[Any, ...]]) -> pa.Table:
        """Each key's last record so far and the null-key rows, in offset order, straight from the records'
        columns into Arrow (no row tuples); the window starts again."""
        tables = [self.columns.table(nulls)] if nulls else []
        if self.fresh:  # every key of the window new: its rows, made as it was read
            tables.append(pa.Table.from_batches(self.fresh, RECORD_SCHEMA))
        elif self.latest and self.fields is not None:
            records = list(self.latest.values())
            keys: list[bytes | None] | None = None
            if len(records) < self.added:  # a key came again: its record moved past others
                records.sort(key=self.fields.offset_of)
            else:
                keys = list(self.latest)  # in the records' order, and no key read from them again
            polled = Polled(records, self.fields, keys)
            batch = columns_to_batch(self.columns.partition, *self.columns.columns(polled, polled.offset_column()))
            tables.append(pa.Table.from_batches([batch], RECORD_SCHEMA))
        self.latest, self.added = {}, 0
        self.fresh = [] if self.final else None
        self.fresh_keys, self.fresh_records = [], []
        if not tables:
            return RECORD_SCHEMA.empty_table()
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables).sort_by("offset")

    def settle(self) -> None:
        """Final reads: the window's last record of each key becomes Arrow rows in the settled windows; a
        key may come again in a later window, so the rows of all windows are reduced once more at the end."""
        if self.fresh is None:  # a window that met a key again noted its keys only up to then: all of them
            self.settled.note(self.latest)
        keys = self.keys  # the window's, each once
        self.settled.add(self.table([]), keys)
