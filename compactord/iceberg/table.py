"""A topic's Iceberg table (pyiceberg, the ``[iceberg]`` extra): one ledger committed as one snapshot.

``commit_ledger`` makes the table's current snapshot the ledger: one OVERWRITE snapshot that references the
ledger's part files in place (their footers read, no data copied) and removes every file of the snapshot before
it, as one catalog commit. Two shapes pyiceberg 0.12 offers were measured and are avoided here:

- ``delete(AlwaysTrue())`` then ``add_files`` commits two snapshots (an empty DELETE, then the APPEND): a ledger
  is instead found by its snapshot's summary property ``compactord.ledger-id``, and each ledger is one snapshot.
- Its overwrite carries every manifest of the parent snapshot forward, the manifests that list only deleted
  files included, so the manifest list grows by one per commit; ``_LedgerSwap`` leaves those out, and each
  snapshot holds at most three manifests (the ledger's files, added; the previous ledger's, deleted; the
  position delete files, this ledger's added and the previous one's deleted).

The snapshot's rows are the ledger's live keys. pyiceberg 0.12 writes no delete file, but its scans apply
position deletes, as Spark and Trino do by the spec: ``commit_ledger`` writes one position delete file per
ledger under the table's ``data/`` folder (one row per marker or tombstone of the ledger's files; the ledger's
folder is never written) and commits it in the ledger's snapshot, so a snapshot of an older ledger keeps its
own.

Snapshots of older ledgers than the last ``retained`` are expired after each commit, and the table's own files
only they named (manifest lists, manifests, delete files) are deleted then; the ledger's files never are (the
ledger store retires them). Old ``metadata.json`` files are deleted after commit by the table's properties (see
docs/design.md, "The compacted view as an Iceberg table").
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, ValidationException
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
)
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update.snapshot import _OverwriteFiles
from pyiceberg.typedef import EMPTY_DICT, Record

from compactord.model import RECORD_SCHEMA, LedgerManifest

__all__ = ["HORIZON", "LEDGER_ID", "STRATEGY", "commit_ledger", "drop_table", "ledger_id_of", "open_catalog",
           "snapshot_of", "summary_of", "table_ledgers", "table_names"]

LEDGER_ID = "compactord.ledger-id"
HORIZON = "compactord.horizon"  # {"partition": offset, ...} as JSON
STRATEGY = "compactord.strategy"
RULES = "compactord.rules"  # the strategy's settings, as JSON
TOPIC_ID = "compactord.topic-id"

# An Iceberg v2 position delete file's two columns, by the field ids the spec reserves for them.
_PATH_ID, _POS_ID = 2147483546, 2147483545
_DELETES_SUFFIX = "-deletes.parquet"
_DELETES_NAME = re.compile(r"compactord-(\d+)-[0-9a-f-]{36}" + re.escape(_DELETES_SUFFIX))
_DELETES_SCHEMA = pa.schema([
    pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(_PATH_ID).encode()}),
    pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(_POS_ID).encode()}),
])


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


class _DeletesManifestWriter(ManifestWriterV2):
    """pyiceberg 0.12's v2 manifest writer, for a manifest of delete files (its own writes data manifests only)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class _LedgerSwap(_OverwriteFiles):
    """pyiceberg's overwrite, made to swap one ledger for another in at most three manifests: the ledger's files
    (added), the previous ledger's (deleted), and a manifest of delete files (this ledger's position delete
    file added, the previous one's deleted). The parent's manifests are never carried forward: every live file
    of the parent, data or deletes, is removed by this snapshot, so they would only make the manifest list grow."""

    def __init__(self, *args: Any, added_deletes: Sequence[DataFile], removed_deletes: Sequence[ManifestEntry],
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._added_deletes = list(added_deletes)
        self._removed_deletes = list(removed_deletes)

    def _existing_manifests(self) -> list[ManifestFile]:
        return [m for m in super()._existing_manifests()
                if m.content == ManifestContent.DATA and (m.has_added_files() or m.has_existing_files())]

    def _manifests(self) -> list[ManifestFile]:
        manifests = super()._manifests()
        if not self._added_deletes and not self._removed_deletes:
            return manifests
        metadata = self._transaction.table_metadata
        with _DeletesManifestWriter(metadata.spec(), self.schema(), self.new_manifest_output(), self._snapshot_id,
                                    self._compression) as writer:
            for delete_file in self._added_deletes:
                writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id,
                                                   sequence_number=None, file_sequence_number=None,
                                                   data_file=delete_file))
            for entry in self._removed_deletes:
                writer.delete(entry)
        return [*manifests, writer.to_manifest_file()]

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        # The summary counts the files these lists hold: the delete files are counted with the data files.
        added, deleted = self._added_data_files, self._deleted_data_files
        self._added_data_files = [*added, *self._added_deletes]
        self._deleted_data_files = deleted | {e.data_file for e in self._removed_deletes}
        try:
            return super()._summary(snapshot_properties)
        finally:
            self._added_data_files, self._deleted_data_files = added, deleted


