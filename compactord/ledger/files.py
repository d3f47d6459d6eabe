"""File-level helpers of the ledger store: CRC-32C, fsync, atomic writes, disk-full translation."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crc32c

from compactord.errors import InsufficientDiskSpace

__all__ = ["CURRENT", "DISK_FULL", "LEDGER_RE", "MANIFEST", "TMP_SUFFIX", "check_file", "disk_errors", "file_crc32c",
           "fsync_path", "ledger_dir_name", "list_names", "remove_path", "write_atomic"]

CURRENT = "CURRENT"
MANIFEST = "manifest.json"
LEDGER_RE = re.compile(r"ledger-([1-9][0-9]*)")
TMP_SUFFIX = ".tmp"
_CHUNK = 1 << 20
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def ledger_dir_name(ledger_id: int) -> str:
    """The directory name of a ledger, also the content of ``CURRENT`` (without the newline)."""
    return f"ledger-{ledger_id}"


def file_crc32c(path: Path) -> int:
    """CRC-32C of a file, read in 1 MiB chunks."""
    value = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            value = crc32c.crc32c(chunk, value)
    return value


def fsync_path(path: Path) -> None:
    # Works for directories too: a rename or a new entry is durable only once its directory is fsynced.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` so that a crash at any instant leaves either the old or the new content."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


@contextlib.contextmanager
def disk_errors(what: str) -> Iterator[None]:
    """Translate a full disk into ``InsufficientDiskSpace``; other OS errors pass unchanged."""
    try:
        yield
    except OSError as exc:
        if exc.errno in DISK_FULL:
            raise InsufficientDiskSpace(f"{what}: no space left on the device ({exc})") from exc
        raise


def list_names(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []


def remove_path(path: Path) -> None:
    """Remove a file or a directory tree and make the removal durable; missing is fine."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        return
    with contextlib.suppress(FileNotFoundError):
        fsync_path(path.parent)


def check_file(ledger_dir: Path, entry: dict[str, Any]) -> str | None:
    """What is wrong with one file a manifest lists, or None."""
    name = entry.get("name")
    if not isinstance(name, str) or Path(name).name != name or name.startswith("."):
        return "is not a plain file name"
    try:
        size = (ledger_dir / name).stat().st_size
        if size != entry.get("bytes"):
            return f"has size {size}, expected {entry.get('bytes')}"
        crc = file_crc32c(ledger_dir / name)
    except FileNotFoundError:
        return "is missing"
    except OSError as exc:
        return f"cannot be read ({exc})"
    if crc != entry.get("crc32c"):
        return f"fails its checksum (CRC-32C {crc}, expected {entry.get('crc32c')})"
    return None

