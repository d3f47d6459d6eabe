"""``event-time`` (PIP-352, KIP-280): the highest (has event time, event time, offset) wins.

The rules themselves (sources, parsing, rank) are ``compactord.event_time``; this is the strategy and
its reducer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from compactord.engine.strategies.rows import ROW_EVENT_TIME, ROW_KEY, ROW_OFFSET, Row
from compactord.event_time import event_time_rank
from compactord.interfaces import OrderedCompactionStrategy
from compactord.model import Entry

__all__ = ["EventTimeOrder", "reduce_event_time"]


def reduce_event_time(rows: Sequence[Row]) -> list[int]:
    best: dict[bytes, tuple[bool, int, int]] = {}
    where: dict[bytes, int] = {}
    for i, row in enumerate(rows):
        rank = event_time_rank(row[ROW_EVENT_TIME], row[ROW_OFFSET])
        key = row[ROW_KEY]
        if key not in best or rank > best[key]:
            best[key] = rank
            where[key] = i
    return sorted(where.values())


class EventTimeOrder(OrderedCompactionStrategy):
    """A record without an event time never replaces one that has it; ties go to the higher offset."""

    name = "event-time"
    sql_order: ClassVar[str | None] = (
        "named_struct('has', event_time IS NOT NULL, 'et', coalesce(event_time, 0L), 'off', offset)"
    )

    def order_key(self, record: Entry) -> tuple[Any, ...]:
        return event_time_rank(record.event_time, record.offset)