def _live_entries(table: Table, snapshot: Snapshot | None) -> list[ManifestEntry]:
    if snapshot is None:
        return []
    return [entry for manifest in snapshot.manifests(table.io)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)]


def _properties(manifest: LedgerManifest) -> dict[str, str]:
    props = {LEDGER_ID: str(manifest.ledger_id),
             HORIZON: json.dumps({str(p): o for p, o in sorted(manifest.horizon.items())}),
             STRATEGY: manifest.strategy.strategy,
             RULES: json.dumps(manifest.strategy.rules(), sort_keys=True)}
    if manifest.topic_id:
        props[TOPIC_ID] = manifest.topic_id
    return props


# The column metrics a data file's entry carries: the statistics a ledger's parts keep (``ledger/parts.py``:
# partition and offset), which prune a scan; none of the other columns, whose footers hold none (pyiceberg would
# otherwise log a warning per column and part file at each commit).
_METRICS = {TableProperties.DEFAULT_WRITE_METRICS_MODE: "none",
            f"{TableProperties.METRICS_MODE_COLUMN_CONF_PREFIX}.partition": "full",
            f"{TableProperties.METRICS_MODE_COLUMN_CONF_PREFIX}.offset": "full"}


def _table(catalog: Catalog, namespace: str, topic: str, retained: int) -> Table:
    catalog.create_namespace_if_not_exists(namespace)
    try:
        return catalog.load_table((namespace, topic))
    except NoSuchTableError:
        properties = {TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED: "true",
                      TableProperties.METADATA_PREVIOUS_VERSIONS_MAX: str(retained),
                      TableProperties.FORMAT_VERSION: "2"}
        return catalog.create_table_if_not_exists((namespace, topic), schema=RECORD_SCHEMA, properties=properties)


def deleted_positions(path: str, io: FileIO | None = None) -> pa.Array:
    """The row positions (int64, ascending) of the part file ``path``'s rows that are no live key: deletion
    markers, and tombstones (a keyed row with a null value). Only the ``value`` and ``marker`` columns are read
    (``key`` too, for a row group holding a null value that is no marker), and a row group whose statistics say
    it holds neither is skipped unread (a ledger's parts keep statistics of ``partition`` and ``offset`` only).
    ``io``: the table's FileIO, which reads an ``s3://`` root's files with the root's settings (None: a local path)."""
    if io is None:
        return _deleted_positions(pq.ParquetFile(path))
    with io.new_input(path).open() as stream:
        return _deleted_positions(pq.ParquetFile(stream))


