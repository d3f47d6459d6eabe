"""A ledger's ``manifest.json``: sealing a ledger the tasks have written (checksums, counts, the manifest),
loading the manifest, and verifying the files it lists. ``LedgerStore`` calls these with the root's store and
the ledger's key prefix; they are the boundary where a bad file becomes ``LedgerCorrupt``.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import re
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import crc32c
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from compactord.errors import LedgerCorrupt, ObjectNotFound
from compactord.ledger.checksums import check_object
from compactord.ledger.layout import MANIFEST
from compactord.ledger.parts import is_partial_part, is_seal, read_seal, seal_name
from compactord.model import RECORD_SCHEMA, LedgerManifest
from compactord.storage import ObjectInfo, ObjectStore
from compactord.storage.disk import DISK_FULL, disk_errors

__all__ = ["finalize", "load_manifest", "verify"]

# Part files described at once when a ledger is sealed from its files (Spark's writer's parts; a reading task's
# part comes with its entry, ``parts.read_seal``): their column reads (Arrow), file reads and fsyncs (the kernel)
# free the GIL. Four parts of 250,000 rows (6 MB each), just written, were sealed in 21 ms this way, against
# 33 ms one after the other, most of it each part's fsync.
_SEALING_THREADS = 8
_PART = re.compile(r"part-[^/]*\.parquet")


def finalize(manifest: LedgerManifest, objects: ObjectStore, prefix: str) -> LedgerManifest:
    """Seal the ledger under ``prefix`` of ``objects`` (see ``LedgerStore.finalize_ledger``); ``manifest`` is
    filled in place and written as ``prefix + manifest.json``. The seals the tasks left beside their parts and
    a dead task attempt's partial part are removed.

    :raises LedgerCorrupt: a part file is not Parquet or lacks a column of the record schema.
    :raises InsufficientDiskSpace: the disk is full.
    """
    where = f"ledger {manifest.ledger_id} of topic {manifest.topic!r}"
    with disk_errors(f"finalizing {where}"):
        listed = {info.key[len(prefix):]: info for info in objects.list(prefix)}
        stale = [prefix + name for name in listed if name == "_SUCCESS" or name.endswith(".crc")
                 or is_partial_part(name)]
        seals = {name: prefix + name for name in listed if is_seal(name)}  # taken below, then removed
        parts = sorted((info for name, info in listed.items() if _PART.fullmatch(name)), key=lambda info: info.key)
        if not parts:
            # A ledger always has a file, so that readers and verify need no special case.
            sink = pa.BufferOutputStream()
            pq.write_table(RECORD_SCHEMA.empty_table(), sink)
            key = prefix + "part-00000-empty.parquet"
            objects.put(key, sink.getvalue().to_pybytes())
            written = objects.head(key)
            if written is None:  # removed between its write and this read: not the ledger's own
                raise ObjectNotFound(f"{objects.location(key)} is gone right after its write", key=key)
            parts = [written]
        with ThreadPoolExecutor(min(_SEALING_THREADS, len(parts)), thread_name_prefix="seal") as pool:
            # Each in a copy of this thread's context: its reads count for the run that seals (``counting_requests``).
            describe = partial(_describe_part, where, objects, seals)
            futures = [pool.submit(contextvars.copy_context().run, describe, part) for part in parts]
            files = [future.result() for future in futures]  # the first error raised
        objects.delete_many([*stale, *seals.values()])
        manifest.markers = sum(f.pop("markers") for f in files)
        manifest.files = files
        manifest.bytes = sum(f["bytes"] for f in files)
        manifest.records_kept = sum(f["rows"] for f in files) - manifest.markers
        oldest = [f.pop("oldest_marker_at") for f in files]
        if not objects.versions_identify_bytes:  # a local file's version says nothing of its bytes (``verify``)
            for f in files:
                f.pop("version")
        manifest.oldest_marker_at_ms = min((o for o in oldest if o is not None), default=None)
        manifest.removed = max(0, manifest.records_read - manifest.records_kept - manifest.markers)
        objects.put(prefix + MANIFEST, json.dumps(manifest.to_json(), indent=1).encode())
    return manifest


def _describe_part(where: str, objects: ObjectStore, seals: dict[str, str], part: ObjectInfo) -> dict[str, Any]:
    """The manifest entry of ``part``: as the task that wrote it left it in its seal (``parts.read_seal``), else
    from the object (read and checksummed here)."""
    name = part.key.rpartition("/")[2]
    seal_key = seals.get(seal_name(name))
    if seal_key is not None:
        with contextlib.suppress(ObjectNotFound):
            sealed = read_seal(part, objects.get(seal_key))
            if sealed is not None:
                return sealed
    return _read_part(where, objects, part)


def _read_part(where: str, objects: ObjectStore, part: ObjectInfo) -> dict[str, Any]:
    """The manifest entry of ``part``, from the object itself (read whole and checksummed)."""
    name = part.key.rpartition("/")[2]
    try:
        data = objects.get(part.key)
        pf = pq.ParquetFile(pa.BufferReader(data))
        missing = set(RECORD_SCHEMA.names) - set(pf.schema_arrow.names)
        rows = pf.metadata.num_rows
        # Only the one-bit column is decoded: cheap even for millions of rows.
        flags = pf.read(columns=["marker", "marker_at"]) if rows else None
        markers = int(pc.sum(flags.column("marker")).as_py() or 0) if flags is not None else 0
        oldest = pc.min(flags.column("marker_at")).as_py() if flags is not None and markers else None
    except ObjectNotFound as exc:
        raise LedgerCorrupt(f"{where}: file {name} disappeared while the ledger was sealed") from exc
    except (pa.ArrowException, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno in DISK_FULL:
            raise
        raise LedgerCorrupt(f"{where}: file {name} is not readable Parquet: {exc}") from exc
    if missing:
        raise LedgerCorrupt(f"{where}: file {name} lacks the record columns {sorted(missing)}")
    return {"name": name, "bytes": len(data), "crc32c": crc32c.crc32c(data), "rows": rows, "markers": markers,
            "oldest_marker_at": oldest, "version": part.version}


def load_manifest(objects: ObjectStore, prefix: str, topic: str, ledger_id: int) -> LedgerManifest:
    """The manifest of the ledger under ``prefix``.

    :raises LedgerCorrupt: ``manifest.json`` is missing, unparseable or names another ledger.
    """
    key = prefix + MANIFEST
    file = objects.location(key)
    try:
        manifest = LedgerManifest.from_json(json.loads(objects.get(key)))
    except ObjectNotFound as exc:
        raise LedgerCorrupt(f"manifest {file} of topic {topic!r} is missing", topic=topic) from exc
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LedgerCorrupt(
            f"manifest {file} of topic {topic!r} is unparseable: {exc!r}", topic=topic
        ) from exc
    if manifest.topic != topic or manifest.ledger_id != ledger_id:
        raise LedgerCorrupt(
            f"manifest {file} names topic {manifest.topic!r} ledger {manifest.ledger_id}; "
            f"expected topic {topic!r} ledger {ledger_id}",
            topic=topic,
        )
    return manifest


def verify(objects: ObjectStore, prefix: str, topic: str, ledger_id: int) -> LedgerManifest:
    """Load the manifest and check every listed file's size and CRC-32C. On a store whose versions identify
    the bytes (``ObjectStore.versions_identify_bytes``: S3), one listing of the ledger checks them all: a file
    at the size and version the manifest recorded is not read; any other is read and checksummed.

    :raises LedgerCorrupt: the manifest is bad, or a file is missing, has another size or checksum.
    """
    manifest = load_manifest(objects, prefix, topic, ledger_id)
    where = f"ledger {ledger_id} of topic {topic!r} is corrupt"
    if not manifest.files:
        raise LedgerCorrupt(f"{where}: its manifest lists no files (a ledger has >= 1)", topic=topic)
    listed = {info.key[len(prefix):]: info for info in objects.list(prefix)} \
        if objects.versions_identify_bytes else None
    for entry in manifest.files:
        problem = check_object(objects, prefix, entry, listed)
        if problem is not None:
            name = entry.get("name")
            raise LedgerCorrupt(f"{where}: file {name!r} {problem}", topic=topic, file=name)
    return manifest
