"""The Iceberg table on an s3:// root, and with a REST catalog, against the real daemon, the test broker and the
test S3 server: on an s3:// root the table's metadata is under the root's ``@compactord/iceberg/`` and its
snapshots reference the ledger's part files by their s3:// URLs, which pyiceberg reads with the server's
endpoint. The REST catalog is the test S3 server's own (SeaweedFS's Iceberg REST catalog), reached through a
fault proxy: while it answers 503 a switch succeeds and the table lags one ledger; the next switch brings the
table level. It is sent the token as a bearer token, which is never shown.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.sql import SqlCatalog

from compactord.iceberg.table import ledger_id_of, snapshot_of
from tests.support.daemon import DaemonProcess, compact, metric, status
from tests.support.fault_proxy import FaultProxy
from tests.support.iceberg import PARTITIONS, committed, ledger_id, table_rows, view_rows
from tests.support.s3_server import ACCESS_KEY, BUCKET, REGION, SECRET_KEY, TABLE_BUCKET
from tests.support.waiting import wait_for

from .conftest import Launcher


@pytest.fixture(scope="module")
def s3_root() -> str:
    return f"s3://{BUCKET}/iceberg-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def s3_catalog_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("iceberg-s3") / "catalog.db"


@pytest.fixture(scope="module")
def s3_daemon(launch: Launcher, s3_server: Any, s3_root: str, s3_catalog_db: Path) -> DaemonProcess:
    root: Any = s3_root  # an s3:// root where the launcher takes a folder
    # A replaced ledger stays for an hour, so that the previous ledger's snapshot can be read.
    return launch("iceberg-s3", root=root, icebergCatalogUri=f"sqlite:///{s3_catalog_db}",
                  compactionRetiredLedgerGraceSeconds=3600, **s3_server.daemon_conf())


@pytest.fixture()
def s3_catalog(s3_daemon: DaemonProcess, s3_server: Any, s3_catalog_db: Path) -> Iterator[SqlCatalog]:
    """The daemon's catalog, its tables' files read from the test S3 server as a reader elsewhere would."""
    catalog = SqlCatalog("compactord", uri=f"sqlite:///{s3_catalog_db}", **{
        "s3.endpoint": s3_server.endpoint, "s3.region": REGION, "s3.access-key-id": ACCESS_KEY,
        "s3.secret-access-key": SECRET_KEY, "s3.force-virtual-addressing": "false"})
    yield catalog
    catalog.engine.dispose()


def test_an_s3_root_publishes_its_ledgers_in_place(s3_daemon: DaemonProcess, s3_catalog: SqlCatalog,
                                                   s3_root: str, kafka: Any) -> None:
    topic = kafka.topic(partitions=PARTITIONS, prefix="ices3")
    kafka.produce(topic, [(f"k{i}", f"a{i}", i % PARTITIONS) for i in range(20)])
    compact(s3_daemon, topic)
    first = ledger_id(s3_daemon, topic)
    first_view = view_rows(s3_daemon, topic)
    committed(s3_daemon, s3_catalog, topic)

    kafka.produce(topic, [("k1", None, 1), ("k2", "b2", 0), ("k21", "b21", 1)])
    compact(s3_daemon, topic)
    second = ledger_id(s3_daemon, topic)
    table = committed(s3_daemon, s3_catalog, topic)

    assert table_rows(table.scan().to_arrow()) == view_rows(s3_daemon, topic)
    previous = snapshot_of(table, first)
    assert previous is not None
    assert table_rows(table.scan(snapshot_id=previous.snapshot_id).to_arrow()) == first_view
    assert b"k1" in {key for _, _, key, _ in first_view} - {key for _, _, key, _ in view_rows(s3_daemon, topic)}

    # The metadata under the root's @compactord/iceberg/, the ledger's own files referenced in place.
    assert table.metadata_location.startswith(f"{s3_root}/@compactord/iceberg/")
    files = {task.file.file_path for task in table.scan().plan_files()}
    assert files and {f.rpartition("/")[0] for f in files} == {f"{s3_root}/{topic}/ledger-{second}"}
    assert SECRET_KEY not in s3_daemon.log_text()


@pytest.fixture(scope="module")
def rest_proxy(s3_server: Any) -> Iterator[FaultProxy]:
    """The test S3 server's Iceberg REST catalog, reached through a proxy that answers 503 while refusing."""
    with FaultProxy(int(s3_server.iceberg_uri.rpartition(":")[2])) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def rest_token(s3_server: Any) -> str:
    return str(s3_server.iceberg_token())


