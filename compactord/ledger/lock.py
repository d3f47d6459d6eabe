"""The ledger root's lock: one daemon writes a root. An ``flock`` on ``@compactord/lock``, whose
content names the holder (pid, host, start time) so that a refused contender can say who holds it.

A lock whose holder died is free again (flock locks die with their process).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from compactord.errors import (
    CompactordError,
    InsufficientDiskSpace,
    LedgerRootLocked,
    LedgerRootUnwritable,
    StorageUnavailable,
)

__all__ = ["RootLock", "unwritable"]


@contextlib.contextmanager
def unwritable(root: Path, what: str) -> Iterator[None]:
    """What fails while a root is opened (created, locked, its probe written) is ``LedgerRootUnwritable``: the
    daemon does not start (exit status 74)."""
    try:
        yield
    except (StorageUnavailable, InsufficientDiskSpace) as exc:
        raise LedgerRootUnwritable(
            f"ledger root {root} {what}: {exc}; compactedLedgerRoot must be a writable directory on a mounted "
            "file system with free space", root=str(root)) from exc
    except CompactordError:
        raise
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise LedgerRootUnwritable(
            f"ledger root {root} {what}: {reason} ({exc}); compactedLedgerRoot must be a writable directory on "
            "a mounted file system with free space", root=str(root)) from exc


class RootLock:
    def __init__(self, path: Path, root: Path) -> None:
        self.path = path
        self._root = root
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """:raises LedgerRootLocked: another live process, or another lock in this one, holds it."""
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            holder = _read_holder(fd)
            os.close(fd)
            raise LedgerRootLocked(
                f"ledger root {self._root} is locked by another compactord (pid {holder.get('pid', '?')} "
                f"on host {holder.get('host', '?')}, see {self.path}); only one daemon may write a root",
                root=str(self._root),
                holder=holder,
            ) from exc
        self._fd = fd
        try:
            holder = {"pid": os.getpid(), "host": socket.gethostname(), "started_at_ms": int(time.time() * 1000)}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(holder).encode() + b"\n", 0)
            os.fsync(fd)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Release the lock (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            # An empty lock file means "no holder", so a contender never names a stale one.
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _read_holder(fd: int) -> dict[str, Any]:
    """The holder a locked lock file names, or {} if it has not written itself yet."""
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
