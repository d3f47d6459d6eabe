"""The log's identity: whether the broker's log of a topic is the one a ledger was made of.

A topic deleted and created again under its name (Apache Kafka calls no hook) is a new log. What tells
it apart, strongest first: the broker's topic id (Metadata v10+), the offsets (a partition that now ends
below the ledger's horizon, where a read confirmed that end, or starts below the log start the ledger recorded: a log start never moves
back; a partition gone), and, where a run reads them, the records the ledger fingerprinted. The planning
of a run, the monitor, the read paths of the daemon and ``CompactedReader`` all ask ``new_log_reason``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from compactord.model import LedgerManifest, PartitionOffsets, RecordFingerprint

__all__ = ["LedgerIdentity", "LogNow", "new_log_reason"]


@dataclass(frozen=True, slots=True)
class LedgerIdentity:
    """What a ledger records of the log it was made of."""

    topic_id: str | None  # None: the broker reported none (or a manifest written before it was recorded)
    horizon: Mapping[int, int]
    log_start: Mapping[int, int] = field(default_factory=dict)
    fingerprints: Mapping[int, RecordFingerprint] = field(default_factory=dict)

    @classmethod
    def of(cls, manifest: LedgerManifest) -> LedgerIdentity:
        return cls(manifest.topic_id, manifest.horizon, manifest.log_start, manifest.fingerprints or {})


@dataclass(frozen=True, slots=True)
class LogNow:
    """What the broker says of the log now, to tell it from the one a ledger was made of."""

    topic_id: str | None
    # Per fingerprinted partition: the first data record at or after the fingerprint's offset now.
    found: Mapping[int, RecordFingerprint | None] = field(default_factory=dict)


def new_log_reason(previous: LedgerManifest | LedgerIdentity, offsets: Mapping[int, PartitionOffsets],
                   now: LogNow) -> str | None:
    """Why the log is not the one ``previous`` was made of (the topic was recreated), or None.

    A topic id is compared only where both sides have one. An end no read confirmed (``end_confirmed``) is
    unknown, not evidence: a broker may list an end below its last record. A log start above the ledger's,
    even past its horizon, is retention, not a new log. A fingerprinted record that is simply gone
    (retention, or the broker's own cleaner) with the same topic id is not a new log.
    """
    ledger = previous if isinstance(previous, LedgerIdentity) else LedgerIdentity.of(previous)
    if ledger.topic_id and now.topic_id and ledger.topic_id != now.topic_id:
        return f"the topic id changed from {ledger.topic_id} to {now.topic_id} (topic recreated)"
    for p, old in sorted(ledger.horizon.items()):
        if p in offsets and offsets[p].end_confirmed and offsets[p].end - 1 < old:
            return f"partition {p} now ends at {offsets[p].end}, below the horizon {old} (topic recreated or truncated)"
    for p, start in sorted(ledger.log_start.items()):
        if p in offsets and offsets[p].log_start < start:
            return (f"partition {p} now starts at {offsets[p].log_start}, below the log start {start} the ledger "
                    "was made from (topic recreated)")
    gone = sorted(set(ledger.horizon) - set(offsets))
    if gone:
        return f"partitions {gone} no longer exist (topic recreated with fewer partitions)"
    for p, fingerprint in sorted(ledger.fingerprints.items()):
        found = now.found.get(p)
        if found is not None and found.offset == fingerprint.offset and found != fingerprint:
            return f"partition {p}: the record at offset {fingerprint.offset} is not the one compacted (topic recreated)"
    return None