@pytest.fixture(scope="module")
def rest_root() -> str:
    return f"s3://{BUCKET}/iceberg-rest-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def rest_daemon(launch: Launcher, s3_server: Any, rest_proxy: FaultProxy, rest_token: str, rest_root: str,
                tmp_path_factory: pytest.TempPathFactory) -> DaemonProcess:
    token = tmp_path_factory.mktemp("rest") / "token"
    token.write_text(rest_token + "\n")
    root: Any = rest_root  # an s3:// root where the launcher takes a folder
    return launch("iceberg-rest", root=root, icebergCatalogUri=rest_proxy.endpoint,
                  icebergCatalogToken=f"file:{token}", **s3_server.daemon_conf())


@pytest.fixture()
def rest_catalog(s3_server: Any) -> RestCatalog:
    """The REST catalog as a reader elsewhere opens it: its OAuth2 credential, the tables' files on the server."""
    return RestCatalog("reader", uri=s3_server.iceberg_uri, credential=f"{ACCESS_KEY}:{SECRET_KEY}", **{
        "s3.endpoint": s3_server.endpoint, "s3.region": REGION, "s3.access-key-id": ACCESS_KEY,
        "s3.secret-access-key": SECRET_KEY, "s3.force-virtual-addressing": "false"})


def _iceberg_warnings(daemon: DaemonProcess, topic: str) -> list[str]:
    return [w for w in status(daemon, topic)["warnings"] if "Iceberg table" in w]


def test_a_rest_catalog_down_during_a_switch_is_caught_up_at_the_next(
        rest_daemon: DaemonProcess, rest_proxy: FaultProxy, rest_token: str, rest_root: str,
        rest_catalog: RestCatalog, kafka: Any) -> None:
    topic = kafka.topic(partitions=PARTITIONS, prefix="icerest")
    kafka.produce(topic, [(f"k{i}", f"a{i}", i % PARTITIONS) for i in range(10)])
    compact(rest_daemon, topic)
    first = ledger_id(rest_daemon, topic)
    first_view = view_rows(rest_daemon, topic)
    committed(rest_daemon, rest_catalog, topic)

    # Down: every request to the catalog answered 503. The switch succeeds; the table lags one ledger.
    rest_proxy.refuse(503)
    try:
        kafka.produce(topic, [("k0", "b0", 0), ("k1", None, 1)])
        compact(rest_daemon, topic)
        second = ledger_id(rest_daemon, topic)
        failed = f"topic {topic}: its Iceberg table not committed"
        wait_for(lambda: failed in rest_daemon.log_text(), 120, "the failed commit's log line", rest_daemon)
        assert metric(rest_daemon, "compactord_iceberg_lag_ledgers", topic=topic) == 1
        assert rest_daemon.log_text().count(failed) == 1
        assert "Traceback" not in rest_daemon.log_text()
        assert {key for _, _, key, _ in view_rows(rest_daemon, topic)} == {f"k{i}".encode() for i in range(10)} - {b"k1"}
        [warning] = _iceberg_warnings(rest_daemon, topic)
        assert f"its Iceberg table compactord.{topic} is 1 ledger(s) behind" in warning
        assert "last commit error: ServiceUnavailableError" in warning and "\n" not in warning
        assert rest_proxy.faulted  # the catalog was asked, and answered 503
        assert ledger_id_of(rest_catalog.load_table(("compactord", topic)).current_snapshot()) == first
    finally:
        rest_proxy.heal()

    # Up: the next switch commits the newest ledger and brings the table level.
    kafka.produce(topic, [("k2", "c2", 0), ("k11", "c11", 1)])
    compact(rest_daemon, topic)
    third = ledger_id(rest_daemon, topic)
    table = committed(rest_daemon, rest_catalog, topic)
    assert table_rows(table.scan().to_arrow()) == view_rows(rest_daemon, topic)
    assert _iceberg_warnings(rest_daemon, topic) == []
    assert snapshot_of(table, second) is None  # the ledger of the outage was never the table's
    previous = snapshot_of(table, first)
    assert previous is not None
    assert table_rows(table.scan(snapshot_id=previous.snapshot_id).to_arrow()) == first_view
    # The catalog chose where the metadata lives (its table bucket on the same server); the ledger's own files
    # are referenced in place.
    assert table.metadata_location.startswith(f"s3://{TABLE_BUCKET}/compactord/{topic}/")
    files = {task.file.file_path for task in table.scan().plan_files()}
    assert files and {f.rpartition("/")[0] for f in files} == {f"{rest_root}/{topic}/ledger-{third}"}

    # The catalog accepts a request only with a valid bearer token: the token was sent as one. Neither it, the
    # catalog's URI nor the store's secret is shown.
    info = rest_daemon.http.get("/v1/info").text
    for secret in (rest_token, rest_proxy.endpoint, SECRET_KEY):
        assert secret not in rest_daemon.log_text()
        assert secret not in info
