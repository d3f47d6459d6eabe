"""``first-value`` (PIP-215 style): a key's first value stays until a tombstone deletes it."""

from __future__ import annotations

from collections.abc import Sequence

from compactord.engine.strategies.rows import ROW_KEY, ROW_VALUE, Row
from compactord.interfaces import CompactionStrategy
from compactord.model import Entry

__all__ = ["FirstValue", "reduce_first_value"]


def reduce_first_value(rows: Sequence[Row]) -> list[int]:
    # Per key: the last tombstone and the first value after it; or, with no tombstone, the first row.
    # Folding these summaries in offset order gives the same result as folding every row.
    tomb: dict[bytes, int] = {}
    first_after: dict[bytes, int] = {}
    first: dict[bytes, int] = {}
    for i, row in enumerate(rows):
        key, value = row[ROW_KEY], row[ROW_VALUE]
        if value is None:  # Kafka's rule; under Pulsar's the reader made empty values null
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


class FirstValue(CompactionStrategy):
    name = "first-value"

    def should_keep_left(self, prev: Entry, cur: Entry) -> bool:
        return not cur.is_tombstone
