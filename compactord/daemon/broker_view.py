"""What the broker last said of a topic (``BrokerTopic``): its id, offsets and cleanup configs, refreshed by
every monitor pass and at each compaction's end. Reads, the listing and the triggers consult it instead of
asking the broker."""

from __future__ import annotations

from dataclasses import dataclass

from compactord.kafka.identity import LogNow, new_log_reason
from compactord.model import LedgerManifest, PartitionOffsets, TopicConfigs

__all__ = ["BrokerTopic"]

# Strategies that need a key's losers (earlier values, older event times): a broker that compacts the
# topic itself may already have removed them.
_SAFE_UNDER_BROKER_COMPACTION = ("publishing-order",)


@dataclass(frozen=True)
class BrokerTopic:
    """What the broker last said of a topic (refreshed every monitor pass): its id, offsets and cleanup
    configs. Reads use it instead of asking the broker."""

    topic_id: str | None
    offsets: dict[int, PartitionOffsets]
    configs: TopicConfigs
    refreshed_at: float  # when the broker was asked (before its first answer)

    def log_starts(self) -> dict[int, int]:
        return {p: o.log_start for p, o in self.offsets.items()}

    def new_log(self, manifest: LedgerManifest) -> str | None:
        """Why the topic's log is not the one ``manifest``'s ledger was made of, or None. A view older
        than the ledger tells nothing (the run that made it saw the log later)."""
        if self.refreshed_at * 1000 < manifest.finished_at_ms:
            return None
        return new_log_reason(manifest, self.offsets, LogNow(self.topic_id))

    def implicit_max_lag_seconds(self) -> int | None:
        """For a topic the broker compacts itself: half its ``delete.retention.ms``, so that no tombstone
        is cleaned away by the broker before a compaction has seen it."""
        if self.configs.compacted_by_broker and self.configs.delete_retention_ms:
            return max(1, self.configs.delete_retention_ms // 2000)
        return None

    def effective_max_lag(self, configured: int) -> int:
        """The max lag in force (0: none): ``configured``, or ``implicit_max_lag_seconds`` where it is shorter."""
        implicit = self.implicit_max_lag_seconds()
        return implicit if implicit is not None and (configured <= 0 or implicit < configured) else configured

    def warnings(self, strategy: str) -> list[str]:
        if self.configs.compacted_by_broker and strategy not in _SAFE_UNDER_BROKER_COMPACTION:
            return [(f"the broker compacts this topic itself (cleanup.policy={self.configs.cleanup_policy}); "
                     f"the {strategy} strategy needs records the broker's cleaner may already have removed")]
        return []
