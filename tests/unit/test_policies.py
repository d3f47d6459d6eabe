"""A topic's policies: the strategy a request may choose is checked by name, never imported."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from compactord.config import Settings, settings_from_properties
from compactord.daemon.policies import WHOLE_NUMBER_RANGES, TopicPolicies
from compactord.engine.strategies import allowed_strategies, load_strategy_plugins
from compactord.errors import InvalidArgument, PluginLoadError

LISTED = "tests.support.plugins.listed:ListedOrder"
UNLISTED = "tests.support.plugins.unlisted:UnlistedOrder"


def test_allowed_strategies_are_the_built_ins_the_configured_one_and_the_plugins() -> None:
    settings = Settings(compaction_strategy="my.module:Mine", compaction_strategy_plugins=LISTED)
    assert allowed_strategies(settings) == ("publishing-order", "event-time", "first-value", "my.module:Mine",
                                            LISTED)
    assert allowed_strategies(Settings()) == ("publishing-order", "event-time", "first-value")


def test_a_factory_without_a_strategy_catalog_allows_the_configured_strategy_and_the_plugins() -> None:
    from compactord.daemon.core import allowed_strategies as allowed_for
    from compactord.engine.factory import SparkCompactionServiceFactory
    from tests.support.plugins.sparkless import SparklessFactory

    settings = Settings(compaction_strategy="my.module:Mine", compaction_strategy_plugins=LISTED)
    assert allowed_for(settings, SparklessFactory()) == ("my.module:Mine", LISTED)
    spark = SparkCompactionServiceFactory()
    spark.settings = settings  # what initialize sets; the catalog needs nothing else
    assert allowed_for(settings, spark) == allowed_strategies(settings)


@pytest.mark.parametrize("strategy", [UNLISTED, "unittest.__main__:X", "compactord.__main__:main", "os:system"])
def test_a_strategy_that_is_not_allowed_is_refused_and_not_imported(strategy: str) -> None:
    module = strategy.partition(":")[0]
    was_imported = module in sys.modules
    with pytest.raises(InvalidArgument) as raised:
        TopicPolicies.from_json({"strategy": strategy}, allowed_strategies(Settings()))
    message = str(raised.value)
    assert repr(strategy) in message and "publishing-order, event-time, first-value" in message
    assert "compactionStrategyPlugins" in message
    assert (module in sys.modules) == was_imported


def test_an_allowed_strategy_is_taken_by_its_exact_reference() -> None:
    allowed = allowed_strategies(Settings(compaction_strategy_plugins=LISTED))
    assert TopicPolicies.from_json({"strategy": LISTED}, allowed).strategy == LISTED
    assert TopicPolicies.from_json({"strategy": "event-time"}, allowed).strategy == "event-time"
    with pytest.raises(InvalidArgument):  # the same class, spelled otherwise
        TopicPolicies.from_json({"strategy": LISTED.replace(":", ".")}, allowed)
    with pytest.raises(InvalidArgument):
        TopicPolicies.from_json({"strategy": 3}, allowed)


def test_plugins_are_loaded_at_start_up_and_a_bad_one_names_the_key() -> None:
    load_strategy_plugins(Settings(compaction_strategy_plugins=LISTED))
    for bad, why in [("tests.support.plugins.exits:X", "SystemExit"),
                     ("tests.support.plugins:mark_import", "must subclass")]:
        with pytest.raises(PluginLoadError) as raised:
            load_strategy_plugins(Settings(compaction_strategy_plugins=f"{LISTED},{bad}"))
        assert raised.value.key == "compactionStrategyPlugins" and raised.value.value == bad
        assert why in str(raised.value)


def test_key_ttl_and_read_budget_are_whole_numbers_and_default_to_the_settings() -> None:
    settings = Settings(compaction_key_ttl_ms=5000, compaction_max_read_bytes_per_second=1000)
    effective = TopicPolicies().effective(settings)
    assert effective["keyTtlMs"] == 5000 and effective["maxReadBytesPerSecond"] == 1000
    own = TopicPolicies.from_json({"keyTtlMs": 0, "maxReadBytesPerSecond": 250}, ())
    assert own.effective(settings)["keyTtlMs"] == 0 and own.effective(settings)["maxReadBytesPerSecond"] == 250
    for bad in ({"keyTtlMs": -1}, {"maxReadBytesPerSecond": "fast"}, {"keyTtlMs": True}):
        with pytest.raises(InvalidArgument, match="whole number from 0 to"):
            TopicPolicies.from_json(bad, ())


PAST_EVERY_BOUND = [2**63, 2**64, 10**100]


@pytest.mark.parametrize("name", sorted(WHOLE_NUMBER_RANGES))
@pytest.mark.parametrize("past", ["just", *PAST_EVERY_BOUND])
def test_a_whole_number_past_its_range_is_refused_naming_the_range(name: str, past: object) -> None:
    lo, hi = WHOLE_NUMBER_RANGES[name]
    value = hi + 1 if past == "just" else past
    with pytest.raises(InvalidArgument) as raised:
        TopicPolicies.from_json({name: value}, ())
    message = str(raised.value)
    assert message.startswith(f"{name} must be a whole number from {lo} to {hi} (0 = off) or null, got ")
    assert len(message) < 200  # 10**100 is not echoed digit by digit


@pytest.mark.parametrize("name", sorted(WHOLE_NUMBER_RANGES))
def test_each_bound_of_a_whole_number_is_accepted(name: str) -> None:
    lo, hi = WHOLE_NUMBER_RANGES[name]
    for value in (lo, hi):
        assert TopicPolicies.from_json({name: value}, ()).to_json()[name] == value


def test_the_ranges_are_the_ones_the_api_documents() -> None:
    """A value at a range's top keeps a run's arithmetic in 64 bits: the key expiry's instant is a timestamp,
    the read budget a float the throttle can hold; docs/http-api.md lists every range."""
    assert WHOLE_NUMBER_RANGES == {"thresholdBytes": (0, 2**63 - 1), "thresholdMessages": (0, 2**63 - 1),
                                   "maxLagSeconds": (0, 3_153_600_000), "keyTtlMs": (0, 3_153_600_000_000),
                                   "maxReadBytesPerSecond": (0, 2**40)}
    docs = (Path(__file__).resolve().parents[2] / "docs" / "http-api.md").read_text()
    section = docs[docs.index("\n## Policies\n"):docs.index("\n## ", docs.index("\n## Policies\n") + 1)]
    for name, (lo, hi) in WHOLE_NUMBER_RANGES.items():
        assert f"| `{name}` | {lo} to {hi:,} |" in section, name
    assert "| `minDirtyRatio` | 0 to 1 |" in section


def test_the_iceberg_field_is_a_boolean_or_null() -> None:
    settings = settings_from_properties({"icebergCatalogUri": "sqlite:////tmp/catalog.db"}, env={})
    assert TopicPolicies.from_json({}, ()).effective(settings)["iceberg"] is True
    assert TopicPolicies.from_json({"iceberg": False}, ()).effective(settings)["iceberg"] is False
    assert TopicPolicies.from_json({"iceberg": True}, ()).effective(settings_from_properties({}, env={}))[
        "iceberg"] is False  # no catalog: nothing is published
    for bad in ("no", 0, 1, [False]):
        with pytest.raises(InvalidArgument, match="iceberg must be true, false or null"):
            TopicPolicies.from_json({"iceberg": bad}, ())
