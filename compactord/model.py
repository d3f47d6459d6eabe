"""Plain data shared by every layer: positions, entries, the record schema, manifests, topic names."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import pyarrow as pa

from compactord.errors import InvalidTopicName

__all__ = [
    "RECORD_SCHEMA",
    "CompactedPage",
    "CompactedRows",
    "Entry",
    "Horizon",
    "LedgerManifest",
    "PartitionOffsets",
    "Position",
    "RecordFingerprint",
    "StrategySettings",
    "TopicConfigs",
    "entries_table",
    "iso_utc",
    "validate_topic_name",
]

# Kafka's own rule (kafka.common.internals.Topic): legal characters, at most 249, not "." or "..".
MAX_TOPIC_LENGTH = 249
TOPIC_PATTERN = r"^[a-zA-Z0-9._-]{1,249}$"  # and not "." or ".."
_TOPIC_RE = re.compile(TOPIC_PATTERN)


def validate_topic_name(topic: object) -> str:
    """Return ``topic`` if it is a legal Kafka topic name, else raise ``InvalidTopicName``.

    Called before a name touches the file system or the broker.
    """
    if not isinstance(topic, str) or not topic:
        raise InvalidTopicName("topic name must be a non-empty string of 1 to 249 characters [a-zA-Z0-9._-]")
    if len(topic) > MAX_TOPIC_LENGTH:
        raise InvalidTopicName(
            f"topic name is {len(topic)} characters long; at most {MAX_TOPIC_LENGTH} are allowed"
        )
    if topic in (".", ".."):
        raise InvalidTopicName(f"topic name {topic!r} is not allowed ('.' and '..' are reserved)")
    if not _TOPIC_RE.fullmatch(topic):
        raise InvalidTopicName(
            f"topic name {topic!r} has a character outside [a-zA-Z0-9._-] (ASCII letters, digits, '.', '_', '-')"
        )
    return topic


def iso_utc(ts: float | None) -> str | None:
    """``ts`` (seconds since the epoch) as ISO 8601 UTC with milliseconds, e.g. ``2026-11-23T09:28:44.123Z``.

    The one timestamp format of the API, the status objects and the JSON log; ``None`` stays ``None``.
    """
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}Z"


class Position(NamedTuple):
    """A place in a topic: a partition and an offset in it."""

    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """What the broker says of one partition: its log start and committed end, fixed at one time."""

    partition: int
    log_start: int
    end: int  # exclusive: the last stable offset
    # False: ``end`` is the broker's listed end (ListOffsets), which the read meant to confirm it did not
    # reach; it may be below the true end (the test broker lists one), so it tells nothing of the log's identity.
    end_confirmed: bool = True

    @property
    def records(self) -> int:
        return max(0, self.end - self.log_start)


@dataclass(frozen=True, slots=True)
class TopicConfigs:
    """The source topic's cleanup configs as the broker describes them (None: the broker did not say)."""

    cleanup_policy: str | None = None
    delete_retention_ms: int | None = None
    min_compaction_lag_ms: int | None = None
    retention_ms: int | None = None

    @property
    def known(self) -> bool:
        return self.cleanup_policy is not None

    @property
    def compacted_by_broker(self) -> bool | None:
        """True when the broker's own cleaner compacts the topic (``cleanup.policy`` has ``compact``)."""
        return None if self.cleanup_policy is None else "compact" in self.cleanup_policy.split(",")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "compacted_by_broker": self.compacted_by_broker}


# Per partition, the last offset a ledger covers (-1 for a partition that never had records).
Horizon = dict[int, int]

_HEADER = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])

# One schema for records read from Kafka and for ledger rows. ``marker`` rows are deletions remembered
# under the event-time strategy; ``marker_at`` is when the marker first entered a ledger (epoch ms).
# Spelled exactly as Spark's Arrow conversion expects it (every field nullable, list items named
# "element"): the Kafka data source's batches are checked against it.
RECORD_SCHEMA = pa.schema(
    [
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.int64()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", pa.list_(pa.field("element", _HEADER))),
        pa.field("event_time", pa.int64()),
        pa.field("marker", pa.bool_()),
        pa.field("marker_at", pa.int64()),
    ]
)