def _deleted_positions(parquet: pq.ParquetFile) -> pa.Array:
    columns = {parquet.metadata.schema.column(i).path: i for i in range(parquet.metadata.num_columns)}
    found: list[pa.Array] = []
    start = 0
    for g in range(parquet.num_row_groups):
        group = parquet.metadata.row_group(g)
        if _may_hold_deletions(group, columns):
            read = parquet.read_row_group(g, columns=["value", "marker"])
            marker = pc.fill_null(read["marker"], False)
            deleted = pc.or_(marker, pc.is_null(read["value"]))
            if pc.any(pc.and_(deleted, pc.invert(marker))).as_py():  # a null value: a tombstone if keyed
                keyed = pc.is_valid(parquet.read_row_group(g, columns=["key"])["key"])
                deleted = pc.or_(marker, pc.and_(deleted, keyed))
            found.append(pc.add(pc.indices_nonzero(deleted), pa.scalar(start, pa.uint64())).cast(pa.int64()))
        start += group.num_rows
    return pa.concat_arrays(found) if found else pa.array([], pa.int64())


def _may_hold_deletions(group: pq.RowGroupMetaData, columns: dict[str, int]) -> bool:
    value = group.column(columns["value"]).statistics
    marker = group.column(columns["marker"]).statistics
    no_null_value = value is not None and value.has_null_count and value.null_count == 0
    no_marker = marker is not None and marker.has_min_max and marker.max is False
    return not (no_null_value and no_marker)


def _write_deletes(table: Table, ledger_id: int, data_files: Sequence[DataFile]) -> DataFile | None:
    """The ledger's position delete file (Iceberg v2: ``file_path``, ``pos``, sorted by both), written under the
    table's data folder: one row per marker or tombstone of the ledger's files. None: the ledger has neither."""
    paths: list[pa.Array] = []
    positions: list[pa.Array] = []
    for data_file in sorted(data_files, key=lambda f: f.file_path):
        deleted = deleted_positions(data_file.file_path, table.io)
        positions.append(deleted)
        paths.append(pa.array([data_file.file_path] * len(deleted), pa.string()))
    rows = pa.Table.from_arrays([pa.concat_arrays(paths), pa.concat_arrays(positions)], schema=_DELETES_SCHEMA) \
        if paths else _DELETES_SCHEMA.empty_table()
    if not rows.num_rows:
        return None
    location = table.location_provider().new_data_location(f"compactord-{ledger_id}-{uuid.uuid4()}{_DELETES_SUFFIX}")
    with table.io.new_output(location).create(overwrite=True) as out:
        pq.write_table(rows, out, compression="zstd")
    referenced = rows["file_path"]
    return DataFile.from_args(
        content=DataFileContent.POSITION_DELETES, file_path=location, file_format=FileFormat.PARQUET,
        partition=Record(), record_count=rows.num_rows, file_size_in_bytes=len(table.io.new_input(location)),
        lower_bounds={_PATH_ID: pc.min(referenced).as_py().encode()},
        upper_bounds={_PATH_ID: pc.max(referenced).as_py().encode()},
        sort_order_id=None, spec_id=table.metadata.default_spec_id, equality_ids=None, key_metadata=None)


