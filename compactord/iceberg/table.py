"""A topic's Iceberg table (pyiceberg, the ``[iceberg]`` extra): one ledger committed as one snapshot.

``commit_ledger`` makes the table's current snapshot the ledger: one OVERWRITE snapshot that references the
ledger's part files in place (their footers read, no data copied) and removes every file of the snapshot before
it, as one catalog commit. Two shapes pyiceberg 0.12 offers were measured and are avoided here:

- ``delete(AlwaysTrue())`` then ``add_files`` commits two snapshots (an empty DELETE, then the APPEND): a ledger
  is instead found by its snapshot's summary property ``compactord.ledger-id``, and each ledger is one snapshot.
- Its overwrite carries every manifest of the parent snapshot forward, the manifests that list only deleted
  files included, so the manifest list grows by one per commit; ``_LedgerSwap`` leaves those out, and each
  snapshot holds two manifests (the ledger's files, added; the previous ledger's, deleted).

Snapshots of older ledgers than the last ``retained`` are expired after each commit (expiry deletes no file: the
ledger files are compactord's), and old ``metadata.json`` files are deleted after commit by the table's
properties. The table's rows are the ledger's entries, tombstones included (see docs/design.md, "The compacted
view as an Iceberg table").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.manifest import DataFile, ManifestFile
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.snapshots import Operation, Snapshot
from pyiceberg.table.update.snapshot import _OverwriteFiles

from compactord.model import RECORD_SCHEMA, LedgerManifest

__all__ = ["HORIZON", "LEDGER_ID", "STRATEGY", "commit_ledger", "drop_table", "ledger_id_of", "open_catalog",
           "snapshot_of", "summary_of", "table_ledgers", "table_names"]

LEDGER_ID = "compactord.ledger-id"
HORIZON = "compactord.horizon"  # {"partition": offset, ...} as JSON
STRATEGY = "compactord.strategy"
RULES = "compactord.rules"  # the strategy's settings, as JSON
TOPIC_ID = "compactord.topic-id"


def open_catalog(uri: str, warehouse: str) -> Catalog:
    """The SQL catalog at ``uri`` (SQLAlchemy URL); tables it creates live under ``warehouse`` (a file:// URL)."""
    return SqlCatalog("compactord", uri=uri, warehouse=warehouse)


def ledger_id_of(snapshot: Snapshot | None) -> int | None:
    """The ledger id a snapshot's summary names (None: none, or a snapshot compactord did not commit)."""
    if snapshot is None or snapshot.summary is None:
        return None
    named = snapshot.summary.additional_properties.get(LEDGER_ID)
    return int(named) if named is not None and named.isdigit() else None


def snapshot_of(table: Table, ledger_id: int) -> Snapshot | None:
    """The snapshot that committed ledger ``ledger_id`` (time travel: ``table.scan(snapshot_id=...)``)."""
    return next((s for s in table.snapshots() if ledger_id_of(s) == ledger_id), None)


class _LedgerSwap(_OverwriteFiles):
    """pyiceberg's overwrite without the parent's manifests that list no live file: every live file of the
    parent is deleted by this snapshot, so those manifests would only make the manifest list grow."""

    def _existing_manifests(self) -> list[ManifestFile]:
        return [m for m in super()._existing_manifests() if m.has_added_files() or m.has_existing_files()]


def _live_files(table: Table, snapshot: Snapshot | None) -> list[DataFile]:
    if snapshot is None:
        return []
    return [entry.data_file for manifest in snapshot.manifests(table.io)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)]


def _summary(manifest: LedgerManifest) -> dict[str, str]:
    props = {LEDGER_ID: str(manifest.ledger_id),
             HORIZON: json.dumps({str(p): o for p, o in sorted(manifest.horizon.items())}),
             STRATEGY: manifest.strategy.strategy,
             RULES: json.dumps(manifest.strategy.rules(), sort_keys=True)}
    if manifest.topic_id:
        props[TOPIC_ID] = manifest.topic_id
    return props


