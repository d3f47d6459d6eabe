"""Planning one compaction run (in Creating_Raw_Reader): which ledger it builds on, which offsets it
reads, and whether it must rebuild in full."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from compactord.config import Settings
from compactord.engine.job import reads_are_final
from compactord.engine.kafka_source import OffsetRange, plan_ranges
from compactord.engine.strategies import ResolvedStrategy, plan_for
from compactord.kafka.identity import LogNow, new_log_reason
from compactord.ledger.row_groups import FileFacts
from compactord.model import Horizon, LedgerManifest, PartitionOffsets, RecordFingerprint

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
    topic_id: str | None = None
    recreated: bool = False  # the log is a new one (the topic was deleted and recreated)

    @property
    def previous_facts(self) -> dict[str, FileFacts]:
        """Each of ``previous_files``' size and CRC-32C as the previous ledger's manifest lists them."""
        if not self.previous_files or self.previous is None:
            return {}
        by_name = {f["name"]: (f.get("bytes"), f.get("crc32c")) for f in self.previous.files}
        return {path: by_name[path.rpartition("/")[2]] for path in self.previous_files}

    def fingerprints_after(self, read: Mapping[int, RecordFingerprint]) -> dict[int, RecordFingerprint]:
        """The new ledger's fingerprints: per partition, the last data record this run read, else (an
        incremental run that read nothing there) the previous ledger's."""
        kept = dict(self.previous.fingerprints or {}) if self.previous is not None and not self.full else {}
        kept.update(read)
        return {p: f for p, f in kept.items() if p in self.offsets}

    @property
    def tail_records(self) -> int:
        return sum(r.size for r in self.ranges)

    @property
    def ledger_rows(self) -> int:
        return 0 if self.previous is None or self.full else self.previous.records_kept + self.previous.markers

    @property
    def log_start(self) -> dict[int, int]:
        return {p: o.log_start for p, o in self.offsets.items()}

    def nothing_to_do(self, settings: Settings, key_ttl_ms: int = 0) -> bool:
        """True when the current ledger is already the answer: no new record, no log start moved, no
        partition added, no event-time marker past its retention, and no key that may have expired
        (with a key TTL, a ledger with live entries is always read again: it records no ages)."""
        prev = self.previous
        if self.full or prev is None or self.tail_records > 0:
            return False
        if any(o.log_start > prev.log_start.get(p, 0) for p, o in self.offsets.items()):
            return False  # retention moved the log start: entries below it must go
        if set(self.offsets) != set(prev.horizon):
            return False  # partitions were added
        if key_ttl_ms > 0 and prev.records_kept > 0:
            return False
        oldest = prev.oldest_marker_at_ms
        return oldest is None or time.time() * 1000 - oldest < settings.compaction_tombstone_retention_ms


def plan_compaction(
    topic: str,
    *,
    offsets: dict[int, PartitionOffsets],
    previous: LedgerManifest | None,
    previous_dir: str | Path | None,  # the previous ledger's folder: a key prefix of the root (or a local path)
    strategy: ResolvedStrategy,
    rebuild: bool,
    reasons: list[str],
    cores: int,
    ranges_per_core: int,
    corrupt_id: int | None = None,
    log_now: LogNow | None = None,
    first_offsets: Mapping[int, int] | None = None,
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
        before, now = previous.strategy.rules(), strategy.settings.rules()
        changed = ", ".join(f"{k} {before[k]} -> {now[k]}" for k in now if before.get(k) != now[k])
        reasons.append(f"the strategy settings changed ({changed})")
    log_now = log_now or LogNow(previous.topic_id if previous else None)
    recreated = new_log_reason(previous, offsets, log_now) if previous is not None else None
    if recreated is not None:
        full = True
        reasons.append(recreated)
    elif previous is not None and not full and plan_for(strategy.strategy).needs_losers:
        # Retention removed entries the ledger holds: the winner among what the log still holds may be
        # a record the ledger dropped as a loser, so only a read of the log can find it.
        passed = sorted(p for p, first in (first_offsets or {}).items() if p in offsets and first < offsets[p].log_start)
        if passed:
            full = True
            reasons.append(f"the log start moved past ledger entries in partitions {passed}, and the "
                           f"{strategy.settings.strategy} strategy chooses among the records the log still holds")
    if previous is not None and recreated is None and (unknown := _unconfirmed_below(previous, offsets)):
        log.warning("topic %s: no read confirmed the ends of partitions %s, listed below the horizon: they are "
                    "taken as unknown, not as a new log", topic, unknown)
    if full and reasons:
        log.warning("topic %s: full rebuild because %s", topic, "; ".join(reasons))
    incremental = previous is not None and not full
    ranges = []
    for p, o in sorted(offsets.items()):
        start = max(previous.horizon.get(p, -1) + 1, o.log_start) if incremental and previous else o.log_start
        ranges.append(OffsetRange(p, start, o.end))
    files = [f"{previous_dir}/{f['name']}" for f in previous.files] if incremental and previous and previous_dir \
        else []
    split = plan_ranges(ranges, cores, ranges_per_core,
                        whole_partitions=reads_are_final(strategy.strategy, [r for r in ranges if r.size > 0], files,
                                                         {p: o.log_start for p, o in offsets.items()},
                                                         retain_null_key=strategy.settings.retain_null_key))
    horizon = {p: o.end - 1 for p, o in offsets.items()}
    if incremental and previous is not None:
        horizon = {p: max(h, previous.horizon.get(p, -1)) for p, h in horizon.items()}
    return CompactionPlan(offsets, full, split, previous, files, horizon, strategy, reasons, corrupt_id,
                          log_now.topic_id, recreated is not None)


def _unconfirmed_below(previous: LedgerManifest, offsets: Mapping[int, PartitionOffsets]) -> list[int]:
    """The partitions whose end, below ``previous``'s horizon, no read confirmed (``PartitionOffsets.end_confirmed``)."""
    return sorted(p for p, o in offsets.items() if not o.end_confirmed and o.end - 1 < previous.horizon.get(p, -1))
