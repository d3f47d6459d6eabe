"""The checksums of ledger files: a file's CRC-32C, and what is wrong with a file a manifest lists."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import crc32c

from compactord.errors import ObjectNotFound, StorageUnavailable
from compactord.storage import ObjectInfo, ObjectStore

__all__ = ["check_object", "file_crc32c"]

_CHUNK = 1 << 20


def file_crc32c(path: Path) -> int:
    """CRC-32C of a file, read in 1 MiB chunks."""
    value = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            value = crc32c.crc32c(chunk, value)
    return value


def check_object(objects: ObjectStore, prefix: str, entry: dict[str, Any],
                 listed: Mapping[str, ObjectInfo] | None = None) -> str | None:
    """What is wrong with one file a manifest lists (under ``prefix``, a ledger's ``<topic>/ledger-<id>/``),
    or None: its size from a HEAD, its CRC-32C read through the store in 1 MiB chunks. ``listed``: the ledger's
    objects by name, from one listing of ``prefix`` on a store whose versions identify the bytes
    (``ObjectStore.versions_identify_bytes``): a file there at the version the entry recorded is not read.

    :raises StorageUnavailable: the store failed to answer."""
    name = entry.get("name")
    if not isinstance(name, str) or Path(name).name != name or name.startswith("."):
        return "is not a plain file name"
    try:
        info = objects.head(prefix + name) if listed is None else listed.get(name)
        if info is None:
            return "is missing"
        if info.size != entry.get("bytes"):
            return f"has size {info.size}, expected {entry.get('bytes')}"
        if listed is not None and entry.get("version") and info.version == entry["version"]:
            return None  # the object written, untouched since (its bytes were checked when it was stored)
        crc = 0
        with objects.open_input(prefix + name) as f:
            while chunk := f.read(_CHUNK):
                crc = crc32c.crc32c(chunk, crc)
    except ObjectNotFound:
        return "is missing"
    except StorageUnavailable:  # an OSError too, but the store's failure: the file is not known to be bad
        raise
    except OSError as exc:
        return f"cannot be read ({exc})"
    if crc != entry.get("crc32c"):
        return f"fails its checksum (CRC-32C {crc}, expected {entry.get('crc32c')})"
    return None
