"""The Iceberg keys, and ledgers committed to a real SQLite catalog with pyiceberg: one snapshot per ledger,
flat manifests and metadata over many commits, a delayed commit skipped, time travel by the summary."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compactord.config import settings_from_properties
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
    if uri.startswith("https"):
        assert "a REST catalog is not supported yet" in str(refused.value)


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
