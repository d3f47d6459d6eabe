"""The Iceberg table holds a ledger's live keys only, with the ledger's files referenced in place: real part
files written by ``write_part``, a real SQLite catalog, pyiceberg's scans and DuckDB (offline, ``to_duckdb``)
reading them. The markers and tombstones are removed by a position delete file in each ledger's snapshot, and
the table's own files stay those of its retained snapshots over many commits."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import DataFileContent, ManifestContent
from pyiceberg.table import Table

from compactord.iceberg.table import commit_ledger, deleted_positions, ledger_id_of, open_catalog, snapshot_of
from compactord.ledger.parts import part_name, write_part
from compactord.model import RECORD_SCHEMA, LedgerManifest, StrategySettings
from compactord.storage import LocalStore

TOPIC = "orders.v1"
NAMESPACE = "compactord"
EVENT_TIME = StrategySettings(strategy="event-time")

Row = tuple[bytes | None, bytes | None, bool]  # key, value, marker


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[Catalog]:
    catalog = open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", (tmp_path / "warehouse").as_uri())
    assert isinstance(catalog, SqlCatalog)
    yield catalog
    catalog.engine.dispose()  # the SQLite file closed


def _ledger(root: Path, ledger_id: int, partitions: dict[int, list[list[Row]]],
            strategy: StrategySettings = EVENT_TIME) -> tuple[LedgerManifest, list[str]]:
    """A ledger folder of ``root`` as a compaction leaves it: one part per partition, written by ``write_part``
    from its row groups (each inner list one group), the rows' offsets counting up from 0."""
    store = LocalStore(root)
    paths = []
    for partition, groups in sorted(partitions.items()):
        tables, offset = [], 0
        for group in groups:
            n = len(group)
            tables.append(pa.table({
                "partition": [partition] * n, "offset": list(range(offset, offset + n)), "timestamp": [0] * n,
                "key": [k for k, _, _ in group], "value": [v for _, v, _ in group], "headers": [[]] * n,
                "event_time": [0] * n, "marker": [m for _, _, m in group],
                "marker_at": [1 if m else None for _, _, m in group]}, schema=RECORD_SCHEMA))
            offset += n
        key = f"{TOPIC}/ledger-{ledger_id}/{part_name(partition)}"
        write_part(tables, store, key)
        paths.append(str(root / key))
    horizon = {p: sum(len(g) for g in groups) for p, groups in partitions.items()}
    return LedgerManifest(ledger_id=ledger_id, topic=TOPIC, horizon=horizon, strategy=strategy, files=[]), paths


def _live(key: bytes, value: bytes) -> Row:
    return key, value, False


def _marker(key: bytes) -> Row:
    return key, None, True


def _tombstone(key: bytes) -> Row:
    return key, None, False


def _rows(table: Table, snapshot_id: int | None = None) -> dict[bytes | None, bytes | None]:
    scanned = table.scan(snapshot_id=snapshot_id).to_arrow() if snapshot_id else table.scan().to_arrow()
    return dict(zip(scanned["key"].to_pylist(), scanned["value"].to_pylist(), strict=True))


