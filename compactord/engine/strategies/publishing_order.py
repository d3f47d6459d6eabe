"""``publishing-order`` (the default): the highest offset wins (Pulsar's PublishingOrderCompactor)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from compactord.engine.strategies.rows import ROW_KEY, Row
from compactord.interfaces import OrderedCompactionStrategy
from compactord.model import Entry

__all__ = ["PublishingOrder", "reduce_last_offset"]


def reduce_last_offset(rows: Sequence[Row]) -> list[int]:
    last: dict[bytes, int] = {}
    for i, row in enumerate(rows):
        last[row[ROW_KEY]] = i
    return sorted(last.values())


class PublishingOrder(OrderedCompactionStrategy):
    name = "publishing-order"
    sql_order: ClassVar[str | None] = "offset"

    def order_key(self, record: Entry) -> tuple[Any, ...]:
        return (record.offset,)
