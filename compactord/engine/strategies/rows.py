"""The row layout the Kafka reader builds and hands to the reducers, named once.

A row is a plain tuple (built in C by ``zip`` in the reader: a class per row would cost more than the
reduction saves): ``(partition, offset, timestamp, key, value, headers, event_time)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from compactord.model import Entry

__all__ = ["ROW_FIELDS", "Reducer", "Row", "row_entry"]

ROW_FIELDS = ("partition", "offset", "timestamp", "key", "value", "headers", "event_time")
ROW_PARTITION, ROW_OFFSET, ROW_TIMESTAMP, ROW_KEY, ROW_VALUE, ROW_HEADERS, ROW_EVENT_TIME = range(len(ROW_FIELDS))

Row = tuple[Any, ...]
#: Takes one reading task's rows in offset order; returns the indexes of the rows Spark still needs.
Reducer = Callable[[Sequence[Row]], list[int]]


def row_entry(row: Row) -> Entry:
    partition, offset, timestamp, key, value, headers, event_time = row[: len(ROW_FIELDS)]
    return Entry(
        partition=partition,
        offset=offset,
        key=key,
        value=value,
        timestamp=timestamp,
        headers=tuple(headers or ()),
        event_time=event_time,
    )