def test_markers_and_tombstones_are_no_row_of_any_snapshot(tmp_path: Path, catalog: Catalog) -> None:
    first = {0: [[_live(b"a", b"a1"), _live(b"b", b"b1"), _marker(b"x")]], 1: [[_live(b"c", b"c1")]]}
    # ledger 2: b tombstoned (a null value without the marker flag is a deletion too), c a marker; an unkeyed
    # record without a value deletes no key and stays a row; the deletions fall in several row groups
    second = {0: [[_live(b"a", b"a2"), _tombstone(b"b")], [_marker(b"x"), (None, None, False)]],
              1: [[_marker(b"c")], [_live(b"d", b"d2")]]}
    assert commit_ledger(catalog, NAMESPACE, *_ledger(tmp_path / "root", 1, first), retained=5)
    assert commit_ledger(catalog, NAMESPACE, *_ledger(tmp_path / "root", 2, second), retained=5)
    table = catalog.load_table((NAMESPACE, TOPIC))

    assert _rows(table) == {b"a": b"a2", b"d": b"d2", None: None}
    one = snapshot_of(table, 1)
    assert one is not None
    assert _rows(table, one.snapshot_id) == {b"a": b"a1", b"b": b"b1", b"c": b"c1"}  # its own live keys
    for snapshot in table.snapshots():
        scanned = table.scan(snapshot_id=snapshot.snapshot_id).to_arrow()
        assert not any(scanned["marker"].to_pylist())

    # the ledger's files are referenced where they are, unchanged; the delete file is the table's own
    tasks = list(table.scan().plan_files())
    assert sorted(t.file.file_path for t in tasks) == sorted(_ledger_files(tmp_path / "root", 2))
    delete_files = {d.file_path for t in tasks for d in t.delete_files}
    assert len(delete_files) == 1
    (delete_file,) = delete_files
    assert delete_file.startswith(table.location() + "/data/")
    written = pq.read_table(delete_file.removeprefix("file://"))
    assert written.schema.field("file_path").metadata == {b"PARQUET:field_id": b"2147483546"}
    assert written.schema.field("pos").metadata == {b"PARQUET:field_id": b"2147483545"}
    part0, part1 = sorted(_ledger_files(tmp_path / "root", 2))
    assert list(zip(written["file_path"].to_pylist(), written["pos"].to_pylist(), strict=True)) == \
        [(part0, 1), (part0, 2), (part1, 0)]
    current = table.current_snapshot()
    assert current is not None
    assert {e.data_file.content for m in current.manifests(table.io) if m.content == ManifestContent.DELETES
            for e in m.fetch_manifest_entry(table.io)} == {DataFileContent.POSITION_DELETES}


def _ledger_files(root: Path, ledger_id: int) -> list[str]:
    return [str(p) for p in (root / TOPIC / f"ledger-{ledger_id}").glob("*.parquet")]


def test_duckdb_reads_the_live_keys_offline(tmp_path: Path, catalog: Catalog) -> None:
    ledger = {0: [[_live(b"k%d" % i, b"v%d" % i) if i % 3 else _marker(b"k%d" % i) for i in range(30)]],
              1: [[_tombstone(b"t"), _live(b"u", b"u1")]]}
    assert commit_ledger(catalog, NAMESPACE, *_ledger(tmp_path / "root", 7, ledger), retained=5)
    scan = catalog.load_table((NAMESPACE, TOPIC)).scan()
    connection = scan.to_duckdb("orders")
    keys = connection.execute("SELECT key, value, marker FROM orders ORDER BY key").fetchall()
    live = [*sorted((b"k%d" % i, b"v%d" % i, False) for i in range(30) if i % 3), (b"u", b"u1", False)]
    assert keys == live

    # a reader without delete support applies the planned delete files itself (docs/design.md)
    tasks = list(scan.plan_files())
    files = [t.file.file_path for t in tasks]
    deletes = sorted({d.file_path.removeprefix("file://") for t in tasks for d in t.delete_files})
    planned = connection.execute(
        "SELECT key, value, marker FROM read_parquet(?, filename = true, file_row_number = true) AS r "
        "ANTI JOIN read_parquet(?) AS d ON d.file_path = r.filename AND d.pos = r.file_row_number ORDER BY key",
        [files, deletes]).fetchall()
    assert planned == live


def test_an_event_time_ledger_keeps_its_markers_in_its_files_only(tmp_path: Path, catalog: Catalog) -> None:
    groups = [[_marker(b"m%d-%d" % (g, i)) if i % 2 else _live(b"k%d-%d" % (g, i), b"v") for i in range(50)]
              for g in range(4)]
    manifest, paths = _ledger(tmp_path / "root", 3, {0: groups})
    assert commit_ledger(catalog, NAMESPACE, manifest, paths, retained=5)
    rows = catalog.load_table((NAMESPACE, TOPIC)).scan().to_arrow()
    assert rows.num_rows == 100
    assert not any(rows["marker"].to_pylist())
    assert all(key.startswith(b"k") for key in rows["key"].to_pylist())
    assert pq.read_table(paths[0]).num_rows == 200  # the ledger keeps its markers for its other readers
    assert deleted_positions(paths[0]).to_pylist() == list(range(1, 200, 2))


