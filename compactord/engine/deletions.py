"""The deletion rules a compaction applies to each key's winner, written once for Spark SQL (the grouping
job) and once for Arrow (reading tasks that write their partition's file themselves, ``job.reads_are_final``).
Side by side so that they change together; the engine tests compare the two jobs' ledgers row for row.

- Kafka's rule: a keyed winner with a null value deletes its key (the readers made empty values null
  under Pulsar's rule); an event-time marker is a deletion remembered.
- Key expiry (``compactionKeyTtlMs``, the policy's ``keyTtlMs``): a keyed live winner older than the TTL at
  ``now_ms`` (its timestamp; its event time under ``event-time``) is a deletion too. A missing timestamp
  never expires.
- A deletion is dropped, or where the strategy keeps markers (``StrategyPlan.keeps_deletion_markers``: the
  built-in strategies) kept as a marker (value null, ``marker_at`` the time it first entered a ledger) until
  ``compactionTombstoneRetentionMs`` has passed, as Kafka's cleaner keeps a tombstone for
  ``delete.retention.ms``: a reader of the ledger (the Kafka listener) that had the key from an earlier
  ledger sees its delete, and under ``event-time`` a late record with an older event time cannot bring the
  key back.

Both follow SQL's three-valued logic (Arrow's Kleene kernels): a row whose rule is unknown is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from compactord.ledger.row_groups import kept

__all__ = ["DeletionRules", "deleted_sql"]

_FALSE = pa.scalar(False)
_NULL_BINARY = pa.scalar(None, pa.binary())
_NULL_INT64 = pa.scalar(None, pa.int64())


@dataclass(frozen=True, slots=True)
class DeletionRules:
    now_ms: int  # the instant retention and expiry are measured at (the task's start)
    tombstone_retention_ms: int
    keeps_markers: bool  # a winning deletion stays as a marker (``StrategyPlan.keeps_deletion_markers``)
    key_ttl_ms: int = 0  # 0: keys never expire
    ttl_by_event_time: bool = False  # a key's age is its winner's event time (else its timestamp)

    def to_json(self) -> dict[str, Any]:
        return {"now_ms": self.now_ms, "tombstone_retention_ms": self.tombstone_retention_ms,
                "keeps_markers": self.keeps_markers, "key_ttl_ms": self.key_ttl_ms,
                "ttl_by_event_time": self.ttl_by_event_time}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeletionRules:
        return cls(int(data["now_ms"]), int(data["tombstone_retention_ms"]), bool(data["keeps_markers"]),
                   int(data.get("key_ttl_ms", 0)), bool(data.get("ttl_by_event_time", False)))

    # -- Spark SQL ------------------------------------------------------------------------------

    def apply_sql(self, winners: Any) -> Any:
        """The DataFrame ``winners`` with the rules applied."""
        from pyspark.sql import functions as F

        deleted = deleted_sql() | self._expired_sql()
        if not self.keeps_markers:
            return winners.where(~deleted)
        marker_at = F.coalesce(F.col("marker_at"), F.lit(self.now_ms))
        return (
            winners.withColumn("is_del", deleted)
            .withColumn("marker", F.col("is_del"))
            .withColumn("marker_at", F.when(F.col("is_del"), marker_at).otherwise(F.lit(None).cast("bigint")))
            .withColumn("value", F.when(F.col("is_del"), F.lit(None).cast("binary")).otherwise(F.col("value")))
            .where(~F.col("is_del") | (F.lit(self.now_ms) - F.col("marker_at") < self.tombstone_retention_ms))
            .drop("is_del")
        )

    def _expired_sql(self) -> Any:
        from pyspark.sql import functions as F

        if self.key_ttl_ms <= 0:
            return F.lit(False)
        age_at = F.coalesce(F.col("event_time"), F.col("timestamp")) if self.ttl_by_event_time else F.col("timestamp")
        old = F.col("key").isNotNull() & ~F.coalesce(F.col("marker"), F.lit(False)) \
            & (age_at < F.lit(self.now_ms - self.key_ttl_ms))
        return F.coalesce(old, F.lit(False))

    # -- Arrow ----------------------------------------------------------------------------------

    def apply_arrow(self, table: pa.Table) -> pa.Table:
        """``table`` (``RECORD_SCHEMA``) with the rules applied, row order kept."""
        keyed = pc.is_valid(table["key"])
        deleted = pc.and_kleene(keyed, pc.or_kleene(table["marker"], pc.is_null(table["value"])))
        if self.key_ttl_ms > 0:
            age_at = pc.coalesce(table["event_time"], table["timestamp"]) if self.ttl_by_event_time \
                else table["timestamp"]
            old = pc.and_kleene(pc.and_kleene(keyed, pc.invert(pc.fill_null(table["marker"], _FALSE))),
                                pc.less(age_at, pa.scalar(self.now_ms - self.key_ttl_ms, pa.int64())))
            deleted = pc.or_kleene(deleted, pc.fill_null(old, _FALSE))
        if not self.keeps_markers:
            return kept(table, pc.invert(deleted))
        is_del = pc.fill_null(deleted, _FALSE)  # CASE WHEN: an unknown condition takes the ELSE branch
        marker_at = pc.if_else(is_del, pc.coalesce(table["marker_at"], pa.scalar(self.now_ms, pa.int64())),
                               _NULL_INT64)
        out = (table.set_column(table.schema.get_field_index("marker"), "marker", deleted)
               .set_column(table.schema.get_field_index("marker_at"), "marker_at", marker_at)
               .set_column(table.schema.get_field_index("value"), "value",
                           pc.if_else(is_del, _NULL_BINARY, table["value"])))
        young = pc.less(pc.subtract(pa.scalar(self.now_ms, pa.int64()), marker_at),
                        pa.scalar(self.tombstone_retention_ms, pa.int64()))
        return kept(out, pc.or_kleene(pc.invert(deleted), young))


def deleted_sql() -> Any:
    """A keyed record with a null value, or a marker: a deletion (before expiry)."""
    from pyspark.sql import functions as F

    return F.col("key").isNotNull() & (F.col("marker") | F.col("value").isNull())
