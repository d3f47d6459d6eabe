"""Per-topic state kept under the ledger root: compaction policies and the "unloaded" mark.

``<root>/<topic>/policies.json`` overrides the broker-wide thresholds and the strategy for one topic
(Pulsar's topic-level compaction threshold); ``<root>/<topic>/UNLOADED`` makes the backlog monitor
skip a topic that moved to another broker, until it is loaded again or compacted by hand.

Both are read once per topic, when first needed, and then kept as this daemon writes them: it is the only
writer of its root (the local root's lock, the object store's lease), so the monitor's pass asks the store
nothing for them. A policies file that cannot be used is not kept: it is read again at each use, so that a
repaired file is seen.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Collection
from dataclasses import asdict, dataclass, fields
from typing import Any

from compactord.config import Settings
from compactord.errors import InvalidArgument, ObjectNotFound, PoliciesUnreadable
from compactord.ledger import layout
from compactord.ledger.layout import POLICIES, UNLOADED

__all__ = ["WHOLE_NUMBER_RANGES", "PolicyStore", "TopicPolicies"]


_INT64_MAX = 2**63 - 1
_CENTURY_S = 100 * 365 * 86_400
# Each whole-number field's range (0 = off), listed in docs/http-api.md: where a value stops meaning anything,
# well inside what a run computes with (signed 64-bit numbers in Spark and Arrow, floats in the throttle).
WHOLE_NUMBER_RANGES: dict[str, tuple[int, int]] = {
    "thresholdBytes": (0, _INT64_MAX),
    "thresholdMessages": (0, _INT64_MAX),
    "maxLagSeconds": (0, _CENTURY_S),
    "keyTtlMs": (0, _CENTURY_S * 1000),  # the run's instant minus the TTL stays a timestamp
    "maxReadBytesPerSecond": (0, 1 << 40),  # 1 TiB/s
}


@dataclass(frozen=True)
class TopicPolicies:
    """Overrides of one topic; None means the broker-wide setting."""

    # mixedCase: the API's JSON names (Pulsar's policy names)
    thresholdBytes: int | None = None
    thresholdMessages: int | None = None
    maxLagSeconds: int | None = None
    minDirtyRatio: float | None = None
    strategy: str | None = None
    keyTtlMs: int | None = None
    maxReadBytesPerSecond: int | None = None
    iceberg: bool | None = None  # False: the topic is not published to its Iceberg table (icebergCatalogUri)

    @classmethod
    def from_json(cls, data: Any, allowed_strategies: Collection[str]) -> TopicPolicies:
        """Validate a JSON object of overrides; ``strategy`` must be one of ``allowed_strategies``
        (checked by name: nothing is imported, whatever the request names).

        :raises InvalidArgument: an unknown field or a bad value, naming it and what is allowed.
        """
        if not isinstance(data, dict):
            raise InvalidArgument("policies must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidArgument(f"unknown policy field(s) {unknown}; allowed: {sorted(known)}")
        for name, (lo, hi) in WHOLE_NUMBER_RANGES.items():
            value = data.get(name)
            if value is None or (isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi):
                continue
            shown = repr(value)
            if len(shown) > 40:  # 10**100 is not worth a hundred digits
                shown = f"{shown[:20]}... ({len(shown)} characters)"
            raise InvalidArgument(f"{name} must be a whole number from {lo} to {hi} (0 = off) or null, got {shown}")
        ratio = data.get("minDirtyRatio")
        if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, int | float)
                                  or not 0 <= ratio <= 1):
            raise InvalidArgument(f"minDirtyRatio must be a number from 0 to 1 or null, got {ratio!r}")
        iceberg = data.get("iceberg")
        if iceberg is not None and not isinstance(iceberg, bool):
            raise InvalidArgument(f"iceberg must be true, false or null (null: published when icebergCatalogUri is "
                                  f"set), got {repr(iceberg)[:40]}")
        strategy = data.get("strategy")
        if strategy is not None and (not isinstance(strategy, str) or strategy not in allowed_strategies):
            raise InvalidArgument(
                f"strategy {strategy!r} is not allowed; use one of {', '.join(allowed_strategies)} (a plug-in "
                "must first be listed in compactionStrategyPlugins in the daemon's config file)")
        return cls(**data)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def effective(self, settings: Settings) -> dict[str, Any]:
        """The thresholds and strategy in force for the topic."""
        return {
            "thresholdBytes": settings.threshold_bytes if self.thresholdBytes is None else self.thresholdBytes,
            "thresholdMessages": (
                settings.threshold_messages if self.thresholdMessages is None else self.thresholdMessages
            ),
            "maxLagSeconds": settings.max_lag_seconds if self.maxLagSeconds is None else self.maxLagSeconds,
            "minDirtyRatio": settings.min_dirty_ratio if self.minDirtyRatio is None else self.minDirtyRatio,
            "strategy": settings.compaction_strategy if self.strategy is None else self.strategy,
            "keyTtlMs": settings.compaction_key_ttl_ms if self.keyTtlMs is None else self.keyTtlMs,
            "maxReadBytesPerSecond": (settings.compaction_max_read_bytes_per_second
                                      if self.maxReadBytesPerSecond is None else self.maxReadBytesPerSecond),
            "iceberg": bool(settings.iceberg_catalog_uri) and self.iceberg is not False,
        }


_NONE = TopicPolicies()  # a topic without overrides (one object for every such topic)


class PolicyStore:
    """Reads and writes the per-topic objects through the ledger store's object store (``LedgerStore.objects``)."""

    def __init__(self, store: Any, allowed_strategies: Collection[str]) -> None:
        self._store = store
        self.allowed_strategies = tuple(allowed_strategies)
        self._unloaded: dict[str, bool] = {}  # each topic's unload mark as last read or set (one writer per root)
        self._policies: dict[str, TopicPolicies] = {}  # each topic's overrides as last read or written
        self._lock = threading.Lock()
        self._writes = 0  # policy writes so far: a read that a write overtook is not kept

    def _key(self, topic: str, name: str) -> str:
        self._store.topic_dir(topic)  # checks the name, and that the topic's folder is the root's
        return layout.topic_prefix(topic) + name

    def get(self, topic: str) -> TopicPolicies:
        """The topic's overrides (none if it has no file): read once, then as this process writes them.

        :raises PoliciesUnreadable: the file holds bad overrides (e.g. edited by hand); the monitor then
            skips this topic only, and a PUT or DELETE of the policies repairs it.
        :raises StorageUnavailable: the store does not answer: the file may well be fine, and nothing is
            to be repaired.
        """
        with self._lock:
            known, writes = self._policies.get(topic), self._writes
        if known is not None:
            return known
        read = self._read(topic)
        with self._lock:
            if self._writes == writes:
                self._policies[topic] = read
        return read

    def _read(self, topic: str) -> TopicPolicies:
        objects = self._store.objects
        key = self._key(topic, POLICIES)
        try:
            return TopicPolicies.from_json(json.loads(objects.get(key)), self.allowed_strategies)
        except ObjectNotFound:
            return _NONE
        except ValueError as exc:  # InvalidArgument is a ValueError too
            raise PoliciesUnreadable(
                f"policies file {objects.location(key)} of topic {topic!r} is not usable ({exc}); replace it with "
                f"PUT /v1/topics/{topic}/policies or remove it with DELETE"
            ) from exc

    def put(self, topic: str, policies: TopicPolicies) -> None:
        self._written(topic, None)  # read again if the write fails
        # As the topic's writer: on a root a cluster shares, refused (fenced) unless this member owns the topic.
        self._store.put_topic_object(topic, POLICIES, json.dumps(policies.to_json(), indent=1).encode())
        self._written(topic, policies)

    def delete(self, topic: str) -> None:
        self._written(topic, None)
        self._store.delete_topic_object(topic, POLICIES)
        self._written(topic, _NONE)

    def _written(self, topic: str, policies: TopicPolicies | None) -> None:
        with self._lock:
            self._writes += 1
            if policies is None:
                self._policies.pop(topic, None)
            else:
                self._policies[topic] = policies

    def unloaded(self, topic: str) -> bool:
        """Whether the topic is unloaded (its mark is read once, then kept as this process sets it)."""
        known = self._unloaded.get(topic)
        if known is None:
            known = self._unloaded[topic] = self._store.objects.head(self._key(topic, UNLOADED)) is not None
        return known

    def unloaded_as_known(self, topic: str) -> bool | None:
        """``unloaded`` from memory only (None: the topic's mark was never read here)."""
        return self._unloaded.get(topic)

    def forget(self, topic: str) -> None:
        """Drop what is kept of a deleted topic."""
        self._unloaded.pop(topic, None)
        self._written(topic, None)

    def set_unloaded(self, topic: str, unloaded: bool) -> None:
        self._unloaded.pop(topic, None)  # read again if the write fails
        if unloaded:
            self._store.put_topic_object(topic, UNLOADED, b"")
        else:
            self._store.delete_topic_object(topic, UNLOADED)
        self._unloaded[topic] = unloaded
