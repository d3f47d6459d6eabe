"""A strategy plug-in whose every decision fails: a compaction that uses it on a topic with a repeated key
ends in Failed (as a real plug-in bug would, inside Spark's workers)."""

from __future__ import annotations

from compactord.interfaces import CompactionStrategy
from compactord.model import Entry


class FailingOrder(CompactionStrategy):
    name = "failing"

    def should_keep_left(self, prev: Entry, cur: Entry) -> bool:
        raise RuntimeError("FailingOrder fails on purpose (a test plug-in)")
