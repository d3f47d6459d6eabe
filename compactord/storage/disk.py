"""Durable writes on a local disk (fsync, atomic replace) and the translation of a full disk: what the local
backend of the store (``local.py``) is made of, and what code that still writes local files (a task's part)
uses."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from compactord.errors import InsufficientDiskSpace

__all__ = ["DISK_FULL", "TMP_SUFFIX", "disk_errors", "fsync_path", "list_names", "remove_path", "write_atomic",
           "write_durable"]

TMP_SUFFIX = ".tmp"
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def fsync_path(path: Path) -> None:
    # Works for directories too: a rename or a new entry is durable only once its directory is fsynced.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes) -> None:
    """Write a new file ``path`` and fsync it (its directory entry is the caller's to make durable).

    Its modification time is set to now in nanoseconds, so that a file that replaces another with the same
    inode number and size within one tick of the kernel's clock still differs from it (a store's version).
    """
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.utime(f.fileno(), ns=(time.time_ns(), time.time_ns()))
        os.fsync(f.fileno())


def write_atomic(path: Path, data: bytes, tmp: Path | None = None) -> None:
    """Write ``path`` so that a crash at any instant leaves either the old or the new content (through
    ``tmp``, by default ``path`` with ``.tmp`` appended)."""
    tmp = path.with_name(path.name + TMP_SUFFIX) if tmp is None else tmp
    write_durable(tmp, data)
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
