"""The Iceberg table on an s3:// root, and with a REST catalog, against the real daemon, the test broker and the
test S3 server: on an s3:// root the table's metadata is under the root's ``@compactord/iceberg/`` and its
snapshots reference the ledger's part files by their s3:// URLs, which pyiceberg reads with the server's
endpoint; a REST catalog that answers 503 fails no compaction, and is sent the token as a bearer token.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from compactord.iceberg.table import snapshot_of
from tests.support.daemon import DaemonProcess, compact, metric
from tests.support.iceberg import PARTITIONS, committed, ledger_id, table_rows, view_rows
from tests.support.json_server import JsonHandler, serving
from tests.support.s3_server import ACCESS_KEY, BUCKET, REGION, SECRET_KEY
from tests.support.waiting import wait_for

from .conftest import Launcher

TOKEN = "rest-t0ken-never-logged"


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


class Unavailable(JsonHandler):
    """A REST catalog that is down: 503 to everything; the Authorization header of each request is kept."""

    authorizations: list[str]

    def _unavailable(self) -> None:
        self.authorizations.append(self.headers.get("Authorization", ""))
        self.send_json({"error": {"message": "catalog down", "type": "ServiceUnavailableException",
                                  "code": 503}}, 503)

    do_GET = do_POST = do_HEAD = do_DELETE = _unavailable


@pytest.fixture(scope="module")
def rest_requests() -> list[str]:
    return []


@pytest.fixture(scope="module")
def rest_port(rest_requests: list[str]) -> Iterator[int]:
    with serving(Unavailable, authorizations=rest_requests) as port:
        yield port


@pytest.fixture(scope="module")
def rest_daemon(launch: Launcher, rest_port: int, tmp_path_factory: pytest.TempPathFactory) -> DaemonProcess:
    token = tmp_path_factory.mktemp("rest") / "token"
    token.write_text(TOKEN + "\n")
    return launch("iceberg-rest", icebergCatalogUri=f"http://127.0.0.1:{rest_port}/catalog",
                  icebergCatalogToken=f"file:{token}")


def test_a_rest_catalog_that_answers_503_fails_no_compaction(rest_daemon: DaemonProcess, rest_port: int,
                                                            rest_requests: list[str], kafka: Any) -> None:
    topic = kafka.topic(partitions=PARTITIONS, prefix="icerest")
    kafka.produce(topic, [(f"k{i}", f"a{i}", i % PARTITIONS) for i in range(10)])
    compact(rest_daemon, topic)  # succeeds all the same

    failed = f"topic {topic}: its Iceberg table not committed"
    wait_for(lambda: failed in rest_daemon.log_text(), 120, "the failed commit's log line", rest_daemon)
    assert metric(rest_daemon, "compactord_iceberg_lag_ledgers", topic=topic) == 1
    assert rest_daemon.log_text().count(failed) == 1
    assert "Traceback" not in rest_daemon.log_text()
    assert {key for _, _, key, _ in view_rows(rest_daemon, topic)} == {f"k{i}".encode() for i in range(10)}

    # The catalog was asked, with the token as a bearer token; neither it nor the URI is shown.
    assert rest_requests and set(rest_requests) == {f"Bearer {TOKEN}"}
    info = rest_daemon.http.get("/v1/info").text
    for secret in (TOKEN, f"127.0.0.1:{rest_port}/catalog"):
        assert secret not in rest_daemon.log_text()
        assert secret not in info
