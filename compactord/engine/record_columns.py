"""A poll's records as the columns and rows a reading task reduces and hands on, and rows into Arrow."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import Any

import pyarrow as pa

from compactord.engine.kafka_fetch import Polled
from compactord.engine.merge import records_to_batch
from compactord.model import RECORD_SCHEMA

__all__ = ["RecordColumns"]


class RecordColumns:
    """The records of one partition as ``(offset, timestamp, key, value, headers, event_time)`` columns,
    their event times and empty-value rule applied, and rows of those into Arrow batches."""

    def __init__(self, partition: int, event_time_source: str, empty_deletes: bool, batch_records: int) -> None:
        from compactord.engine.strategies import event_time_extractor

        self.partition = partition
        self.event_time_source = event_time_source
        self.event_time = event_time_extractor(event_time_source)
        self.empty_deletes = empty_deletes
        self.batch_records = batch_records

    def columns(self, polled: Polled, offsets: Sequence[int] | pa.Array | None = None) -> tuple[Any, ...]:
        """The records' columns ``(offset, timestamp, key, value, headers, event_time)``; ``offsets``: their
        offset column, when the caller has it."""
        timestamps, headers, values = polled.timestamps, polled.headers, polled.values
        if self.empty_deletes and b"" in values:  # Pulsar's rule: an empty value deletes like a null one
            values = [None if v == b"" else v for v in values]
        return (polled.offsets if offsets is None else offsets, timestamps, polled.keys, values, headers,
                self._event_times(timestamps, headers))

    def rows(self, polled: Polled) -> Iterator[tuple[Any, ...]]:
        """The records as rows ``(partition, offset, timestamp, key, value, headers, event_time)``."""
        return zip(repeat(self.partition, len(polled)), *self.columns(polled))

    def table(self, rows: list[tuple[Any, ...]]) -> pa.Table:
        return pa.Table.from_batches(list(self.batches(rows)), RECORD_SCHEMA)

    def batches(self, rows: list[tuple[Any, ...]]) -> Iterator[pa.RecordBatch]:
        for i in range(0, len(rows), self.batch_records):
            yield records_to_batch(rows[i : i + self.batch_records])

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
