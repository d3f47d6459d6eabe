"""Plug-in references: a broker.conf written with the class names of before the move still starts."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from compactord.config import load_settings
from compactord.daemon.core import load_factory
from compactord.engine.factory import SparkCompactionServiceFactory
from compactord.engine.strategies import EventTimeOrder, FirstValue, PublishingOrder, ResolvedStrategy

OLD_FACTORY = "compactord.service:SparkCompactionServiceFactory"
NEW_FACTORY = "compactord.engine.factory:SparkCompactionServiceFactory"
OLD, NEW = "compactord.strategies", "compactord.engine.strategies"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The messages of the warnings ``compactord.refs`` logged."""
    return [r.getMessage() for r in caplog.records
            if r.name == "compactord.refs" and r.levelno == logging.WARNING]


@pytest.mark.parametrize(
    ("old_strategy", "new_strategy", "new_class"),
    [
        (f"{OLD}:PublishingOrder", f"{NEW}:PublishingOrder", PublishingOrder),
        (f"{OLD}:EventTimeOrder", f"{NEW}:EventTimeOrder", EventTimeOrder),
        (f"{OLD}.FirstValue", f"{NEW}:FirstValue", FirstValue),  # module.Class is accepted as well
    ],
)
def test_old_class_names_in_broker_conf_resolve_to_the_moved_classes(
    old_strategy: str, new_strategy: str, new_class: type, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(f"compactionServiceFactoryClassName={OLD_FACTORY}\ncompactionStrategy={old_strategy}\n",
                    encoding="latin-1")
    settings = load_settings(conf, env={})
    caplog.set_level(logging.WARNING, logger="compactord.refs")

    # As the daemon starts: the factory from the config, then the factory's configured strategy.
    factory = load_factory(settings)
    assert type(factory) is SparkCompactionServiceFactory
    (factory_warning,) = _warnings(caplog)
    assert OLD_FACTORY in factory_warning and NEW_FACTORY in factory_warning
    assert "compactionServiceFactoryClassName" in factory_warning

    caplog.clear()
    resolved = ResolvedStrategy.resolve(settings.compaction_strategy, settings.compaction_event_time_source,
                                        settings.topic_compaction_retain_null_key)
    assert type(resolved.strategy) is new_class
    (strategy_warning,) = _warnings(caplog)
    assert old_strategy in strategy_warning and new_strategy in strategy_warning
    assert "compactionStrategy" in strategy_warning


def test_a_plugin_module_that_exits_on_import_is_a_plugin_load_error_not_an_exit() -> None:
    from compactord.errors import PluginLoadError
    from compactord.refs import resolve_ref

    with pytest.raises(PluginLoadError) as raised:
        resolve_ref("compactionStrategyPlugins", "tests.support.plugins.exits:Anything")
    assert raised.value.key == "compactionStrategyPlugins"
    assert "SystemExit" in str(raised.value) and "tests.support.plugins.exits" in str(raised.value)
