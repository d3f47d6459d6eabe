"""``publishing-order`` (the default): the highest offset wins (Pulsar's PublishingOrderCompactor)."""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any, ClassVar

from compactord.engine.strategies.rows import ROW_KEY, Row
from compactord.interfaces import OrderedCompactionStrategy
from compactord.model import Entry

__all__ = ["PublishingOrder", "reduce_last_offset"]


def reduce_last_offset(rows: Sequence[Row]) -> list[int]:
    # A dict built in C from (key, index) pairs keeps each key's last index: a third of the time of a
    # Python loop over the rows, which was the reader's largest cost after the client's own.
    return sorted(dict(zip(map(itemgetter(ROW_KEY), rows), range(len(rows)))).values())


class PublishingOrder(OrderedCompactionStrategy):
    name = "publishing-order"
    sql_order: ClassVar[str | None] = "offset"

    def order_key(self, record: Entry) -> tuple[Any, ...]:
        return (record.offset,)
