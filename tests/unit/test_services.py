"""The factory's look-up of existing services keeps nothing for a name it has never seen (reads of
unknown topics over HTTP must not grow the daemon's memory or its ledger root). A plug-in's service that reads
its view as entries only gives it as Arrow columns too (``read_compacted_rows``' default)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from compactord.config import Settings
from compactord.engine.factory import SparkCompactionServiceFactory
from compactord.interfaces import ServiceContext, TopicCompactionService
from compactord.model import CompactedPage, Entry, LedgerManifest, Position, StrategySettings, entries_table


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


def _unused(*args: object, **kwargs: object) -> None:
    raise AssertionError("not asked by the test")


class _EntriesOnly(TopicCompactionService):
    """A plug-in's service that reads its view as entries only."""

    def __init__(self, page: CompactedPage) -> None:
        self.page = page
        self.asked: list[tuple[object, ...]] = []

    def read_compacted_page(self, start: Position, n: int, include_markers: bool = False,
                            ledger_id: int | None = None, max_bytes: int | None = None) -> CompactedPage:
        self.asked.append((start, n, include_markers, ledger_id, max_bytes))
        return self.page

    compact = read_last_compacted_page = get_last_compacted_position = ledger_info = corrupt_ledger = _unused
    delete = close = _unused


def test_a_service_that_reads_entries_gives_its_rows_as_arrow_columns() -> None:
    manifest = LedgerManifest(ledger_id=3, topic="t", horizon={0: 9}, strategy=StrategySettings(), files=[])
    entries = [Entry(0, 4, b"a", b"1", timestamp=10, headers=(("h", b"x"),)),
               Entry(0, 9, b"b", None, timestamp=20, marker=True, marker_at=30)]
    service = _EntriesOnly(CompactedPage(manifest, entries, truncated=True))

    rows = service.read_compacted_rows(Position(0, 4), 2, include_markers=True, ledger_id=3, max_bytes=100)

    assert service.asked == [(Position(0, 4), 2, True, 3, 100)]
    assert rows.ledger is manifest and rows.truncated
    assert rows.rows.equals(entries_table(entries))
    assert rows.rows.column("headers").to_pylist() == [[{"key": "h", "value": b"x"}], []]
