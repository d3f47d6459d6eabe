"""The object-store protocol every byte under the ledger root goes through, and what a listing says of an object.

The protocol asks only for what an object store gives (S3, GCS, Azure, a local disk): objects under
``/``-separated keys relative to the root, listed by prefix, read whole or by byte range, written whole,
created only if absent or replaced only if still at a version (the compare-and-swap that the ledger pointer
and the ledger ids are written with), deleted one by one or many at once. No rename, no append, no lock.

What differs between backends is declared on the store, never found out by its type: whether a version identifies
the bytes (``versions_identify_bytes``), the checks of a root at the start (``check``), free space
(``free_bytes``), folders that exist apart from their objects (``make_folder``), the local path of a root on this
host's file system (``local_root``, ``local_path``: the root's lock, Spark's scratch), where a writer spools an
object before ``put_file`` (``scratch_file``) and what another process needs to open the same store
(``descriptor``, ``credentials``). Conditional writes (``put_if_absent``, ``put_if_match``) every backend has.

Every backend maps its errors once, at its boundary: a full disk becomes ``InsufficientDiskSpace``, a lost
condition ``PreconditionFailed``, a missing object ``ObjectNotFound``, any other failure of the store
``StorageUnavailable``. The contract every backend passes is ``tests/unit/storage/test_contract.py``.
"""

from __future__ import annotations

import builtins
import io
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from compactord.errors import InvalidArgument

