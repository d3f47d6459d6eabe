"""The compacted view as an Iceberg table (icebergCatalogUri), against the real daemon, the test broker and a
SQLite catalog: each switch commits one snapshot that references the ledger's files in place; pyiceberg and
DuckDB (offline: ``read_parquet`` of the planned files) read what the HTTP view serves; a catalog that cannot be
written during a switch fails no compaction, and the next switch brings the table level.
"""

from __future__ import annotations

import base64
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from compactord.iceberg.table import ledger_id_of, snapshot_of, summary_of
from tests.support.daemon import DaemonProcess, compact
from tests.support.waiting import wait_for

from .conftest import Launcher, metric

PARTITIONS = 2
# What a query of the table filters: the ledger's tombstones (a null value) and deletion markers are
# rows of its files, which the snapshot references as they are.
LIVE = "value IS NOT NULL AND NOT marker"  # as docs/design.md and the README write it
Row = tuple[int, int, bytes, bytes]  # partition, offset, key, value


@pytest.fixture(scope="module")
def catalog_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("iceberg") / "catalog.db"


@pytest.fixture(scope="module")
def daemon(launch: Launcher, catalog_db: Path) -> DaemonProcess:
    secret = catalog_db.parent / "catalog-uri"
    secret.write_text(f"sqlite:///{catalog_db}\n")
    # A replaced ledger stays for an hour, so that the previous ledger's snapshot can be read.
    return launch("iceberg", icebergCatalogUri=f"file:{secret}", compactionRetiredLedgerGraceSeconds=3600)


@pytest.fixture()
def catalog(daemon: DaemonProcess, catalog_db: Path) -> Iterator[SqlCatalog]:
    catalog = SqlCatalog("compactord", uri=f"sqlite:///{catalog_db}")  # the name the daemon's catalog has
    yield catalog
    catalog.engine.dispose()


def _view(daemon: DaemonProcess, topic: str, ledger_id: int | None = None) -> set[Row]:
    rows: set[Row] = set()
    for partition in range(PARTITIONS):
        params: dict[str, Any] = {"partition": partition, "limit": 10000}
        if ledger_id is not None:
            params["ledger_id"] = ledger_id
        response = daemon.http.get(f"/v1/topics/{topic}/compacted", params=params)
        assert response.status_code == 200, response.text
        rows |= {(e["partition"], e["offset"], base64.b64decode(e["key"]), base64.b64decode(e["value"]))
                 for e in response.json()["entries"] if e["value"] is not None}
    return rows


def _ledger_id(daemon: DaemonProcess, topic: str) -> int:
    response = daemon.http.get(f"/v1/topics/{topic}/horizon")
    assert response.status_code == 200, response.text
    return int(response.json()["ledger_id"])


def _rows(table: pa.Table) -> set[Row]:
    live = table.filter(pa.compute.and_(table["value"].is_valid(), pa.compute.invert(table["marker"])))
    return set(zip(live["partition"].to_pylist(), live["offset"].to_pylist(), live["key"].to_pylist(),
                   live["value"].to_pylist(), strict=True))


def _committed(daemon: DaemonProcess, catalog: SqlCatalog, topic: str) -> Table:
    """The topic's table once it names the topic's current ledger and its lag is 0."""
    current = _ledger_id(daemon, topic)

    def level() -> Table | None:
        if metric(daemon, "compactord_iceberg_lag_ledgers", topic=topic) != 0:
            return None
        try:
            table = catalog.load_table(("compactord", topic))
        except NoSuchTableError:
            return None
        return table if ledger_id_of(table.current_snapshot()) == current else None

    return wait_for(level, 60, f"topic {topic}'s table at ledger {current}", daemon)