def commit_ledger(catalog: Catalog, namespace: str, manifest: LedgerManifest, paths: Sequence[str],
                  retained: int) -> bool:
    """Make ``manifest``'s ledger, whose part files are ``paths`` (absolute, on this host), the current snapshot
    of the table ``(namespace, topic)``, created on the first commit. The snapshot's rows are the ledger's live
    keys: a position delete file (``_write_deletes``), committed in the same snapshot, removes its markers and
    tombstones. False: skipped, the table already names this ledger or a newer one (a delayed commit never
    buries a newer snapshot).

    :raises Exception: whatever the catalog or pyiceberg raise (the caller logs it; the table is unchanged, and
        a delete file written for it is left for no snapshot: the next expiry does not see it)."""
    table = _table(catalog, namespace, manifest.topic, retained)
    current = table.current_snapshot()
    named = ledger_id_of(current)
    if named is not None and named >= manifest.ledger_id:
        return False
    live = _live_entries(table, current)
    deletes: DataFile | None = None
    try:
        with table.transaction() as tx:
            if tx.table_metadata.format_version < 2:  # position deletes are v2's
                tx.upgrade_table_version(2)
            if tx.table_metadata.name_mapping() is None:  # the files carry no field ids: columns match by name
                tx.set_properties({TableProperties.DEFAULT_NAME_MAPPING:
                                   tx.table_metadata.schema().name_mapping.model_dump_json()})
            if tx.table_metadata.properties.get(TableProperties.DEFAULT_WRITE_METRICS_MODE) != "none":
                tx.set_properties(_METRICS)
            added = [parquet_file_to_data_file(table.io, tx.table_metadata, path) for path in paths]
            deletes = _write_deletes(table, manifest.ledger_id, added)
            swap = _LedgerSwap(commit_uuid=None, operation=Operation.OVERWRITE if current else Operation.APPEND,
                               transaction=tx, io=table.io, snapshot_properties=_properties(manifest),
                               added_deletes=[deletes] if deletes else [],
                               removed_deletes=[e for e in live if e.data_file.content != DataFileContent.DATA])
            with swap:
                for entry in live:
                    if entry.data_file.content == DataFileContent.DATA:
                        swap.delete_data_file(entry.data_file)
                for data_file in added:
                    swap.append_data_file(data_file)
    except (CommitFailedException, ValidationException):
        # The commit did not land (pyiceberg deletes its own manifests then): the delete file is no snapshot's.
        # Any other error may hide a commit that landed, so its file is left to the expiry's sweep.
        if deletes is not None:
            with contextlib.suppress(OSError):
                table.io.delete(deletes.file_path)
        raise
    _expire(table.refresh(), retained)
    return True


def _expire(table: Table, retained: int) -> None:
    """Expire the snapshots older than those of the last ``retained`` ledgers, then delete the files that only
    they named and that are the table's own: manifest lists, manifests and position delete files. The ledger's
    data files are never deleted here (the ledger store retires them)."""
    current = table.current_snapshot()
    ids = sorted({i for s in table.snapshots() if (i := ledger_id_of(s)) is not None}, reverse=True)
    if len(ids) <= retained or current is None:
        return
    floor = ids[retained - 1]
    expired = [s for s in table.snapshots() if s.snapshot_id != current.snapshot_id and (ledger_id_of(s) or 0) < floor]
    if not expired:
        return
    kept = _own_files(table, [s for s in table.snapshots() if s not in expired])
    doomed = _own_files(table, expired) - kept
    table.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in expired]).commit()
    for location in sorted(doomed):
        with contextlib.suppress(FileNotFoundError):
            table.io.delete(location)
    _sweep_deletes(table, floor, {location.rpartition("/")[2] for location in kept})


def _sweep_deletes(table: Table, floor: int, kept: set[str]) -> None:
    """Delete the delete files of ledgers older than ``floor`` that no kept snapshot names: those of a commit
    that failed with its outcome unknown (a newer ledger's file may be a commit in flight, and is left)."""
    fs, folder = pafs.FileSystem.from_uri(table.location_provider().data_path)
    for info in fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True)):
        named = _DELETES_NAME.fullmatch(info.base_name)
        if named is not None and int(named[1]) < floor and info.base_name not in kept:
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(info.path)


def _own_files(table: Table, snapshots: Sequence[Snapshot]) -> set[str]:
    """The files of the table's own that ``snapshots`` name: their manifest lists, manifests, and live delete
    files under the table's location (a data file is a ledger's, never the table's)."""
    files: set[str] = set()
    for snapshot in snapshots:
        files.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            files.add(manifest.manifest_path)
            if manifest.content == ManifestContent.DELETES:
                files.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
                             if e.data_file.file_path.startswith(table.location()))
    return files


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
