"""The Iceberg keys, and ledgers committed to a real SQLite catalog with pyiceberg: one snapshot per ledger,
flat manifests and metadata over many commits, a delayed commit skipped, time travel by the summary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compactord.config import ENV_PREFIX, settings_from_properties
from compactord.errors import ConfigError
from compactord.iceberg.table import commit_ledger, ledger_id_of, open_catalog, snapshot_of, summary_of
from compactord.model import RECORD_SCHEMA, LedgerManifest, StrategySettings

TOPIC = "orders.v1"  # a dot: the table is named as the topic, exactly


def test_iceberg_is_off_by_default_and_takes_a_sql_catalog() -> None:
    assert settings_from_properties({}, env={}).iceberg_catalog_uri == ""
    settings = settings_from_properties({"icebergCatalogUri": "postgresql+psycopg://u:pw@db/cat"}, env={})
    assert settings.iceberg_catalog_uri == "postgresql+psycopg://u:pw@db/cat"
    assert (settings.iceberg_namespace, settings.iceberg_snapshots_retained) == ("compactord", 5)


@pytest.mark.parametrize("uri", ["https://user:s3cret@catalog.example/v1", "mysql://user:s3cret@db/x", "s3cret"])
def test_a_catalog_uri_refused_is_never_shown(uri: str) -> None:
    with pytest.raises(ConfigError) as refused:
        settings_from_properties({"icebergCatalogUri": uri}, env={})
    assert "s3cret" not in str(refused.value)
    assert "icebergCatalogUri" in str(refused.value)
    assert "'<not shown>'" in str(refused.value)


def test_a_rest_catalog_takes_its_token_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t0ken-s3cret\n")
    settings = settings_from_properties({"icebergCatalogUri": "https://catalog.example/api/catalog/",
                                         "icebergCatalogToken": f"file:{tmp_path / 'token'}"}, env={})
    assert (settings.iceberg_catalog_uri, settings.iceberg_catalog_token) == (
        "https://catalog.example/api/catalog", "t0ken-s3cret")


def test_a_token_without_a_rest_catalog_is_refused_unshown() -> None:
    with pytest.raises(ConfigError) as refused:
        settings_from_properties({"icebergCatalogUri": "sqlite:////var/lib/c.db", "icebergCatalogToken": "s3cret"},
                                 env={})
    assert str(refused.value) == ("config key icebergCatalogToken='<not shown>' is invalid: is sent to a REST "
                                  "catalog only: set icebergCatalogUri to its http:// or https:// URL, or leave "
                                  "icebergCatalogToken empty")


@pytest.mark.parametrize("line", ["icebergCatalogUri=mysql://user:s3cret@db/x",
                                  "icebergCatalogUri=sqlite:////var/lib/s3cret/catalog.db\nclusterName=prod"])
def test_a_catalog_refused_at_start_exits_2_with_one_line_naming_what_is_allowed(tmp_path: Path,
                                                                                 line: str) -> None:
    (tmp_path / "broker.conf").write_text(line + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    done = subprocess.run([sys.executable, "-m", "compactord", "run", "--config", "broker.conf"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "s3cret" not in done.stderr
    prefix = "compactord: cannot start: config key icebergCatalogUri='<not shown>' is invalid: "
    if "clusterName" in line:
        assert done.stderr.strip() == prefix + (
            "a SQLite catalog cannot be shared by the members of cluster prod (clusterName): use a PostgreSQL "
            "catalog (postgresql://USER:PASSWORD@HOST/DB) or a REST catalog (https://...)")
    else:
        assert done.stderr.startswith(prefix + "the scheme mysql:// is not supported: expected a SQL catalog's "
                                      "SQLAlchemy URL"), done.stderr
        assert "a REST catalog's http:// or https:// URL" in done.stderr


def test_a_cluster_takes_a_postgresql_or_rest_catalog() -> None:
    for uri in ("postgresql://u:pw@db/cat", "https://catalog.example"):
        settings = settings_from_properties({"icebergCatalogUri": uri, "clusterName": "prod"}, env={})
        assert settings.iceberg_catalog_uri == uri


def test_the_namespace_is_one_plain_level() -> None:
    with pytest.raises(ConfigError, match="icebergNamespace"):
        settings_from_properties({"icebergNamespace": "a.b"}, env={})


def _ledger(folder: Path, ledger_id: int, keys: int) -> tuple[LedgerManifest, list[str]]:
    n = keys
    rows = {"partition": [i % 2 for i in range(n)], "offset": list(range(n)), "timestamp": [0] * n,
            "key": [b"k%d" % i for i in range(n)], "value": [b"v%d-%d" % (ledger_id, i) for i in range(n)],
            "headers": [[]] * n, "event_time": [None] * n, "marker": [False] * n, "marker_at": [None] * n}
    path = folder / f"ledger-{ledger_id}" / "part-00000.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.table(rows, schema=RECORD_SCHEMA), path)
    manifest = LedgerManifest(ledger_id=ledger_id, topic=TOPIC, horizon={0: n, 1: n + 1},
                              strategy=StrategySettings(), files=[])
    return manifest, [str(path)]


def test_many_switches_keep_the_table_flat(tmp_path: Path) -> None:
    catalog = open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", (tmp_path / "warehouse").as_uri())
    for ledger_id in range(1, 26):
        assert commit_ledger(catalog, "compactord", *_ledger(tmp_path, ledger_id, ledger_id), retained=3)
    table = catalog.load_table(("compactord", TOPIC))
    current = table.current_snapshot()
    assert current is not None
    # one snapshot per ledger, the last three kept; two manifests (added, deleted) whatever the count of commits
    assert [ledger_id_of(s) for s in table.snapshots()] == [23, 24, 25]
    assert len(current.manifests(table.io)) == 2
    assert len(list((tmp_path / "warehouse").rglob("*.metadata.json"))) <= 4
    assert summary_of(current) == {"ledger_id": 25, "horizon": {0: 25, 1: 26}, "strategy": "publishing-order"}
    assert table.scan().to_arrow().num_rows == 25
    previous = snapshot_of(table, 24)
    assert previous is not None
    assert table.scan(snapshot_id=previous.snapshot_id).to_arrow()["value"].to_pylist()[0] == b"v24-0"

    # a delayed commit of an older ledger (or the same one again) changes nothing
    assert not commit_ledger(catalog, "compactord", *_ledger(tmp_path / "late", 20, 3), retained=3)
    assert catalog.load_table(("compactord", TOPIC)).current_snapshot() == current
