"""Planning one compaction run (in Creating_Raw_Reader): which ledger it builds on, which offsets it
reads, and whether it must rebuild in full."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from compactord.config import Settings
from compactord.engine.kafka_source import OffsetRange, plan_ranges
from compactord.engine.strategies import ResolvedStrategy
from compactord.model import Horizon, LedgerManifest, PartitionOffsets

__all__ = ["CompactionPlan", "plan_compaction"]

log = logging.getLogger(__name__)


@dataclass
class CompactionPlan:
    """What one run reads and builds on; fixed for the whole task."""

    offsets: dict[int, PartitionOffsets]
    full: bool
    ranges: list[OffsetRange]
    previous: LedgerManifest | None
    previous_files: list[str]
    horizon: Horizon
    strategy: ResolvedStrategy
    reasons: list[str] = field(default_factory=list)
    corrupt_id: int | None = None  # a corrupt current ledger this run replaces (deleted after the switch)

    @property
    def tail_records(self) -> int:
        return sum(r.size for r in self.ranges)

    @property
    def ledger_rows(self) -> int:
        return 0 if self.previous is None or self.full else self.previous.records_kept + self.previous.markers

    @property
    def log_start(self) -> dict[int, int]:
        return {p: o.log_start for p, o in self.offsets.items()}

    def nothing_to_do(self, settings: Settings) -> bool:
        """True when the current ledger is already the answer: no new record, no log start moved, no
        partition added, and no event-time marker past its retention."""
        prev = self.previous
        if self.full or prev is None or self.tail_records > 0:
            return False
        if any(o.log_start > prev.log_start.get(p, 0) for p, o in self.offsets.items()):
            return False  # retention moved the log start: entries below it must go
        if set(self.offsets) != set(prev.horizon):
            return False  # partitions were added
        oldest = prev.oldest_marker_at_ms
        return oldest is None or time.time() * 1000 - oldest < settings.compaction_tombstone_retention_ms


def plan_compaction(
    topic: str,
    *,
    offsets: dict[int, PartitionOffsets],
    previous: LedgerManifest | None,
    previous_dir: Path | None,
    strategy: ResolvedStrategy,
    rebuild: bool,
    reasons: list[str],
    cores: int,
    ranges_per_core: int,
    corrupt_id: int | None = None,
) -> CompactionPlan:
    """Decide between an incremental run (ledger + tail after the horizon) and a full rebuild.

    ``reasons`` arrives with what already forces a rebuild (e.g. a corrupt ledger) and leaves with
    every reason found.
    """
    full = previous is None or rebuild
    if rebuild:
        reasons.append("a rebuild was requested")
    if previous is not None and previous.strategy != strategy.settings:
        full = True
        reasons.append(f"the strategy settings changed from {previous.strategy} to {strategy.settings}")
    if previous is not None:
        for p, old in previous.horizon.items():
            if p in offsets and offsets[p].end - 1 < old:
                full = True
                reasons.append(f"partition {p} now ends at {offsets[p].end} below the horizon {old} "
                               "(topic recreated or truncated)")
    if full and reasons:
        log.warning("topic %s: full rebuild because %s", topic, "; ".join(reasons))
    incremental = previous is not None and not full
    ranges = []
    for p, o in sorted(offsets.items()):
        start = max(previous.horizon.get(p, -1) + 1, o.log_start) if incremental and previous else o.log_start
        ranges.append(OffsetRange(p, start, o.end))
    split = plan_ranges(ranges, cores, ranges_per_core)
    files = [str(previous_dir / f["name"]) for f in previous.files] if incremental and previous and previous_dir \
        else []
    horizon = {p: o.end - 1 for p, o in offsets.items()}
    if incremental and previous is not None:
        horizon = {p: max(h, previous.horizon.get(p, -1)) for p, h in horizon.items()}
    return CompactionPlan(offsets, full, split, previous, files, horizon, strategy, reasons, corrupt_id)
