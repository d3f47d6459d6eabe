"""The built-in strategies, event-time extraction, and the per-range reducers used by the reader.

- ``publishing-order`` (default): the highest offset wins (Pulsar's PublishingOrderCompactor).
- ``event-time`` (PIP-352, KIP-280): the highest (has event time, event time, offset) wins.
- ``first-value`` (PIP-215 style): a key's first value stays until a tombstone deletes it.
- ``module:Class``: a ``CompactionStrategy`` subclass of the operator's.

A reducer takes the rows one reading task read, in offset order, and returns the indexes of the rows
that Spark still needs: for an order, each key's best row; for first-value, at most two rows per key;
for a general custom strategy, every row. Null-key rows are never passed to a reducer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from compactord.errors import ConfigError, PluginLoadError
from compactord.interfaces import CompactionStrategy, OrderedCompactionStrategy
from compactord.model import Entry
from compactord.refs import resolve_ref

__all__ = [
    "BUILTIN_STRATEGIES",
    "EventTimeOrder",
    "FirstValue",
    "PublishingOrder",
    "event_time_extractor",
    "load_strategy",
    "reducer_for",
]

# Row layout the reader hands to reducers: (partition, offset, timestamp, key, value, headers, event_time)
ROW_OFFSET, ROW_KEY, ROW_VALUE, ROW_EVENT_TIME = 1, 3, 4, 6
Reducer = Callable[[Sequence[tuple[Any, ...]]], list[int]]


class PublishingOrder(OrderedCompactionStrategy):
    name = "publishing-order"
    #: Spark SQL expression of the order, so that Spark picks winners natively (``max_by``).
    sql_order: ClassVar[str | None] = "offset"

    def order_key(self, record: Entry) -> tuple[Any, ...]:
        return (record.offset,)


class EventTimeOrder(OrderedCompactionStrategy):
    """A record without an event time never replaces one that has it; ties go to the higher offset."""

    name = "event-time"
    sql_order: ClassVar[str | None] = (
        "named_struct('has', event_time IS NOT NULL, 'et', coalesce(event_time, 0L), 'off', offset)"
    )

    def order_key(self, record: Entry) -> tuple[Any, ...]:
        et = record.event_time
        return (et is not None, et if et is not None else 0, record.offset)


class FirstValue(CompactionStrategy):
    name = "first-value"

    def should_keep_left(self, prev: Entry, cur: Entry) -> bool:
        return not cur.is_tombstone


BUILTIN_STRATEGIES: dict[str, type[CompactionStrategy]] = {
    PublishingOrder.name: PublishingOrder,
    EventTimeOrder.name: EventTimeOrder,
    FirstValue.name: FirstValue,
}


def load_strategy(value: str, key: str = "compactionStrategy") -> CompactionStrategy:
    """A strategy from its built-in name or a ``module:Class`` reference.

    :raises ConfigError: neither a built-in name nor a resolvable ``CompactionStrategy`` subclass.
    """
    if value in BUILTIN_STRATEGIES:
        return BUILTIN_STRATEGIES[value]()
    if ":" not in value and "." not in value:
        raise ConfigError(
            key, value, f"use one of {', '.join(BUILTIN_STRATEGIES)} or a 'module:Class' reference"
        )
    cls = resolve_ref(key, value)
    if not (isinstance(cls, type) and issubclass(cls, CompactionStrategy)):
        raise PluginLoadError(key, value, "the class must subclass compactord.interfaces.CompactionStrategy")
    try:
        return cls()
    except Exception as exc:
        raise PluginLoadError(key, value, f"the class cannot be instantiated without arguments ({exc})") from exc


def strategy_name(strategy: CompactionStrategy, configured: str) -> str:
    """The name recorded in manifests: the built-in name, or the configured reference."""
    return strategy.name if configured in BUILTIN_STRATEGIES else configured


# -- event time -------------------------------------------------------------------------------------

_DECIMAL = re.compile(rb"-?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def parse_event_time_header(value: bytes | None) -> int | None:
    """ASCII digits (optional leading '-') are decimal; else exactly 8 bytes are a big-endian signed
    long; anything else means no event time."""
    if value is None:
        return None
    if _DECIMAL.fullmatch(value):
        number = int(value)
        return number if _INT64_MIN <= number <= _INT64_MAX else None
    if len(value) == 8:
        return int.from_bytes(value, "big", signed=True)
    return None


def validate_event_time_source(value: str, key: str = "compactionEventTimeSource") -> str:
    if value == "timestamp":
        return value
    if value.startswith("header:") and len(value) > len("header:"):
        return value
    raise ConfigError(key, value, "use 'timestamp' or 'header:NAME' (a non-empty header name)")


def event_time_extractor(source: str) -> Callable[[int | None, Sequence[tuple[str, bytes]]], int | None]:
    """``f(timestamp, headers) -> event time or None`` for ``compactionEventTimeSource``.

    A negative or missing timestamp means none; a missing header does not fall back to the timestamp;
    of duplicate headers the last counts.
    """
    validate_event_time_source(source)
    if source == "timestamp":

        def from_timestamp(timestamp: int | None, headers: Sequence[tuple[str, bytes]]) -> int | None:
            return timestamp if timestamp is not None and timestamp >= 0 else None

        return from_timestamp

    name = source[len("header:") :]

    def from_header(timestamp: int | None, headers: Sequence[tuple[str, bytes]]) -> int | None:
        found = None
        seen = False
        for hkey, hvalue in headers:
            if hkey == name:
                found, seen = hvalue, True
        return parse_event_time_header(found) if seen else None

    return from_header


# -- reducers ---------------------------------------------------------------------------------------


def _reduce_last_offset(rows: Sequence[tuple[Any, ...]]) -> list[int]:
    last: dict[bytes, int] = {}
    for i, row in enumerate(rows):
        last[row[ROW_KEY]] = i
    return sorted(last.values())


def _reduce_event_time(rows: Sequence[tuple[Any, ...]]) -> list[int]:
    best: dict[bytes, tuple[bool, int, int]] = {}
    where: dict[bytes, int] = {}
    for i, row in enumerate(rows):
        et = row[ROW_EVENT_TIME]
        rank = (et is not None, et if et is not None else 0, row[ROW_OFFSET])
        key = row[ROW_KEY]
        if key not in best or rank > best[key]:
            best[key] = rank
            where[key] = i
    return sorted(where.values())


def _reduce_first_value(rows: Sequence[tuple[Any, ...]]) -> list[int]:
    # Per key: the last tombstone and the first value after it; or, with no tombstone, the first row.
    # Folding these summaries in offset order gives the same result as folding every row.
    tomb: dict[bytes, int] = {}
    first_after: dict[bytes, int] = {}
    first: dict[bytes, int] = {}
    for i, row in enumerate(rows):
        key, value = row[ROW_KEY], row[ROW_VALUE]
        if not value:
            tomb[key] = i
            first_after.pop(key, None)
        else:
            first.setdefault(key, i)
            if key in tomb:
                first_after.setdefault(key, i)
    keep = [first[k] for k in first if k not in tomb]
    keep.extend(tomb.values())
    keep.extend(first_after.values())
    return sorted(keep)


def _reduce_custom_order(strategy: OrderedCompactionStrategy) -> Reducer:
    def reduce(rows: Sequence[tuple[Any, ...]]) -> list[int]:
        best: dict[bytes, tuple[Any, int]] = {}
        for i, row in enumerate(rows):
            rank = strategy.order_key(row_entry(row))
            key = row[ROW_KEY]
            if key not in best or rank > best[key][0]:
                best[key] = (rank, i)
        return sorted(i for _, i in best.values())

    return reduce


def _keep_all(rows: Sequence[tuple[Any, ...]]) -> list[int]:
    return list(range(len(rows)))


def reducer_for(strategy: CompactionStrategy) -> Reducer:
    if type(strategy) is PublishingOrder:
        return _reduce_last_offset
    if type(strategy) is EventTimeOrder:
        return _reduce_event_time
    if type(strategy) is FirstValue:
        return _reduce_first_value
    if isinstance(strategy, OrderedCompactionStrategy):
        return _reduce_custom_order(strategy)
    return _keep_all


def row_entry(row: tuple[Any, ...]) -> Entry:
    partition, offset, timestamp, key, value, headers, event_time = row[:7]
    return Entry(
        partition=partition,
        offset=offset,
        key=key,
        value=value,
        timestamp=timestamp,
        headers=tuple(headers or ()),
        event_time=event_time,
    )


def fold(strategy: CompactionStrategy, records: Sequence[Entry]) -> Entry | None:
    """The winner of one key's records, in offset order; None if the key ends deleted.

    For an ordered strategy a winning tombstone is returned (the caller turns it into a deletion or a
    marker); for a general strategy a deletion returns None.
    """
    if isinstance(strategy, OrderedCompactionStrategy):
        return max(records, key=strategy.order_key) if records else None
    kept: Entry | None = None
    for cur in records:
        if kept is None or not strategy.should_keep_left(kept, cur):
            kept = None if cur.is_tombstone else cur
    return kept
