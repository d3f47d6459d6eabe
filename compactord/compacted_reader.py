"""``CompactedReader``: the compacted view of a topic, like Pulsar's ``readCompacted``.

It yields the compacted ledger up to the horizon (served by the daemon's HTTP API, through
``client.DaemonClient``), then the live topic after the horizon up to the end offsets fixed when the
read starts (tombstones included there), so that an application bootstraps its state without
rewinding the whole log::

    reader = CompactedReader("broker:9092", "prices", url="http://127.0.0.1:8642")
    state = {}
    for entry in reader:
        if entry.is_tombstone:
            state.pop(entry.key, None)
        else:
            state[entry.key] = entry.value

The read is pinned to one ledger; ``apply_strategy=True`` applies that ledger's strategy to the tail
(a tail record is yielded only if it changes its key's state, the ledger's deletion markers included), so
that the application's state equals the strategy's view. See ``CompactedReader``.

Under a key TTL (the ledger's rule ``key_ttl_ms``, from ``compactionKeyTtlMs`` or the topic's
``keyTtlMs``), the reader applies the compaction's rule at the instant the read starts: a ledger entry
or a tail record older than the TTL (its timestamp; its event time under ``event-time``) is a deletion
of its key (a ledger entry is skipped, a tail record is yielded as a tombstone).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from compactord.client import DaemonClient
from compactord.config import Settings
from compactord.engine.strategies import BUILTIN_STRATEGIES
from compactord.errors import (
    BrokerUnavailable,
    DaemonRequestFailed,
    InvalidArgument,
    LedgerRetired,
    NotCompacted,
    TopicRecreated,
)
from compactord.event_time import event_time_extractor
from compactord.interfaces import BrokerMetadata, CompactionStrategy, OrderedCompactionStrategy
from compactord.kafka.identity import LedgerIdentity, LogNow, new_log_reason
from compactord.model import Entry, PartitionOffsets

__all__ = ["CompactedReader"]


def _b64(value: str | None) -> bytes | None:
    return None if value is None else base64.b64decode(value)


def _entry(e: dict[str, Any]) -> Entry:
    return Entry(
        partition=e["partition"], offset=e["offset"], key=_b64(e["key"]), value=_b64(e["value"]),
        timestamp=e["timestamp"], headers=tuple((h["key"], _b64(h["value"])) for h in e["headers"]),
        event_time=e.get("event_time"), marker=bool(e.get("marker", False)),
    )


# A read restarts when the ledger it pinned is retired under it (it outlived the grace period); more
# restarts than this mean the ledger changes faster than a read can finish.
_RESTARTS = 5


@dataclass(frozen=True)
class _Pinned:
    """The ledger a read is pinned to: its id, horizon, the rules it was written under and the identity
    of the log it was made of."""

    ledger_id: int | None
    horizon: dict[int, int]
    rules: dict[str, Any]
    identity: LedgerIdentity | None = None


class _Strategy:
    """The ledger's strategy applied to the tail, so that the application's state equals the view:
    per key, what the reader has kept so far (from the ledger, then from the tail)."""

    def __init__(self, rules: dict[str, Any], custom: CompactionStrategy | None) -> None:
        name = rules.get("strategy", "publishing-order")
        if name in BUILTIN_STRATEGIES:
            self.strategy: CompactionStrategy = custom if custom is not None and custom.name == name else \
                BUILTIN_STRATEGIES[name]()
        elif custom is not None:
            self.strategy = custom
        else:
            raise InvalidArgument(
                f"the ledger was written under the custom strategy {name!r}: pass its object "
                "(CompactedReader(..., strategy=...)) to apply it, or read without apply_strategy")
        self.kept: dict[tuple[int, bytes], Entry] = {}

    def saw(self, entry: Entry) -> None:
        """A ledger entry (a live value, or a deletion marker)."""
        if entry.key is None:
            return
        if entry.is_tombstone and not isinstance(self.strategy, OrderedCompactionStrategy):
            # A fold starts again after a deletion (first-value: the next value is the first): nothing kept.
            self.kept.pop((entry.partition, entry.key), None)
            return
        self.kept[(entry.partition, entry.key)] = entry

    def wins(self, cur: Entry) -> bool:
        """Whether a tail record changes the key's state (then it is yielded)."""
        if cur.key is None:
            return True
        key = (cur.partition, cur.key)
        prev = self.kept.get(key)  # a deletion marker takes part in an order like a record
        if prev is not None and self.strategy.should_keep_left(prev, cur):
            return False
        self.kept[key] = cur  # a tombstone too: under an order it competes like a record; a fold drops it
        if cur.is_tombstone and not isinstance(self.strategy, OrderedCompactionStrategy):
            del self.kept[key]
        return True


