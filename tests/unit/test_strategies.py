"""Strategies, event-time extraction, strategy loading, and the reducers the Kafka reader runs."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactord.engine.strategies import (
    BUILTIN_STRATEGIES,
    EventTimeOrder,
    FirstValue,
    PublishingOrder,
    event_time_extractor,
    fold,
    load_strategy,
    parse_event_time_header,
    plan_for,
    reducer_for,
    row_entry,
    strategy_name,
    validate_event_time_source,
)
from compactord.errors import ConfigError, PluginLoadError
from compactord.interfaces import CompactionStrategy, OrderedCompactionStrategy
from compactord.model import Entry

Row = tuple[Any, ...]  # (partition, offset, timestamp, key, value, headers, event_time)


class MyStrategy(OrderedCompactionStrategy):
    """A custom total order: the longest value wins, ties to the higher offset."""

    name = "longest-value"

    def order_key(self, record: Entry) -> tuple[Any, ...]:
        return (len(record.value or b""), record.offset)


class KeepLargest(CompactionStrategy):
    """A custom general strategy: a value replaces the kept one only if it is larger."""

    name = "keep-largest"

    def should_keep_left(self, prev: Entry, cur: Entry) -> bool:
        return not cur.is_tombstone and (prev.value or b"") >= (cur.value or b"")


class NotAStrategy:
    pass


class NeedsArguments(CompactionStrategy):
    def __init__(self, required: int) -> None:
        self.required = required

    def should_keep_left(self, prev: Entry, cur: Entry) -> bool:
        return True


# -- event time -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"123", 123),
        (b"-5", -5),
        (b"0", 0),
        (b"-", None),
        (b"", None),
        (None, None),
        ((-2).to_bytes(8, "big", signed=True), -2),
        ((1_700_000_000_000).to_bytes(8, "big", signed=True), 1_700_000_000_000),
        (b"12345678", 12345678),  # 8 digits: decimal, not 8 bytes
        (b"abcdefg", None),  # 7 bytes, not digits
        (b"abcdefghi", None),  # 9 bytes
        (b"12a", None),
        (b" 12", None),
        (b"12\n", None),
        (b"9223372036854775807", 2**63 - 1),
        (b"9223372036854775808", None),  # out of the long range
        (b"-9223372036854775808", -(2**63)),
    ],
)
def test_parse_event_time_header(raw: bytes | None, expected: int | None) -> None:
    assert parse_event_time_header(raw) == expected


@pytest.mark.parametrize(("timestamp", "expected"), [(5, 5), (0, 0), (-1, None), (None, None)])
def test_event_time_from_timestamp(timestamp: int | None, expected: int | None) -> None:
    assert event_time_extractor("timestamp")(timestamp, [("et", b"99")]) == expected


def test_event_time_from_header_last_duplicate_wins() -> None:
    extract = event_time_extractor("header:et")
    assert extract(1, [("et", b"10"), ("other", b"5"), ("et", b"20")]) == 20
    assert extract(1, [("et", b"10"), ("et", b"junk")]) is None


def test_event_time_from_a_missing_header_does_not_fall_back_to_the_timestamp() -> None:
    extract = event_time_extractor("header:et")
    assert extract(1_700_000_000_000, []) is None
    assert extract(1_700_000_000_000, [("ET", b"1"), ("et2", b"2")]) is None


@pytest.mark.parametrize("source", ["", "header:", "offset", "Timestamp", "header"])
def test_bad_event_time_source(source: str) -> None:
    with pytest.raises(ConfigError, match="compactionEventTimeSource"):
        event_time_extractor(source)
    with pytest.raises(ConfigError, match="myKey"):
        validate_event_time_source(source, "myKey")


# -- loading ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["publishing-order", "event-time", "first-value"])
def test_load_builtin_strategy(name: str) -> None:
    strategy = load_strategy(name)
    assert type(strategy) is BUILTIN_STRATEGIES[name]
    assert strategy.name == name
    assert strategy_name(strategy, name) == name


@pytest.mark.parametrize("sep", [":", "."])
def test_load_strategy_by_reference(sep: str) -> None:
    ref = f"{__name__}{sep}MyStrategy"
    strategy = load_strategy(ref)
    assert type(strategy).__name__ == "MyStrategy"
    assert isinstance(strategy, OrderedCompactionStrategy)
    assert strategy_name(strategy, ref) == ref


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        ("no_such_module_for_compactord:Strategy", "cannot be imported"),
        ("no_such_module_for_compactord.Strategy", "cannot be imported"),
        (f"{__name__}:NoSuchClass", "no attribute"),
        (f"{__name__}:NotAStrategy", "must subclass"),
        (f"{__name__}:event_time_extractor", "must subclass"),
        ("compactord.interfaces:CompactionStrategy", "cannot be instantiated"),
        (f"{__name__}:NeedsArguments", "cannot be instantiated"),
        (f"{__name__}:", "module:Class"),
        (":MyStrategy", "module:Class"),
    ],
)
def test_bad_reference_names_the_key(ref: str, says: str) -> None:
    with pytest.raises(PluginLoadError) as info:
        load_strategy(ref)
    assert info.value.key == "compactionStrategy"
    assert info.value.value == ref
    assert "compactionStrategy" in str(info.value)
    assert says in str(info.value)


@pytest.mark.parametrize("body", ["raise RuntimeError('boom')\n", "def broken(:\n"], ids=["raises", "syntax"])
def test_plugin_module_that_fails_to_import_names_the_key(
    body: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"compactord_broken_plugin_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text(body, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginLoadError) as info:
        load_strategy(f"{module}:Strategy")
    assert info.value.key == "compactionStrategy"


def test_unknown_plain_name_lists_the_builtins() -> None:
    with pytest.raises(ConfigError) as info:
        load_strategy("last-value")
    assert info.value.key == "compactionStrategy"
    for name in BUILTIN_STRATEGIES:
        assert name in str(info.value)


# -- fold and the reducers: direct cases ------------------------------------------------------------


def row(offset: int, value: bytes | None, *, key: bytes = b"k", event_time: int | None = None) -> Row:
    return (0, offset, 1000 + offset, key, value, (), event_time)


def winner(strategy: CompactionStrategy, rows: Sequence[Row]) -> Entry | None:
    """The fold over every row, checked against the fold over what the reducer keeps."""
    result = fold(strategy, [row_entry(r) for r in rows])
    kept = [rows[i] for i in reducer_for(strategy)(rows)]
    assert fold(strategy, [row_entry(r) for r in kept]) == result
    return result


def offset_of(entry: Entry | None) -> int | None:
    return None if entry is None else entry.offset


def test_publishing_order_keeps_the_last_offset() -> None:
    assert offset_of(winner(PublishingOrder(), [row(0, b"a"), row(1, b"b"), row(5, b"c")])) == 5
    assert reducer_for(PublishingOrder())([row(0, b"a"), row(1, b"b", key=b"x"), row(5, b"c")]) == [1, 2]


def test_publishing_order_winning_tombstone_is_returned() -> None:
    result = winner(PublishingOrder(), [row(0, b"a"), row(1, None)])
    assert result is not None and result.is_tombstone


def test_event_time_out_of_order() -> None:
    rows = [row(0, b"a", event_time=30), row(1, b"b", event_time=10), row(2, b"c", event_time=20)]
    assert offset_of(winner(EventTimeOrder(), rows)) == 0


def test_event_time_ties_go_to_the_higher_offset() -> None:
    rows = [row(0, b"a", event_time=10), row(1, b"b", event_time=10), row(2, b"c", event_time=5)]
    assert offset_of(winner(EventTimeOrder(), rows)) == 1


def test_event_time_record_without_event_time_never_replaces_one_with_it() -> None:
    assert offset_of(winner(EventTimeOrder(), [row(0, b"a", event_time=0), row(1, b"b")])) == 0
    assert offset_of(winner(EventTimeOrder(), [row(0, b"a"), row(1, b"b", event_time=-1)])) == 1
    assert offset_of(winner(EventTimeOrder(), [row(0, b"a"), row(1, b"b")])) == 1


def test_event_time_stale_tombstone_does_not_delete_a_newer_value() -> None:
    rows = [row(0, b"a", event_time=10), row(1, None, event_time=5), row(2, b"", event_time=9)]
    result = winner(EventTimeOrder(), rows)
    assert result is not None and result.value == b"a"


def test_event_time_newer_tombstone_wins() -> None:
    result = winner(EventTimeOrder(), [row(0, b"a", event_time=10), row(1, None, event_time=11)])
    assert result is not None and result.is_tombstone


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([b"v1", b"v2"], b"v1"),
        ([b"v1", None, b"v3"], b"v3"),
        ([b"v1", b"", b"v3", b"v4"], b"v1"),  # an empty value is a value (Kafka's rule)
        ([b"v1", None, b"", b"v4"], b""),
        ([b"v1", None], None),
        ([None, b"v2"], b"v2"),
        ([None], None),
    ],
)
def test_first_value(values: list[bytes | None], expected: bytes | None) -> None:
    result = winner(FirstValue(), [row(i, v) for i, v in enumerate(values)])
    assert (None if result is None else result.value) == expected


def test_empty_key_is_an_ordinary_key() -> None:
    rows = [row(0, b"a", key=b""), row(1, b"b", key=b"k"), row(2, b"c", key=b"")]
    assert reducer_for(PublishingOrder())(rows) == [1, 2]


def test_custom_strategies_get_reducers() -> None:
    rows = [row(0, b"long value"), row(1, b"short")]
    assert reducer_for(MyStrategy())(rows) == [0]
    assert reducer_for(KeepLargest())(rows) == [0, 1]  # a general fold cannot drop rows early


# -- reducers: the property the Spark job relies on -------------------------------------------------

KEYS = [b"a", b"b", b"", b"\x00"]
VALUES = [None, b"", b"x", b"yy", b"zzz"]
EVENT_TIMES = [None, 0, 1, 2, 3]
STRATEGIES = [PublishingOrder(), EventTimeOrder(), FirstValue(), MyStrategy(), KeepLargest()]

_record = st.tuples(
    st.integers(1, 3),  # offset gap (transaction markers and compacted-away offsets leave gaps)
    st.one_of(st.none(), st.integers(-1, 5)),  # timestamp
    st.sampled_from(KEYS),
    st.sampled_from(VALUES),
    st.sampled_from([(), (("et", b"1"),)]),  # headers
    st.sampled_from(EVENT_TIMES),
)


@st.composite
def chunked_rows(draw: st.DrawFn) -> tuple[list[Row], list[list[Row]]]:
    partition = draw(st.integers(0, 3))
    offset = draw(st.integers(0, 1000))
    rows: list[Row] = []
    for gap, timestamp, key, value, headers, event_time in draw(st.lists(_record, max_size=40)):
        rows.append((partition, offset, timestamp, key, value, headers, event_time))
        offset += gap
    n_chunks = draw(st.integers(1, 3))
    cuts = sorted(draw(st.lists(st.integers(0, len(rows)), min_size=n_chunks - 1, max_size=n_chunks - 1)))
    bounds = [0, *cuts, len(rows)]
    return rows, [rows[a:b] for a, b in pairwise(bounds)]


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: type(s).__name__)
@settings(database=None, max_examples=300)
@given(data=chunked_rows())
def test_reducing_each_chunk_keeps_every_key_s_winner(
    strategy: CompactionStrategy, data: tuple[list[Row], list[list[Row]]]
) -> None:
    rows, chunks = data
    reduce = reducer_for(strategy)
    kept: list[Row] = []
    for chunk in chunks:
        indexes = reduce(chunk)
        assert indexes == sorted(set(indexes))
        assert all(0 <= i < len(chunk) for i in indexes)
        chosen = [chunk[i] for i in indexes]
        per_key = {r[3]: sum(1 for c in chosen if c[3] == r[3]) for r in chosen}
        if isinstance(strategy, OrderedCompactionStrategy):
            assert set(per_key.values()) <= {1}
        elif isinstance(strategy, FirstValue):
            assert set(per_key.values()) <= {1, 2}
        kept.extend(chosen)
    for key in {r[3] for r in rows}:
        expected = fold(strategy, [row_entry(r) for r in rows if r[3] == key])
        assert fold(strategy, [row_entry(r) for r in kept if r[3] == key]) == expected


# -- one dispatch: what a strategy's class declares decides the reducer and the job's query -------------


class LastValueWins(FirstValue):
    """A plug-in subclass that changes the fold: the built-in's shortcuts must not apply to it."""

    def should_keep_left(self, prev: Entry, cur: Entry) -> bool:
        return False