@pytest.mark.slow
def test_fifty_commits_keep_three_manifests_and_only_the_retained_snapshots_files(tmp_path: Path,
                                                                                   catalog: Catalog) -> None:
    retained = 3
    for ledger_id in range(1, 51):
        ledger = {0: [[_live(b"k%d" % i, b"v%d" % ledger_id) for i in range(5)] + [_marker(b"gone%d" % ledger_id)]]}
        assert commit_ledger(catalog, NAMESPACE, *_ledger(tmp_path / "root", ledger_id, ledger), retained=retained)
        table = catalog.load_table((NAMESPACE, TOPIC))
        if ledger_id > 1:  # the first snapshot removes no previous ledger
            current = table.current_snapshot()
            assert current is not None
            assert sorted(m.content for m in current.manifests(table.io)) == \
                [ManifestContent.DATA, ManifestContent.DATA, ManifestContent.DELETES]
    table = catalog.load_table((NAMESPACE, TOPIC))
    snapshots = table.snapshots()
    assert [ledger_id_of(s) for s in snapshots] == [48, 49, 50]

    referenced = set()
    for snapshot in snapshots:
        referenced.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            referenced.add(manifest.manifest_path)
            referenced.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io)
                              if e.data_file.content == DataFileContent.POSITION_DELETES)
    folder = Path(table.location().removeprefix("file://"))
    own = {p.as_uri() for p in folder.rglob("*") if p.is_file() and not p.name.endswith(".metadata.json")}
    assert own == {r if r.startswith("file://") else Path(r).as_uri() for r in referenced}
    assert len(list(folder.rglob("*.metadata.json"))) <= retained + 1
    for snapshot in snapshots:  # each retained snapshot reads its own ledger's live keys
        assert len(_rows(table, snapshot.snapshot_id)) == 5
    assert all(Path(p).exists() for i in range(1, 51) for p in _ledger_files(tmp_path / "root", i))


def test_a_delete_file_no_snapshot_names_is_swept_once_its_ledger_is_expired(tmp_path: Path,
                                                                              catalog: Catalog) -> None:
    ledger = {0: [[_live(b"a", b"1"), _marker(b"b")]]}
    assert commit_ledger(catalog, NAMESPACE, *_ledger(tmp_path / "root", 1, ledger), retained=1)
    table = catalog.load_table((NAMESPACE, TOPIC))
    data = Path(table.location().removeprefix("file://")) / "data"
    # the file a commit of ledger 2 left when its outcome was unknown (the catalog failed after the write)
    stray = data / "compactord-2-0d6b3b8e-5f1c-4c55-9d43-7cc1c8a0a0f1-deletes.parquet"
    stray.write_bytes((data / next(data.iterdir()).name).read_bytes())
    assert commit_ledger(catalog, NAMESPACE, *_ledger(tmp_path / "root", 2, ledger), retained=1)
    assert stray.exists()  # ledger 2 is retained: a file of its own might be a commit still in flight
    assert commit_ledger(catalog, NAMESPACE, *_ledger(tmp_path / "root", 3, ledger), retained=1)
    assert not stray.exists()
    assert len(list(data.iterdir())) == 1


def test_a_commit_logs_no_warning_of_the_columns_a_ledger_keeps_no_statistics_of(
        tmp_path: Path, catalog: Catalog, caplog: pytest.LogCaptureFixture) -> None:
    ledger = {0: [[_live(b"a", b"a1"), _marker(b"x")]], 1: [[_live(b"c", b"c1")]]}
    with caplog.at_level(logging.WARNING):
        assert commit_ledger(catalog, NAMESPACE, *_ledger(tmp_path / "root", 1, ledger), retained=5)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    # the partition's and the offset's bounds are kept (they prune a scan), the others' are not collected
    table = catalog.load_table((NAMESPACE, TOPIC))
    [task, *_] = list(table.scan().plan_files())
    ids = {f.name: f.field_id for f in table.schema().fields}
    assert {ids["partition"], ids["offset"]} <= set(task.file.lower_bounds)
    assert ids["key"] not in task.file.lower_bounds
