"""Benchmark: a topic's Iceberg table over many switches stays flat: commit time, metadata size and files.

Usage (from the repository root, with the project's venv and the ``[iceberg]`` extra)::

    .venv/bin/python bench/iceberg.py                   # 1,000 commits (about 8 minutes on 2 shared cores)
    .venv/bin/python bench/iceberg.py --commits 100     # smoke run
    .venv/bin/python bench/iceberg.py --keys 1000 --markers 50 --retained 5

Each of ``--commits`` rounds writes one small ledger of one topic into a local root through the ledger store as
a compaction does (``allocate_ledger``, ``write_part`` per partition, ``finalize_ledger``, ``switch``): ``--keys``
live keys over 2 partitions and ``--markers`` deletion markers (an ``event-time`` ledger), then commits it as the
publisher does (``commit_ledger`` into a SQLite catalog, ``--retained`` ledgers kept) and times that commit alone.

It prints the median commit time of the first 10 and of the last 10 commits, the table's metadata and data
folders (bytes and files, ``*.metadata.json`` counted apart) after commit 100 and after the last, the manifests
of the current snapshot, and whether any file of an expired snapshot remains (every file of the table's folder
but its ``metadata.json`` files must be one that a retained snapshot names). Figures, not assertions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import DataFileContent
from pyiceberg.table import Table

from compactord.iceberg.table import commit_ledger, open_catalog
from compactord.ledger.layout import ledger_prefix
from compactord.ledger.parts import part_name, write_part
from compactord.ledger.store import LedgerStore
from compactord.model import RECORD_SCHEMA, LedgerManifest, StrategySettings

TOPIC = "bench.iceberg"
NAMESPACE = "compactord"
PARTITIONS = 2


def write_ledger(store: LedgerStore, keys: int, markers: int) -> int:
    """A new current ledger of ``TOPIC``: ``keys`` live keys and ``markers`` markers per ledger; its id."""
    ledger_id, _ = store.allocate_ledger(TOPIC)
    for partition in range(PARTITIONS):
        live, dead = keys // PARTITIONS, markers // PARTITIONS
        n = live + dead
        rows = {"partition": [partition] * n, "offset": [ledger_id * n + i for i in range(n)],
                "timestamp": [ledger_id] * n, "key": [b"key-%d-%d" % (partition, i) for i in range(n)],
                "value": [b"v%d" % ledger_id * 10 if i < live else None for i in range(n)], "headers": [[]] * n,
                "event_time": [ledger_id] * n, "marker": [i >= live for i in range(n)],
                "marker_at": [ledger_id if i >= live else None for i in range(n)]}
        write_part(pa.table(rows, schema=RECORD_SCHEMA), store.objects,
                   ledger_prefix(TOPIC, ledger_id) + part_name(partition))
    horizon = dict.fromkeys(range(PARTITIONS), (ledger_id + 1) * (keys + markers) // PARTITIONS)
    manifest = LedgerManifest(ledger_id, TOPIC, horizon=horizon, strategy=StrategySettings(strategy="event-time"),
                              files=[])
    store.finalize_ledger(TOPIC, ledger_id, manifest)
    store.switch(TOPIC, ledger_id, retire_for=0)
    return ledger_id


def commit(store: LedgerStore, catalog: Catalog, retained: int) -> tuple[float, float]:
    """The publisher's commit of the topic's current ledger (``TablePublisher._publish``); its seconds, wall
    clock and CPU of this process (the CPU's are what a loaded machine changes least)."""
    ledger_id = store.current_ledger_id(TOPIC)
    assert ledger_id is not None
    manifest = store.load_manifest(TOPIC, ledger_id)
    folder = store.ledger_path(TOPIC, ledger_id)
    paths = [str(folder / part["name"]) for part in manifest.files]
    started, cpu = time.perf_counter(), time.process_time()
    committed = commit_ledger(catalog, NAMESPACE, manifest, paths, retained)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    assert committed, f"ledger {ledger_id} not committed"
    return seconds, cpu_seconds


def folder_figures(table: Table) -> dict[str, int]:
    folder = Path(table.location().removeprefix("file://"))
    files = [p for p in folder.rglob("*") if p.is_file()]
    metadata_json = [p for p in files if p.name.endswith(".metadata.json")]
    return {"bytes": sum(p.stat().st_size for p in files), "files": len(files), "metadata_json": len(metadata_json),
            "delete_files": len(list((folder / "data").glob("*.parquet")))}


def left_over(table: Table) -> list[str]:
    """The table's files (its ``metadata.json`` files apart) that no retained snapshot names."""
    named: set[str] = set()
    for snapshot in table.snapshots():
        named.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            named.add(manifest.manifest_path)
            named.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io)
                         if e.data_file.content == DataFileContent.POSITION_DELETES)
    folder = Path(table.location().removeprefix("file://"))
    return sorted(str(p) for p in folder.rglob("*") if p.is_file() and not p.name.endswith(".metadata.json")
                  and p.as_uri() not in named)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=200, help="live keys per ledger")
    parser.add_argument("--markers", type=int, default=20, help="deletion markers per ledger")
    parser.add_argument("--retained", type=int, default=5, help="icebergSnapshotsRetained")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-iceberg-") as tmp:
        root = Path(tmp) / "root"
        store = LedgerStore(root, recovery_per_second=0).open()
        catalog = open_catalog(f"sqlite:///{Path(tmp) / 'catalog.db'}", (Path(tmp) / "warehouse").as_uri())
        assert isinstance(catalog, SqlCatalog)
        times: list[float] = []
        cpu: list[float] = []
        at: dict[int, dict[str, int]] = {}
        started = time.monotonic()
        try:
            for n in range(1, args.commits + 1):
                write_ledger(store, args.keys, args.markers)
                wall, cpu_seconds = commit(store, catalog, args.retained)
                times.append(wall)
                cpu.append(cpu_seconds)
                if n in (100, args.commits):
                    at[n] = folder_figures(catalog.load_table((NAMESPACE, TOPIC)))
                if n % 100 == 0:
                    print(f"  {n} commits, {time.monotonic() - started:.0f} s; commits {n - 99}-{n}: p50 "
                          f"{statistics.median(times[-100:]) * 1000:.1f} ms, CPU "
                          f"{statistics.median(cpu[-100:]) * 1000:.1f} ms", flush=True)
            table = catalog.load_table((NAMESPACE, TOPIC))
            current = table.current_snapshot()
            assert current is not None
            rows = table.scan().to_arrow()
            manifests = len(current.manifests(table.io))
            stray = left_over(table)
        finally:
            store.close()
            catalog.engine.dispose()

    first, last = times[:10], times[-10:]
    print(f"commits={args.commits} keys={args.keys} markers={args.markers} retained={args.retained}")
    print(f"commit_p50_first10_ms={statistics.median(first) * 1000:.1f}")
    print(f"commit_p50_last10_ms={statistics.median(last) * 1000:.1f}")
    print(f"commit_cpu_p50_first10_ms={statistics.median(cpu[:10]) * 1000:.1f}")
    print(f"commit_cpu_p50_last10_ms={statistics.median(cpu[-10:]) * 1000:.1f}")
    for n, figures in sorted(at.items()):
        print(f"after_{n}: table_bytes={figures['bytes']} files={figures['files']} "
              f"metadata_json={figures['metadata_json']} delete_files={figures['delete_files']}")
    print(f"manifests_in_current_snapshot={manifests}")
    print(f"current_rows={rows.num_rows} markers_in_scan={sum(bool(m) for m in rows['marker'].to_pylist())}")
    print(f"files_of_expired_snapshots_left={len(stray)}")
    for path in stray[:10]:
        print(f"  {path}")


if __name__ == "__main__":
    main()