class EarliestEventTime(EventTimeOrder):
    """Overrides the order but inherits EventTimeOrder's SQL order, which no longer mirrors it."""

    def order_key(self, record: Entry) -> tuple[Any, ...]:
        return (-(record.event_time or 0), record.offset)


def test_a_subclass_that_changes_the_fold_loses_the_builtin_shortcuts() -> None:
    plan = plan_for(LastValueWins())
    assert not plan.first_value and plan.sql_order is None
    rows = [row(0, b"first"), row(1, b"second")]
    assert [rows[i] for i in plan.reducer(rows)] == rows  # every row goes to the general fold
    assert winner(LastValueWins(), rows).value == b"second"


def test_a_subclass_that_changes_the_order_loses_the_inherited_sql_order() -> None:
    plan = plan_for(EarliestEventTime())
    assert plan.sql_order is None and plan.keeps_deletion_markers
    rows = [row(0, b"late", event_time=30), row(1, b"early", event_time=10)]
    assert [rows[i][4] for i in plan.reducer(rows)] == [b"early"]


def test_builtins_keep_their_shortcuts() -> None:
    assert plan_for(PublishingOrder()).sql_order == "offset"
    assert plan_for(EventTimeOrder()).sql_order == EventTimeOrder.sql_order
    assert plan_for(FirstValue()).first_value
    assert plan_for(KeepLargest()).reducer is not plan_for(FirstValue()).reducer