@dataclass(frozen=True, slots=True)
class Entry:
    """One record: from the topic, or kept in a compacted ledger with its original offset."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    event_time: int | None = None
    marker: bool = False
    marker_at: int | None = None

    @property
    def raw_bytes(self) -> int:
        """The bytes of its key, value and header keys and values, as stored (before any encoding)."""
        return (len(self.key or b"") + len(self.value or b"")
                + sum(len(k.encode()) + len(v or b"") for k, v in self.headers))

    @property
    def is_tombstone(self) -> bool:
        """Kafka's rule: a keyed record with a null value deletes its key; an empty value is a value, and
        a null-key record never deletes. (Pulsar's rule, ``compactionEmptyValueIsTombstone``, is applied
        where records enter: the readers turn an empty value into a null one.)"""
        return self.key is not None and self.value is None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Entry:
        headers = tuple((h["key"], h["value"]) for h in (row.get("headers") or ()))
        return cls(
            partition=row["partition"],
            offset=row["offset"],
            key=row["key"],
            value=row["value"],
            timestamp=row.get("timestamp"),
            headers=headers,
            event_time=row.get("event_time"),
            marker=bool(row.get("marker", False)),
            marker_at=row.get("marker_at"),
        )


@dataclass(frozen=True, slots=True)
class StrategySettings:
    """What decides the winners; a ledger written under other settings is rebuilt in full."""

    strategy: str = "publishing-order"
    event_time_source: str = "timestamp"
    retain_null_key: bool = False
    # Pulsar's rule (an empty value deletes) instead of Kafka's. A manifest written before the rule was
    # a setting has no such field and was written under Pulsar's rule: it reads as True.
    empty_value_is_tombstone: bool = False

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StrategySettings:
        return cls(**{"empty_value_is_tombstone": True, **data})

    def rules(self) -> dict[str, Any]:
        """The rules a ledger was written under, as the read API and ``CompactedReader`` report them."""
        return {
            "strategy": self.strategy,
            "event_time_source": self.event_time_source,
            "empty_value_is_tombstone": self.empty_value_is_tombstone,
            "retain_null_key": self.retain_null_key,
        }


@dataclass(frozen=True, slots=True)
class RecordFingerprint:
    """One record of a partition, recognisable again: its offset, timestamp and a CRC-32C of its key and
    value. The last data record below a ledger's horizon tells the same log from a recreated one."""

    offset: int
    timestamp: int
    crc: int

    @classmethod
    def of(cls, offset: int, timestamp: int | None, key: bytes | None, value: bytes | None) -> RecordFingerprint:
        import crc32c

        crc = 0
        for part in (key, value):  # a null and an empty part differ: each is framed by its length
            frame = b"\xff\xff\xff\xff" if part is None else len(part).to_bytes(4, "big")
            crc = crc32c.crc32c(part or b"", crc32c.crc32c(frame, crc))
        return cls(int(offset), -1 if timestamp is None else int(timestamp), crc)

    def to_json(self) -> list[int]:
        return [self.offset, self.timestamp, self.crc]

    @classmethod
    def from_json(cls, data: Sequence[int]) -> RecordFingerprint:
        offset, timestamp, crc = data
        return cls(int(offset), int(timestamp), int(crc))


@dataclass(slots=True)
class LedgerManifest:
    """``manifest.json`` of a ledger: what it covers and how it was made."""

    ledger_id: int
    topic: str
    horizon: Horizon
    strategy: StrategySettings
    files: list[dict[str, Any]]  # {"name", "bytes", "crc32c"}
    records_read: int = 0
    records_kept: int = 0  # live entries (markers not counted)
    markers: int = 0
    removed: int = 0
    bytes: int = 0
    created_at_ms: int = 0
    started_at_ms: int = 0
    finished_at_ms: int = 0
    full_rebuild: bool = True
    log_start: dict[int, int] = field(default_factory=dict)
    oldest_marker_at_ms: int | None = None  # event-time markers: when the oldest entered a ledger
    timings: dict[str, float] = field(default_factory=dict)
    format_version: int = 1
    # The log's identity (None in a manifest written before it was recorded): the broker's topic id
    # where it reports one, and per partition the last data record below the horizon.
    topic_id: str | None = None
    fingerprints: dict[int, RecordFingerprint] | None = None
    key_ttl_ms: int = 0  # the key expiry the ledger was written under (0: off)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["horizon"] = {str(p): o for p, o in sorted(self.horizon.items())}
        data["log_start"] = {str(p): o for p, o in sorted(self.log_start.items())}
        if self.fingerprints is not None:
            data["fingerprints"] = {str(p): f.to_json() for p, f in sorted(self.fingerprints.items())}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LedgerManifest:
        data = dict(data)
        data["horizon"] = {int(p): int(o) for p, o in data["horizon"].items()}
        data["log_start"] = {int(p): int(o) for p, o in data.get("log_start", {}).items()}
        data["strategy"] = StrategySettings.from_json(data["strategy"])
        if data.get("fingerprints") is not None:
            data["fingerprints"] = {int(p): RecordFingerprint.from_json(f) for p, f in data["fingerprints"].items()}
        return cls(**data)

# The same schema as Spark DDL (every field nullable on the Spark side).
RECORD_DDL = (
    "partition int, offset bigint, timestamp bigint, key binary, value binary, "
    "headers array<struct<key:string,value:binary>>, event_time bigint, marker boolean, marker_at bigint"
)


@dataclass(frozen=True, slots=True)
class CompactedPage:
    """Entries read from one ledger, with that ledger's manifest (its id and horizon belong to them)."""

    ledger: LedgerManifest
    entries: list[Entry]
    truncated: bool = False  # a byte budget ended the page before ``n`` entries: more may follow


@dataclass(frozen=True, slots=True)
class CompactedRows:
    """A ``CompactedPage``'s entries as Arrow columns (``RECORD_SCHEMA``'s; a ledger's files may lack the later
    ones), no row a Python object, with that ledger's manifest."""

    ledger: LedgerManifest
    rows: pa.Table
    truncated: bool = False


def entries_table(entries: Sequence[Entry]) -> pa.Table:
    """``entries`` as a table of ``RECORD_SCHEMA``."""
    return pa.Table.from_pylist([
        {"partition": e.partition, "offset": e.offset, "timestamp": e.timestamp, "key": e.key, "value": e.value,
         "headers": [{"key": k, "value": v} for k, v in e.headers], "event_time": e.event_time,
         "marker": e.marker, "marker_at": e.marker_at} for e in entries], schema=RECORD_SCHEMA)
