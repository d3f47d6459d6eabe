"""The Iceberg publisher's lifecycle against a real SQLite catalog: only the topics this process owns are
committed (a topic taken later is caught up), the catch-up at start makes an idle topic's table, a deleted
topic's table is dropped, and the ledger ids a table's retained snapshots name are reported once read.

The ledger store is the publisher's seam here (its current ledger per topic, in a folder of real Parquet files);
the daemon's tests (tests/daemon/test_iceberg.py) run it over the real store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError

from compactord.iceberg.publisher import TablePublisher
from compactord.iceberg.table import ledger_id_of, open_catalog
from compactord.model import RECORD_SCHEMA, LedgerManifest, StrategySettings
from tests.support.timeouts import TASK_TIMEOUT_S
from tests.support.waiting import wait_for

WAIT_S = TASK_TIMEOUT_S  # a commit on a loaded machine: generous, reached only by a failing test


class _Root:
    """The ledger store as the publisher reads it: each topic's current ledger, its files under ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.current: dict[str, int] = {}
        self.objects = self  # the root's objects: a key's URI is its path under ``folder``

    def uri(self, key: str) -> str:
        return str(self.folder / key)

    def switch(self, topic: str, ledger_id: int) -> None:
        path = self.ledger_path(topic, ledger_id) / "part-00000.parquet"
        path.parent.mkdir(parents=True)
        rows = {"partition": [0], "offset": [ledger_id], "timestamp": [0], "key": [b"k"],
                "value": [b"v%d" % ledger_id], "headers": [[]], "event_time": [None], "marker": [False],
                "marker_at": [None]}
        pq.write_table(pa.table(rows, schema=RECORD_SCHEMA), path)
        self.current[topic] = ledger_id

    def topics(self) -> list[str]:
        return sorted(self.current)

    def current_ledger_id(self, topic: str) -> int | None:
        return self.current.get(topic)

    def ledger_path(self, topic: str, ledger_id: int) -> Path:
        return self.folder / self.ledger_key(topic, ledger_id)

    def ledger_key(self, topic: str, ledger_id: int) -> str:
        return f"{topic}/ledger-{ledger_id}"

    def load_manifest(self, topic: str, ledger_id: int) -> LedgerManifest:
        return LedgerManifest(ledger_id=ledger_id, topic=topic, horizon={0: ledger_id + 1},
                              strategy=StrategySettings(), files=[{"name": "part-00000.parquet"}])


@pytest.fixture()
def catalog(tmp_path: Path) -> Iterator[Catalog]:
    catalog = open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", (tmp_path / "warehouse").as_uri())
    yield catalog
    catalog.engine.dispose()  # type: ignore[attr-defined]


@pytest.fixture()
def root(tmp_path: Path) -> _Root:
    return _Root(tmp_path / "ledgers")


@pytest.fixture()
def publisher(root: _Root, catalog: Catalog) -> Iterator[TablePublisher]:
    lags: dict[str, int] = {}
    publisher = TablePublisher(root, lambda: catalog, "compactord", 2, lags.__setitem__,  # type: ignore[arg-type]
                               per_second=0)
    yield publisher
    publisher.stop()


def _named(catalog: Catalog, topic: str) -> int | None:
    try:
        return ledger_id_of(catalog.load_table(("compactord", topic)).current_snapshot())
    except NoSuchTableError:
        return None


def test_only_the_owned_topics_are_committed_and_a_topic_taken_is_caught_up(
        publisher: TablePublisher, root: _Root, catalog: Catalog) -> None:
    owned = {"b"}
    publisher.owns = owned.__contains__
    root.switch("a", 1)
    root.switch("b", 1)
    assert publisher.retained("a") is None  # not read yet: any ledger may be a retained snapshot's
    publisher.start()  # idle topics: no switch, caught up at start
    wait_for(lambda: _named(catalog, "b") == 1, WAIT_S, "topic b's table at ledger 1")
    assert _named(catalog, "a") is None  # another member's: not created (the pass is in topic order)
    assert publisher.retained("b") == {1}

    root.switch("a", 2)
    root.switch("b", 2)
    publisher.switched("a")  # a switch reported for a topic this member does not own (it just lost it)
    publisher.switched("b")
    wait_for(lambda: _named(catalog, "b") == 2, WAIT_S, "topic b's table at ledger 2")
    assert _named(catalog, "a") is None

    owned.add("a")
    publisher.catch_up(["a"])  # taken: its current ledger is committed, though no switch came
    wait_for(lambda: _named(catalog, "a") == 2, WAIT_S, "topic a's table at ledger 2")
    assert publisher.retained("a") == {2} and publisher.lag("a") == 0


def test_the_retained_ledgers_and_the_drop_of_a_deleted_topic(publisher: TablePublisher, root: _Root,
                                                                catalog: Catalog) -> None:
    released: list[tuple[str, Any]] = []
    publisher.released = lambda topic: released.append((topic, publisher.retained(topic)))
    for ledger_id in (1, 2, 3):
        root.switch("t", ledger_id)
        publisher.switched("t")
        wait_for(lambda i=ledger_id: _named(catalog, "t") == i, WAIT_S, f"topic t's table at ledger {ledger_id}")
    # two snapshots retained: the ledger expired from the table is released after the expiry
    wait_for(lambda: ("t", {2, 3}) in released, WAIT_S, "ledger 1 released")
    assert publisher.retained("t") == {2, 3}

    del root.current["t"]
    publisher.deleted("t")
    wait_for(lambda: not catalog.table_exists(("compactord", "t")), WAIT_S, "topic t's table dropped")
    assert (root.folder / "t" / "ledger-3" / "part-00000.parquet").exists()  # dropped, never purged
    assert publisher.retained("t") == set()