def test_each_switch_is_a_snapshot_that_engines_read(daemon: DaemonProcess, catalog: SqlCatalog,
                                                     kafka: Any) -> None:
    topic = kafka.topic(partitions=PARTITIONS, prefix="ice")
    kafka.produce(topic, [(f"k{i}", f"a{i}", i % PARTITIONS) for i in range(20)])
    compact(daemon, topic)
    first = _ledger_id(daemon, topic)
    first_view = _view(daemon, topic)
    _committed(daemon, catalog, topic)

    # k1 deleted (a tombstone), k2 and k3 updated, k21 new
    kafka.produce(topic, [("k1", None, 1), ("k2", "b2", 0), ("k3", "b3", 1), ("k21", "b21", 1)])
    compact(daemon, topic)
    second_view = _view(daemon, topic)
    table = _committed(daemon, catalog, topic)

    current = table.scan().to_arrow()
    assert _rows(current) == second_view
    assert b"k1" not in {key for _, _, key, _ in _rows(current)}
    previous = snapshot_of(table, first)
    assert previous is not None
    assert _rows(table.scan(snapshot_id=previous.snapshot_id).to_arrow()) == first_view == \
        _view(daemon, topic, ledger_id=first)
    assert b"k1" in {key for _, _, key, _ in _rows(table.scan(snapshot_id=previous.snapshot_id).to_arrow())}

    # One snapshot per ledger, its summary naming the ledger, its horizon and strategy; two manifests only.
    snapshot = table.current_snapshot()
    assert snapshot is not None
    horizon = daemon.http.get(f"/v1/topics/{topic}/horizon").json()
    assert summary_of(snapshot) == {"ledger_id": horizon["ledger_id"], "strategy": "publishing-order",
                                    "horizon": {p["partition"]: p["offset"] for p in horizon["partitions"]}}
    assert [ledger_id_of(s) for s in table.snapshots()] == [first, horizon["ledger_id"]]
    assert len(snapshot.manifests(table.io)) == 2

    # DuckDB, offline: the snapshot's planned files through read_parquet (no extension downloaded).
    files = [task.file.file_path.removeprefix("file://") for task in table.scan().plan_files()]
    # the ledger's own files, in place
    assert files and {Path(f).parent for f in files} == {(daemon.root / topic / f"ledger-{horizon['ledger_id']}")}
    with duckdb.connect() as db:
        found = db.execute(f"SELECT partition, \"offset\", key, value FROM read_parquet(?) WHERE {LIVE}",
                           [files]).fetchall()
    assert {(p, o, bytes(k), bytes(v)) for p, o, k, v in found} == second_view

    # The catalog's URI (it may hold a password) is in neither the log nor /v1/info.
    uri = f"sqlite:///{catalog.properties['uri'].removeprefix('sqlite:///')}"
    assert uri not in daemon.log_text()
    assert uri not in daemon.http.get("/v1/info").text


def test_a_catalog_that_cannot_be_written_fails_no_compaction(daemon: DaemonProcess, catalog: SqlCatalog,
                                                              catalog_db: Path, kafka: Any) -> None:
    topic = kafka.topic(partitions=PARTITIONS, prefix="ice")
    kafka.produce(topic, [(f"k{i}", f"a{i}", i % PARTITIONS) for i in range(10)])
    compact(daemon, topic)
    _committed(daemon, catalog, topic)

    failed = f"topic {topic}: its Iceberg table not committed"
    lock = sqlite3.connect(catalog_db, isolation_level=None)
    try:
        lock.execute("BEGIN EXCLUSIVE")  # the catalog cannot be read or written until the rollback
        kafka.produce(topic, [("k0", "b0", 0), ("k1", None, 1)])
        compact(daemon, topic)  # succeeds all the same
        wait_for(lambda: failed in daemon.log_text(), 120, "the failed commit's log line", daemon)
        assert metric(daemon, "compactord_iceberg_lag_ledgers", topic=topic) == 1
        assert daemon.log_text().count(failed) == 1
        assert "Traceback" not in daemon.log_text()
        assert {key for _, _, key, _ in _view(daemon, topic)} == {f"k{i}".encode() for i in range(10)} - {b"k1"}
    finally:
        lock.execute("ROLLBACK")
        lock.close()

    kafka.produce(topic, [("k2", "c2", 0)])
    compact(daemon, topic)
    table = _committed(daemon, catalog, topic)
    assert _rows(table.scan().to_arrow()) == _view(daemon, topic)
