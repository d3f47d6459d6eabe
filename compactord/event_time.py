"""The event-time rules, once (PIP-352, KIP-280): where a record's event time comes from, and its rank.

A leaf module: the config validates ``compactionEventTimeSource`` with it, the engine's strategy and
readers extract and rank with it, and ``CompactedReader`` applies the same rank to the tail.

- ``timestamp``: the record's timestamp; a negative or missing one means no event time.
- ``header:NAME``: the last header ``NAME``; ASCII digits (optional leading '-') are decimal, exactly
  8 bytes are a big-endian signed long, anything else means no event time. A missing header does not
  fall back to the timestamp.
- Rank: a record with an event time beats one without; then the higher event time; then the higher
  offset.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from compactord.errors import ConfigError

__all__ = [
    "EVENT_TIME_SOURCES",
    "EventTimeExtractor",
    "event_time_extractor",
    "event_time_rank",
    "parse_event_time_header",
    "validate_event_time_source",
]

EventTimeExtractor = Callable[[int | None, Sequence[tuple[str, bytes]]], int | None]
#: What compactionEventTimeSource allows, as its error and the configuration reference say it.
EVENT_TIME_SOURCES = "timestamp, or header:NAME (a non-empty header name)"
_DECIMAL = re.compile(rb"-?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def event_time_rank(event_time: int | None, offset: int) -> tuple[bool, int, int]:
    """The event-time order: the highest rank wins."""
    return (event_time is not None, event_time if event_time is not None else 0, offset)


def parse_event_time_header(value: bytes | None) -> int | None:
    """ASCII digits (optional leading '-') are decimal; else exactly 8 bytes are a big-endian signed
    long; anything else means no event time."""
    if value is None:
        return None
    if _DECIMAL.fullmatch(value):
        number = int(value)
        return number if _INT64_MIN <= number <= _INT64_MAX else None
    if len(value) == 8:
        return int.from_bytes(value, "big", signed=True)
    return None


def validate_event_time_source(value: str, key: str = "compactionEventTimeSource") -> str:
    """:raises ConfigError: ``value`` is neither ``timestamp`` nor ``header:NAME``."""
    if value == "timestamp":
        return value
    if value.startswith("header:") and len(value) > len("header:"):
        return value
    raise ConfigError(key, value, f"expected {EVENT_TIME_SOURCES}")


def event_time_extractor(source: str) -> EventTimeExtractor:
    """``f(timestamp, headers) -> event time or None`` for ``compactionEventTimeSource``."""
    validate_event_time_source(source)
    if source == "timestamp":

        def from_timestamp(timestamp: int | None, headers: Sequence[tuple[str, bytes]]) -> int | None:
            return timestamp if timestamp is not None and timestamp >= 0 else None

        return from_timestamp

    name = source[len("header:") :]

    def from_header(timestamp: int | None, headers: Sequence[tuple[str, bytes]]) -> int | None:
        found = None
        seen = False
        for hkey, hvalue in headers:
            if hkey == name:
                found, seen = hvalue, True
        return parse_event_time_header(found) if seen else None

    return from_header
