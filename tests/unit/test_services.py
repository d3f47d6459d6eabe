"""The factory's look-up of existing services keeps nothing for a name it has never seen (reads of
unknown topics over HTTP must not grow the daemon's memory or its ledger root)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from compactord.config import Settings
from compactord.engine.factory import SparkCompactionServiceFactory
from compactord.interfaces import ServiceContext


@pytest.fixture
def factory(tmp_path: Path) -> Iterator[SparkCompactionServiceFactory]:
    # Neither the Spark session nor the broker client connects before it is used.
    made = SparkCompactionServiceFactory()
    made.initialize(ServiceContext(Settings(compacted_ledger_root=str(tmp_path / "ledgers"))))
    try:
        yield made
    finally:
        made.close()


def test_an_unknown_topic_has_no_service_and_none_is_kept(factory: SparkCompactionServiceFactory) -> None:
    for i in range(50):
        assert factory.existing_topic_compaction_service(f"nope-{i}") is None
    assert factory.services() == []
    assert factory.store.topics() == []


def test_a_topic_with_state_has_its_service(factory: SparkCompactionServiceFactory) -> None:
    made = factory.new_topic_compaction_service("asked")
    assert factory.existing_topic_compaction_service("asked") is made
    factory.store.topic_dir("on-disk").mkdir()  # e.g. a ledger from before this process
    found = factory.existing_topic_compaction_service("on-disk")
    assert found is not None and found is factory.new_topic_compaction_service("on-disk")
