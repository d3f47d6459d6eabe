"""Topic-name validation, entries, manifests and the record schema."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from compactord.errors import InvalidTopicName
from compactord.model import (
    RECORD_DDL,
    RECORD_SCHEMA,
    Entry,
    LedgerManifest,
    StrategySettings,
    iso_utc,
    validate_topic_name,
)


@pytest.mark.parametrize("topic", ["a", "A.b_c-9", "x" * 249, "__consumer_offsets", "...", ".a", "0"])
def test_legal_topic_names(topic: str) -> None:
    assert validate_topic_name(topic) == topic


@pytest.mark.parametrize(
    ("topic", "says"),
    [
        ("", "non-empty"),
        (None, "non-empty string"),
        (42, "non-empty string"),
        (".", "reserved"),
        ("..", "reserved"),
        ("../x", "[a-zA-Z0-9._-]"),
        ("a/b", "[a-zA-Z0-9._-]"),
        ("x" * 250, "at most 249"),
        ("café", "[a-zA-Z0-9._-]"),
        ("a b", "[a-zA-Z0-9._-]"),
        ("a\n", "[a-zA-Z0-9._-]"),
        ("a\\b", "[a-zA-Z0-9._-]"),
        ("a\x00", "[a-zA-Z0-9._-]"),
    ],
    ids=repr,
)
def test_illegal_topic_names_say_what_is_allowed(topic: object, says: str) -> None:
    with pytest.raises(InvalidTopicName) as info:
        validate_topic_name(topic)
    assert says in str(info.value)


@pytest.mark.parametrize(
    ("key", "value", "tombstone"),
    [
        (b"k", None, True),
        (b"k", b"", True),
        (b"k", b"v", False),
        (b"", None, True),  # the empty key is an ordinary key
        (b"", b"", True),
        (b"", b"v", False),
        (None, None, False),  # a null-key record never deletes anything
        (None, b"", False),
        (None, b"v", False),
    ],
)
def test_entry_is_tombstone(key: bytes | None, value: bytes | None, tombstone: bool) -> None:
    assert Entry(partition=0, offset=0, key=key, value=value).is_tombstone is tombstone


def test_entry_from_row() -> None:
    row = {"partition": 1, "offset": 7, "timestamp": 5, "key": b"k", "value": b"v",
           "headers": [{"key": "et", "value": b"9"}], "event_time": 9, "marker": None, "marker_at": None}
    assert Entry.from_row(row) == Entry(1, 7, b"k", b"v", 5, (("et", b"9"),), 9, False, None)
    assert Entry.from_row({"partition": 0, "offset": 1, "key": None, "value": None}).headers == ()


def test_record_schema_matches_entry_and_ddl() -> None:
    assert set(RECORD_SCHEMA.names) == {f.name for f in fields(Entry)}
    assert [part.split(" ")[0] for part in RECORD_DDL.split(", ")] == RECORD_SCHEMA.names


def _manifest() -> LedgerManifest:
    return LedgerManifest(
        ledger_id=3,
        topic="orders",
        horizon={10: 99, 2: -1, 0: 5},
        strategy=StrategySettings("event-time", "header:et", True),
        files=[{"name": "part-0.parquet", "bytes": 10, "crc32c": "abcd"}],
        records_read=100,
        records_kept=7,
        markers=1,
        removed=92,
        bytes=10,
        created_at_ms=1,
        started_at_ms=2,
        finished_at_ms=3,
        full_rebuild=False,
        log_start={0: 0, 10: 50},
        timings={"read": 1.5},
    )


def test_manifest_json_round_trip() -> None:
    manifest = _manifest()
    data = json.loads(json.dumps(manifest.to_json()))
    assert data["horizon"] == {"0": 5, "2": -1, "10": 99}
    back = LedgerManifest.from_json(data)
    assert back == manifest
    assert all(isinstance(p, int) for p in back.horizon)
    assert all(isinstance(p, int) for p in back.log_start)
    assert isinstance(back.strategy, StrategySettings)


def test_manifest_without_log_start_reads() -> None:
    data = json.loads(json.dumps(_manifest().to_json()))
    del data["log_start"]
    assert LedgerManifest.from_json(data).log_start == {}


@pytest.mark.parametrize(
    ("ts", "text"),
    [
        (None, None),
        (0, "1970-01-01T00:00:00.000Z"),
        (1_700_000_000.5, "2023-11-14T22:13:20.500Z"),
        (1_700_000_000.0129, "2023-11-14T22:13:20.012Z"),
    ],
)
def test_iso_utc(ts: float | None, text: str | None) -> None:
    assert iso_utc(ts) == text