__all__ = ["ObjectInfo", "ObjectStore", "RangedFile", "check_key", "check_prefix"]


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object: its key, its size in bytes, its version (a token that changes at every write of the key:
    what ``put_if_match`` compares) and when it was last written (UTC seconds since the epoch)."""

    key: str
    size: int
    version: str
    modified: float


def check_key(key: str) -> str:
    """``key`` if it names an object: non-empty ``/``-separated segments, none ``.``/``..``, no leading ``/``.

    :raises InvalidArgument: it does not.
    """
    if not isinstance(key, str) or not key or key.startswith("/") or key.endswith("/") or "\\" in key \
            or "\0" in key or any(part in ("", ".", "..") for part in key.split("/")):
        raise InvalidArgument(
            f"an object key is one or more '/'-separated names, none empty, '.' or '..', got: {key!r}")
    return key


def check_prefix(prefix: str) -> str:
    """``prefix`` if it is empty (everything) or a key, optionally ending in ``/``.

    :raises InvalidArgument: it is neither.
    """
    if prefix:
        check_key(prefix.removesuffix("/"))
    return prefix


class ObjectStore(ABC):
    """The objects under one root. Implementations are safe to share between threads."""

    # True when an object's version changes with every write of its key and the store itself keeps the bytes it
    # took intact (an object store's checksums on upload and at rest): an object listed at the size and version
    # a manifest recorded is the object written, without reading it. A local disk's versions (its file times)
    # say nothing of bits that rot in place, so a local file is read to check it.
    versions_identify_bytes: bool = False

    @abstractmethod
    def describe(self) -> str:
        """Where the objects are, for messages: ``local root /x``, ``s3://bucket/prefix``."""

    def location(self, key: str) -> str:
        """Where the object ``key`` is, for messages (a local path, an ``s3://`` URL)."""
        return f"{key} in {self.describe()}"

    @abstractmethod
    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix``, sorted by key (``"a/"`` lists a's folder).

        :raises StorageUnavailable: the store cannot be listed.
        """

    @abstractmethod
    def children(self, prefix: str = "") -> builtins.list[str]:
        """The distinct names one level below ``prefix`` (which is empty or ends in ``/``), sorted: an object's
        name, a folder's (a prefix of deeper keys) ending in ``/``, as an object store's delimited listing
        gives them.

        :raises StorageUnavailable: the store cannot be listed.
        """

    @abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """The object under ``key``, or None if there is none.

        :raises StorageUnavailable: the store cannot be asked.
        """

    @abstractmethod
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """The bytes ``[start, end)`` of the object (``end`` None: to its end; a range past the end is cut).

        :raises ObjectNotFound: there is no object under ``key``.
        :raises InvalidArgument: ``start`` is negative, or ``end`` below ``start``.
        :raises StorageUnavailable: it cannot be read.
        """

    @abstractmethod
    def put(self, key: str, data: bytes) -> str:
        """Write the object whole (a reader sees the old or the new bytes, never a mix); return its version.

        :raises InsufficientDiskSpace: the store is full.
        :raises StorageUnavailable: it cannot be written.
        """

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> str:
        """``put``, only if no object is under ``key``: of writers racing, exactly one wins.

        :raises PreconditionFailed: an object is under ``key``.
        """

    @abstractmethod
    def put_if_match(self, key: str, data: bytes, version: str) -> str:
        """``put``, only if the object under ``key`` is still at ``version``: of writers racing from one
        version, exactly one wins.

        :raises PreconditionFailed: the object is at another version, or absent.
        """

    @abstractmethod
    def put_file(self, key: str, path: Path) -> str:
        """Write the local file ``path`` as the object (a large one in parts); return its version.

        :raises FileNotFoundError: ``path`` does not exist (a bug of the caller, not of the store).
        """

    @abstractmethod
    def copy(self, source: str, target: str) -> str:
        """Write the object ``source`` also as ``target`` (within the store, without reading it here); return
        the new object's version.

        :raises ObjectNotFound: there is no object under ``source``.
        """

    @abstractmethod
    def open_input(self, key: str) -> pa.NativeFile:
        """A random-access reader of the object, for Parquet reads (footers, row groups). Close it.

        :raises ObjectNotFound: there is no object under ``key``.
        """

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; an absent one is no error.

        :raises StorageUnavailable: it cannot be removed.
        """

    # -- what a backend declares --------------------------------------------------------------

    @property
    def local_root(self) -> Path | None:
        """The root's folder on this host's file system, where it is one (None: an object store)."""
        return None

    def local_path(self, key: str) -> Path | None:
        """The file of the object ``key`` on this host's file system, where the root is a folder of it."""
        root = self.local_root
        return None if root is None else root / check_key(key)

    def uri(self, key: str) -> str:
        """The object's address for a reader outside this store (pyiceberg's FileIO, a query engine): a local
        root's file by its absolute path, an object store's object by its URL (``s3://bucket/prefix/key``).

        :raises InvalidArgument: ``key`` is not a key, or the store's objects have no such address.
        """
        path = self.local_path(key)
        if path is None:
            raise InvalidArgument(f"the objects of {self.describe()} have no address outside it")
        return str(path)

    def check(self, key_name: str = "compactedLedgerRoot") -> None:
        """Refuse a root the daemon cannot use, before anything is written (an object store: its bucket, its
        credentials, its endpoint, that it enforces conditional writes); a store with nothing to check returns.

        :raises LedgerRootUnwritable: the root cannot be used, in one line naming ``key_name``.
        """

    def free_bytes(self) -> int | None:
        """The bytes free for new objects (a local root's file system, the root's nearest existing folder
        before it is made), or None where a store has no such bound (an object store).

        :raises OSError: the file system cannot be asked.
        """
        return None

    def make_folder(self, prefix: str) -> None:
        """Make the folder ``prefix`` durably where folders exist apart from their objects (a local root, whose
        Spark writers write into them); an object store has none: nothing."""
        check_prefix(prefix)

    def scratch_file(self, key: str) -> Path:
        """A new file of this host (made, or only named) for a writer to write the object ``key`` into before
        ``put_file(key, path)``, and to remove after it (``unlink(missing_ok=True)``): a temporary file of the
        host, or on a local root a hidden one beside the object, which ``put_file`` moves into place without a
        copy (listings never show it; ``recover`` removes one a crash left)."""
        name = check_key(key).rpartition("/")[2]
        fd, path = tempfile.mkstemp(prefix=f"compactord-{name}.", suffix=".tmp")
        os.close(fd)
        return Path(path)

    def descriptor(self) -> dict[str, Any]:
        """What another process (a Spark worker) needs to open this store itself with ``storage.open_described``,
        without its credentials (``credentials``): a JSON object.

        :raises InvalidArgument: the store cannot be opened elsewhere.
        """
        raise InvalidArgument(f"the tasks cannot open {self.describe()}: a local or an S3 store is")

    def credentials(self) -> dict[str, str]:
        """The secrets ``descriptor`` leaves out, for the run's channel to hand its tasks (empty: none)."""
        return {}

    def within(self, seconds: float) -> ObjectStore:
        """This store's objects through requests that give up within ``seconds`` (retries included), for a caller
        to whom a late answer is worth nothing (a lease's renewal, due again soon); a store whose requests have
        no such budget returns itself."""
        if not seconds > 0:
            raise ValueError(f"seconds must be positive, got: {seconds!r}")
        return self

    def recover(self) -> None:
        """Remove what writes an interrupted process left unfinished (a local root's temporary files, an object
        store's incomplete uploads). Called by the root's one writer when it opens the root, before it writes."""

    def abort_uploads(self, prefix: str, started_before: float) -> int:
        """Abort the unfinished uploads under ``prefix`` begun before ``started_before`` (UTC seconds); return how
        many. ``recover`` for a root in use: a younger upload may be a live writer's (a store that writes an
        object in one request has none)."""
        check_prefix(prefix)
        return 0

    def delete_many(self, keys: Iterable[str]) -> None:
        """``delete`` each of ``keys`` (a backend with a batch call overrides this)."""
        for key in keys:
            self.delete(key)

    def delete_prefix(self, prefix: str) -> builtins.list[str]:
        """Delete every object under ``prefix`` (which ends in ``/``); return their keys."""
        if not prefix.endswith("/"):
            raise InvalidArgument(f"a prefix to delete ends in '/', got: {prefix!r}")
        keys = [info.key for info in self.list(prefix)]
        self.delete_many(keys)
        return keys


class RangedFile(io.RawIOBase):
    """A read-only, seekable file of ``size`` bytes over the object ``key`` of ``objects`` (wrap it in
    ``pa.PythonFile`` for pyarrow): the bytes ``[start, start + len(data))`` are served from ``data``, already
    read; any other read is one ranged ``get`` (so the store's budget, errors and observer apply)."""

    def __init__(self, objects: ObjectStore, key: str, size: int, start: int = 0, data: bytes = b"") -> None:
        super().__init__()
        self._objects, self._key, self._size = objects, key, size
        self._start, self._bytes, self._data, self._pos = start, data, memoryview(data), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"a negative position: {base + offset}")
        self._pos = base + offset
        return self._pos

    def size(self) -> int:
        return self._size

    def read(self, n: int = -1) -> bytes:
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        if end <= self._pos:
            return b""
        lo, hi = self._pos - self._start, end - self._start
        if lo == 0 and hi == len(self._bytes):
            data = self._bytes  # all of it (what a row group's read asks): no copy
        elif lo >= 0 and hi <= len(self._data):
            data = self._data[lo:hi].tobytes()
        else:
            data = self._objects.get(self._key, self._pos, end)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        memoryview(buffer)[:len(data)] = data
        return len(data)
