"""Custom strategies loaded by reference (``tests.inprocess.engine.strategies:Name``) inside Spark's
workers."""

from __future__ import annotations

from typing import Any

from compactord.engine.strategies import FirstValue
from compactord.interfaces import CompactionStrategy, OrderedCompactionStrategy
from compactord.model import Entry


class Exploding(CompactionStrategy):
    """Fails inside the Spark job (to test that a failed task changes nothing)."""

    def should_keep_left(self, prev: Entry, cur: Entry) -> bool:
        raise RuntimeError("the Exploding strategy exploded on purpose")


class NumericMax(OrderedCompactionStrategy):
    """Keeps the numerically largest value of a key (Pulsar's testNumericOrderCompaction)."""

    def order_key(self, record: Entry) -> tuple[Any, ...]:
        number = int(record.value) if record.value else -1
        return (number, record.offset)


class LongestValue(CompactionStrategy):
    """General form: a new value replaces the kept one only if it is longer."""

    def should_keep_left(self, prev: Entry, cur: Entry) -> bool:
        return not cur.is_tombstone and len(prev.value or b"") >= len(cur.value or b"")


class LastValueWins(FirstValue):
    """A plug-in subclass of a built-in that changes its fold: the built-in's shortcuts must not apply."""

    def should_keep_left(self, prev: Entry, cur: Entry) -> bool:
        return False