class _Expiry:
    """The key TTL rule, as the compaction applies it (``engine/job.py``), at one instant."""

    def __init__(self, rules: dict[str, Any], ttl_ms: int | None, now_ms: int) -> None:
        ttl = int(rules.get("key_ttl_ms", 0) if ttl_ms is None else ttl_ms)
        self.cutoff = now_ms - ttl if ttl > 0 else None
        self.by_event_time = rules.get("strategy") == "event-time"

    def expired(self, entry: Entry) -> bool:
        if self.cutoff is None or entry.key is None or entry.marker or entry.value is None:
            return False
        at = entry.event_time if self.by_event_time and entry.event_time is not None else entry.timestamp
        return at is not None and at < self.cutoff

    @staticmethod
    def deletion(entry: Entry) -> Entry:
        """What an expired record counts as: a deletion of its key (under an order it keeps its rank)."""
        return replace(entry, value=None)


class CompactedReader:
    """Iterate the compacted view of ``topic``: ledger entries, then the tail after the horizon.

    The read is pinned to the ledger of its first page (``?ledger_id=``): a compaction that switches the
    topic to a new ledger mid-read changes nothing it yields. A pinned ledger stays readable for
    ``compactionRetiredLedgerGraceSeconds`` after a switch; a read that outlives it starts over on the
    new ledger and yields nothing twice (a key the new ledger no longer holds is yielded as a deletion).

    ``apply_strategy=True`` applies the ledger's own strategy (from its rules) to the tail: a tail record
    is yielded only if it changes its key's state. A custom strategy needs its object (``strategy=``).
    The ledger's empty-value rule is applied to the tail: under Pulsar's rule an empty value comes back
    as a null one (a tombstone). So is its key TTL (``key_ttl_ms`` overrides it; 0 turns it off), at
    the instant the read starts: an expired ledger entry is skipped, an expired tail record comes back
    as a tombstone of its key.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        url: str | None = None,
        token: str | None = None,
        apply_strategy: bool = False,
        strategy: CompactionStrategy | None = None,
        event_time_source: str | None = None,
        page_size: int = 1000,
        settings: Settings | None = None,
        key_ttl_ms: int | None = None,
    ) -> None:
        self.topic = topic
        self._daemon = DaemonClient(url, token)
        self.url, self.token = self._daemon.url, self._daemon.token
        self.apply_strategy = apply_strategy
        self.strategy = strategy
        self.event_time_source = event_time_source  # None: the ledger's
        self.page_size = page_size
        self.key_ttl_ms = key_ttl_ms  # None: the ledger's
        self._now_ms = 0
        self.settings = settings or Settings(kafka_bootstrap_servers=bootstrap)
        self.ledger_entries = 0
        self.tail_records = 0
        self.restarts = 0
        self.ledger_id: int | None = None  # the ledger the read is pinned to

    # -- HTTP ---------------------------------------------------------------------------------------

    def _pin(self, ledger_id: int | None = None) -> _Pinned:
        try:
            body = self._daemon.horizon(self.topic, ledger_id)
        except DaemonRequestFailed as exc:
            if exc.error == NotCompacted.code:
                return _Pinned(None, {}, {})
            raise
        horizon = {p["partition"]: p["offset"] for p in body["partitions"]}
        identity = LedgerIdentity(body.get("topic_id"), horizon,
                                  {int(p): int(s) for p, s in (body.get("log_start") or {}).items()})
        return _Pinned(body["ledger_id"], horizon, body.get("rules", {}), identity)

    def horizon(self) -> dict[int, int]:
        """The current ledger's horizon per partition; empty if the topic was never compacted."""
        return self._pin().horizon

    def _ledger(self, partition: int, ledger_id: int, expiry: _Expiry) -> Iterator[Entry]:
        start: int | None = 0
        # Markers come with event times: what the strategy and the event-time TTL need.
        markers = self.apply_strategy or (expiry.cutoff is not None and expiry.by_event_time)
        while start is not None:
            body = self._daemon.compacted(self.topic, partition, start, self.page_size,
                                          include_markers=markers, ledger_id=ledger_id)
            for e in body["entries"]:
                yield _entry(e)
            start = body["next_start"]

    # -- the view -----------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Entry]:
        from compactord.kafka.admin import KafkaAdmin

        admin = KafkaAdmin(self.settings)  # kept for the read: the tail's identity check asks it again
        try:
            ends = admin.offsets(self.topic)  # fixed now: the read ends there
            ends_of = LogNow(admin.topic_id(self.topic))  # the incarnation of the topic they are of
            self._now_ms = int(time.time() * 1000)  # and keys expire as of now
            yielded: dict[tuple[int, bytes | None, int], Entry] = {}  # ledger entries yielded, by key
            for attempt in range(_RESTARTS + 1):
                try:
                    yield from self._read(ends, ends_of, admin, yielded, restart=attempt > 0)
                    return
                except DaemonRequestFailed as exc:
                    if exc.error == TopicRecreated.code:
                        raise TopicRecreated(self.topic, "the daemon answered 410 topic_recreated") from exc
                    if exc.error != LedgerRetired.code or attempt == _RESTARTS:
                        raise
                    self.restarts += 1
        finally:
            admin.close()

    def _read(self, ends: dict[int, PartitionOffsets], ends_of: LogNow, broker: BrokerMetadata,
              yielded: dict[tuple[int, bytes | None, int], Entry], restart: bool) -> Iterator[Entry]:
        pinned = self._pin()
        self.ledger_id = pinned.ledger_id
        apply = _Strategy(pinned.rules, self.strategy) if self.apply_strategy else None
        expiry = _Expiry(pinned.rules, self.key_ttl_ms, self._now_ms)
        for partition in sorted(ends):
            if partition not in pinned.horizon or pinned.ledger_id is None:
                continue
            present: set[tuple[int, bytes | None, int]] = set()
            for entry in self._ledger(partition, pinned.ledger_id, expiry):
                expired = expiry.expired(entry)
                if apply is not None:
                    apply.saw(replace(entry, value=None, marker=True) if expired else entry)
                if entry.marker or expired:
                    continue
                ident = (partition, entry.key, entry.offset if entry.key is None else -1)
                present.add(ident)
                if restart and yielded.get(ident) == entry:
                    continue  # yielded before the restart: the same record
                yielded[ident] = entry
                self.ledger_entries += 1
                yield entry
            if restart:
                yield from self._deleted_since(partition, pinned, yielded, present)
        self._check_tail(pinned, ends_of, broker)
        yield from self._tail(ends, pinned, apply, expiry)

    def _check_tail(self, pinned: _Pinned, ends_of: LogNow, broker: BrokerMetadata) -> None:
        """Before the tail is read from the broker: the log now (asked again: the ledger's pages may have
        taken long) is the one the pinned ledger was made of, and the ends fixed at the start are of the
        same topic (its id; they may lie below the horizon of a ledger pinned after a restart).

        :raises TopicRecreated: either is of another incarnation of the topic.
        """
        if pinned.identity is None:
            return
        now = LogNow(broker.topic_id(self.topic))
        if ends_of.topic_id and now.topic_id and ends_of.topic_id != now.topic_id:
            raise TopicRecreated(self.topic, f"the topic id changed from {ends_of.topic_id} to {now.topic_id} "
                                             "during the read")
        why = new_log_reason(pinned.identity, broker.offsets(self.topic), now)
        if why is not None:
            raise TopicRecreated(self.topic, why)

    def _deleted_since(self, partition: int, pinned: _Pinned, yielded: dict[tuple[int, bytes | None, int], Entry],
                       present: set[tuple[int, bytes | None, int]]) -> Iterator[Entry]:
        """After a restart: keys yielded from the retired ledger that the new one no longer holds."""
        for ident in [i for i in yielded if i[0] == partition and i not in present]:
            old = yielded.pop(ident)
            if old.key is not None:
                yield Entry(partition=partition, offset=pinned.horizon[partition], key=old.key, value=None)

    def _tail(self, ends: dict[int, Any], pinned: _Pinned, apply: _Strategy | None,
              expiry: _Expiry) -> Iterator[Entry]:
        from kafka import TopicPartition

        from compactord.kafka.client import consumer, translate_kafka_errors

        horizon = pinned.horizon
        ranges = {p: (max(horizon.get(p, -1) + 1, o.log_start), o.end) for p, o in ends.items()}
        ranges = {p: r for p, r in ranges.items() if r[1] > r[0]}
        if not ranges:
            return
        event_time = event_time_extractor(self.event_time_source or pinned.rules.get("event_time_source", "timestamp"))
        empty_deletes = bool(pinned.rules.get("empty_value_is_tombstone", False))
        bootstrap = self.settings.kafka_bootstrap_servers
        with translate_kafka_errors(bootstrap, self.topic):
            cons = consumer(self.settings.kafka_client_config(), auto_offset_reset="none")
        try:
            for p in sorted(ranges):
                start, end = ranges[p]
                tp = TopicPartition(self.topic, p)
                with translate_kafka_errors(bootstrap, self.topic):
                    cons.assign([tp])
                    cons.seek(tp, start)
                    deadline = time.monotonic() + 60
                    while cons.position(tp) < end:
                        if time.monotonic() > deadline:
                            raise BrokerUnavailable(f"reading {self.topic}[{p}] stalled at {cons.position(tp)}")
                        for r in cons.poll(timeout_ms=500).get(tp, ()):
                            if r.offset >= end:
                                break
                            deadline = time.monotonic() + 60
                            value = None if empty_deletes and r.value == b"" else r.value
                            entry = Entry(partition=p, offset=r.offset, key=r.key, value=value,
                                          timestamp=r.timestamp, headers=tuple(r.headers or ()),
                                          event_time=event_time(r.timestamp, r.headers or ()))
                            if expiry.expired(entry):
                                entry = expiry.deletion(entry)
                            if apply is not None and not apply.wins(entry):
                                continue
                            self.tail_records += 1
                            yield entry
        finally:
            cons.close()