def _table(catalog: Catalog, namespace: str, topic: str, retained: int) -> Table:
    catalog.create_namespace_if_not_exists(namespace)
    try:
        return catalog.load_table((namespace, topic))
    except NoSuchTableError:
        properties = {TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED: "true",
                      TableProperties.METADATA_PREVIOUS_VERSIONS_MAX: str(retained)}
        return catalog.create_table_if_not_exists((namespace, topic), schema=RECORD_SCHEMA, properties=properties)


def commit_ledger(catalog: Catalog, namespace: str, manifest: LedgerManifest, paths: Sequence[str],
                  retained: int) -> bool:
    """Make ``manifest``'s ledger, whose part files are ``paths`` (absolute, on this host), the current snapshot
    of the table ``(namespace, topic)``, created on the first commit. False: skipped, the table already names
    this ledger or a newer one (a delayed commit never buries a newer snapshot).

    :raises Exception: whatever the catalog or pyiceberg raise (the caller logs it; the table is unchanged)."""
    table = _table(catalog, namespace, manifest.topic, retained)
    current = table.current_snapshot()
    named = ledger_id_of(current)
    if named is not None and named >= manifest.ledger_id:
        return False
    with table.transaction() as tx:
        if tx.table_metadata.name_mapping() is None:  # the files carry no field ids: columns match by name
            tx.set_properties({TableProperties.DEFAULT_NAME_MAPPING:
                               tx.table_metadata.schema().name_mapping.model_dump_json()})
        added = [parquet_file_to_data_file(table.io, tx.table_metadata, path) for path in paths]
        swap = _LedgerSwap(commit_uuid=None, operation=Operation.OVERWRITE if current else Operation.APPEND,
                           transaction=tx, io=table.io, snapshot_properties=_summary(manifest))
        with swap:
            for data_file in _live_files(table, current):
                swap.delete_data_file(data_file)
            for data_file in added:
                swap.append_data_file(data_file)
    _expire(table.refresh(), retained)
    return True


def _expire(table: Table, retained: int) -> None:
    """Expire the snapshots older than those of the last ``retained`` ledgers (no file is deleted)."""
    current = table.current_snapshot()
    ids = sorted({i for s in table.snapshots() if (i := ledger_id_of(s)) is not None}, reverse=True)
    if len(ids) <= retained or current is None:
        return
    floor = ids[retained - 1]
    expired = [s.snapshot_id for s in table.snapshots() if s.snapshot_id != current.snapshot_id
               and (ledger_id_of(s) or 0) < floor]
    if expired:
        table.maintenance.expire_snapshots().by_ids(expired).commit()


def summary_of(snapshot: Snapshot) -> dict[str, Any]:
    """A snapshot's compactord properties, parsed (tests and tools)."""
    props = snapshot.summary.additional_properties if snapshot.summary is not None else {}
    return {"ledger_id": ledger_id_of(snapshot), "horizon": {int(p): o for p, o in
                                                              json.loads(props.get(HORIZON, "{}")).items()},
            "strategy": props.get(STRATEGY)}


# -- the table's lifecycle (the publisher's: what a table names, its drop) -----------------------------------


def table_ledgers(catalog: Catalog, namespace: str, topic: str) -> tuple[int | None, set[int]] | None:
    """The ledger id the table's current snapshot names, and the ledger ids its snapshots name (the retained
    ones: older snapshots are expired); None: there is no table."""
    try:
        table = catalog.load_table((namespace, topic))
    except NoSuchTableError:
        return None
    return ledger_id_of(table.current_snapshot()), {i for s in table.snapshots() if (i := ledger_id_of(s)) is not None}


def table_names(catalog: Catalog, namespace: str) -> list[str]:
    """The names of the namespace's tables (none if it does not exist)."""
    if (namespace,) not in {tuple(n) for n in catalog.list_namespaces()}:
        return []
    return sorted(ident[-1] for ident in catalog.list_tables(namespace))


def drop_table(catalog: Catalog, namespace: str, topic: str) -> bool:
    """Drop the table from the catalog, its data files untouched (never ``purge_table``: they are the ledger's);
    False: there was none."""
    try:
        catalog.drop_table((namespace, topic))
    except NoSuchTableError:
        return False
    return True
