"""The compacted view as an Iceberg table (icebergCatalogUri), against the real daemon, the test broker and a
SQLite catalog: each switch commits one snapshot that references the ledger's files in place; pyiceberg and
DuckDB (offline: ``read_parquet`` of the planned files) read what the HTTP view serves; a catalog that cannot be
written during a switch fails no compaction (the topic's status names the lag until the next switch brings the
table level); ``iceberg: false`` leaves a topic out; a deleted topic's table is dropped. A daemon restarted with
Iceberg enabled catches an idle topic's table up at start, and keeps the ledgers of the retained snapshots past
their grace, deleting the older ones once expired from the table.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import ManifestContent

from compactord.iceberg.table import ledger_id_of, snapshot_of, summary_of
from tests.support.daemon import DaemonProcess, compact, metric, status
from tests.support.iceberg import PARTITIONS, committed, ledger_id, table_rows, view_rows
from tests.support.waiting import wait_for

from .conftest import Launcher


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


def test_each_switch_is_a_snapshot_that_engines_read(daemon: DaemonProcess, catalog: SqlCatalog,
                                                     kafka: Any) -> None:
    topic = kafka.topic(partitions=PARTITIONS, prefix="ice")
    kafka.produce(topic, [(f"k{i}", f"a{i}", i % PARTITIONS) for i in range(20)])
    compact(daemon, topic)
    first = ledger_id(daemon, topic)
    first_view = view_rows(daemon, topic)
    committed(daemon, catalog, topic)

    # k1 deleted (a tombstone), k2 and k3 updated, k21 new
    kafka.produce(topic, [("k1", None, 1), ("k2", "b2", 0), ("k3", "b3", 1), ("k21", "b21", 1)])
    compact(daemon, topic)
    second_view = view_rows(daemon, topic)
    table = committed(daemon, catalog, topic)

    current = table.scan().to_arrow()
    assert table_rows(current) == second_view
    assert b"k1" not in {key for _, _, key, _ in table_rows(current)}
    previous = snapshot_of(table, first)
    assert previous is not None
    assert table_rows(table.scan(snapshot_id=previous.snapshot_id).to_arrow()) == first_view == \
        view_rows(daemon, topic, ledger_id=first)
    assert b"k1" in {key for _, _, key, _ in table_rows(table.scan(snapshot_id=previous.snapshot_id).to_arrow())}

    # One snapshot per ledger, its summary naming the ledger, its horizon and strategy.
    snapshot = table.current_snapshot()
    assert snapshot is not None
    horizon = daemon.http.get(f"/v1/topics/{topic}/horizon").json()
    assert summary_of(snapshot) == {"ledger_id": horizon["ledger_id"], "strategy": "publishing-order",
                                    "horizon": {p["partition"]: p["offset"] for p in horizon["partitions"]}}
    assert [ledger_id_of(s) for s in table.snapshots()] == [first, horizon["ledger_id"]]

    # The table's rows are the view's live keys: a tombstone the ledger keeps is removed by the snapshot's delete
    # file (one manifest of them beside the ledger's data files, added and deleted).
    tasks = list(table.scan().plan_files())
    # the ledger's own files, in place
    files = {task.file.file_path.removeprefix("file://") for task in tasks}
    assert files and {Path(f).parent for f in files} == {(daemon.root / topic / f"ledger-{horizon['ledger_id']}")}
    deletes = any(task.delete_files for task in tasks)
    contents = [m.content for m in snapshot.manifests(table.io)]
    assert (contents.count(ManifestContent.DATA), contents.count(ManifestContent.DELETES)) == (2, int(deletes))

    # DuckDB, offline (no extension downloaded): the scan handed over with its deletes applied.
    with duckdb.connect() as db:
        table.scan().to_duckdb("view", connection=db)
        found = db.execute('SELECT partition, "offset", key, value FROM view').fetchall()
    assert {(p, o, bytes(k), bytes(v)) for p, o, k, v in found} == second_view

    # The catalog's URI (it may hold a password) is in neither the log nor /v1/info.
    uri = f"sqlite:///{catalog.properties['uri'].removeprefix('sqlite:///')}"
    assert uri not in daemon.log_text()
    assert uri not in daemon.http.get("/v1/info").text


def _iceberg_warnings(daemon: DaemonProcess, topic: str) -> list[str]:
    return [w for w in status(daemon, topic)["warnings"] if "Iceberg table" in w]


def test_a_catalog_that_cannot_be_written_fails_no_compaction(daemon: DaemonProcess, catalog: SqlCatalog,
                                                              catalog_db: Path, kafka: Any) -> None:
    topic = kafka.topic(partitions=PARTITIONS, prefix="ice")
    kafka.produce(topic, [(f"k{i}", f"a{i}", i % PARTITIONS) for i in range(10)])
    compact(daemon, topic)
    committed(daemon, catalog, topic)

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
        assert {key for _, _, key, _ in view_rows(daemon, topic)} == {f"k{i}".encode() for i in range(10)} - {b"k1"}
        # the topic's status names the lag and the commit's error (its first line)
        [warning] = _iceberg_warnings(daemon, topic)
        assert f"its Iceberg table compactord.{topic} is 1 ledger(s) behind" in warning
        assert "last commit error: OperationalError" in warning and "\n" not in warning
    finally:
        lock.execute("ROLLBACK")
        lock.close()

    kafka.produce(topic, [("k2", "c2", 0)])
    compact(daemon, topic)
    table = committed(daemon, catalog, topic)
    assert table_rows(table.scan().to_arrow()) == view_rows(daemon, topic)
    assert _iceberg_warnings(daemon, topic) == []


def test_a_topic_whose_policy_says_iceberg_false_is_left_out(daemon: DaemonProcess, catalog: SqlCatalog,
                                                            kafka: Any) -> None:
    out, published = (kafka.topic(partitions=PARTITIONS, prefix="ice") for _ in range(2))
    response = daemon.http.put(f"/v1/topics/{out}/policies", json={"iceberg": False})
    assert response.status_code == 200, response.text
    assert response.json()["policies"]["iceberg"] is False and response.json()["effective"]["iceberg"] is False
    refused = daemon.http.put(f"/v1/topics/{out}/policies", json={"iceberg": "no"})
    assert refused.status_code == 422 and "iceberg must be true, false or null" in refused.text
    for topic in (out, published):
        kafka.produce(topic, [("k", "v", 0)])
        compact(daemon, topic)
    committed(daemon, catalog, published)  # the publisher took the topics in the order they switched
    assert not catalog.table_exists(("compactord", out))
    assert metric(daemon, "compactord_iceberg_lag_ledgers", topic=out) == 0


def test_a_deleted_topics_table_is_dropped(daemon: DaemonProcess, catalog: SqlCatalog, kafka: Any) -> None:
    topic = kafka.topic(partitions=PARTITIONS, prefix="ice")
    kafka.produce(topic, [(f"k{i}", "v", i % PARTITIONS) for i in range(4)])
    compact(daemon, topic)
    committed(daemon, catalog, topic)
    response = daemon.http.delete(f"/v1/topics/{topic}")
    assert response.status_code == 200, response.text
    wait_for(lambda: not catalog.table_exists(("compactord", topic)), 60, f"topic {topic}'s table dropped", daemon)
    assert f"topic {topic}: its Iceberg table compactord.{topic} dropped" in daemon.log_text()


# -- a daemon that starts with Iceberg on a root compacted without it ---------------------------------------


@pytest.fixture(scope="module")
def idle_topic(kafka: Any) -> str:
    return str(kafka.topic(partitions=PARTITIONS, prefix="idle"))


@pytest.fixture(scope="module")
def restarted(launch: Launcher, tmp_path_factory: pytest.TempPathFactory, kafka: Any,
              idle_topic: str) -> tuple[DaemonProcess, Path]:
    """A daemon started with Iceberg (two snapshots retained, a replaced ledger's grace of a second) on a root
    where a daemon without Iceberg compacted ``idle_topic``, which is not compacted again."""
    before = launch("plain")
    try:
        kafka.produce(idle_topic, [(f"k{i}", f"v{i}", i % PARTITIONS) for i in range(6)])
        compact(before, idle_topic)
    finally:
        before.stop()
    catalog_db = tmp_path_factory.mktemp("iceberg-restarted") / "catalog.db"
    return launch("restarted", root=before.root, icebergCatalogUri=f"sqlite:///{catalog_db}",
                  icebergSnapshotsRetained=2, compactionRetiredLedgerGraceSeconds=1), catalog_db


@pytest.fixture()
def restarted_catalog(restarted: tuple[DaemonProcess, Path]) -> Iterator[SqlCatalog]:
    catalog = SqlCatalog("compactord", uri=f"sqlite:///{restarted[1]}")
    yield catalog
    catalog.engine.dispose()


def test_the_catch_up_at_start_makes_an_idle_topics_table(restarted: tuple[DaemonProcess, Path],
                                                          restarted_catalog: SqlCatalog, idle_topic: str) -> None:
    daemon, _ = restarted
    table = committed(daemon, restarted_catalog, idle_topic)
    assert table_rows(table.scan().to_arrow()) == view_rows(daemon, idle_topic)


def test_the_retained_snapshots_keep_their_ledgers_past_the_grace(restarted: tuple[DaemonProcess, Path],
                                                                  restarted_catalog: SqlCatalog,
                                                                  kafka: Any) -> None:
    daemon, _ = restarted
    topic = kafka.topic(partitions=PARTITIONS, prefix="ice")
    ledgers = []
    for round_ in range(4):
        kafka.produce(topic, [(f"k{i}", f"r{round_}-{i}", i % PARTITIONS) for i in range(4)])
        compact(daemon, topic)
        ledgers.append(ledger_id(daemon, topic))
        committed(daemon, restarted_catalog, topic)
    folder = daemon.root / topic
    # the older ledgers go once expired from the table (expiry before deletion)
    wait_for(lambda: not any((folder / f"ledger-{i}").exists() for i in ledgers[:2]), 60,
             f"ledgers {ledgers[:2]} of topic {topic} deleted", daemon)
    # the third is past its grace (compactord's own API no longer serves it) but a retained snapshot names it
    wait_for(lambda: daemon.http.get(f"/v1/topics/{topic}/compacted",
                                     params={"partition": 0, "ledger_id": ledgers[2]}).status_code == 410,
             60, f"ledger {ledgers[2]} past its grace", daemon)
    table = restarted_catalog.load_table(("compactord", topic))
    assert sorted(i for s in table.snapshots() if (i := ledger_id_of(s)) is not None) == ledgers[2:]
    for kept in ledgers[2:]:
        assert (folder / f"ledger-{kept}").is_dir()
        snapshot = snapshot_of(table, kept)
        assert snapshot is not None
        assert table.scan(snapshot_id=snapshot.snapshot_id).to_arrow().num_rows == 4  # its files are there
