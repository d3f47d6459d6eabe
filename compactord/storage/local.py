"""The store on a local disk: an object is a file under the root, its key the file's path relative to it.

Durability is the disk's usual one (``disk.py``): a put writes a temporary file, fsyncs it, renames it over the
key and fsyncs the folder, so a crash leaves the old or the new bytes. ``put_if_absent`` links the temporary
file to the key (a link fails on an existing name); ``put_if_match`` compares the version and renames under an
``flock`` of one lock file of the root, which every conditional write and delete takes (threads of this process
included: each takes its own open file). A version is the file's inode, modification time in nanoseconds (set
at each write) and size. Names that start with ``.~`` are the store's own (the lock, temporary files): listings
never show them. A folder that holds no object is no prefix: listings skip it, as an object store's do
(deletes leave folders in place, so that a writer about to create a file in one never loses it).
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import fcntl
import itertools
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from compactord.errors import (
    InsufficientDiskSpace,
    InvalidArgument,
    ObjectConflict,
    ObjectNotFound,
    PreconditionFailed,
    StorageUnavailable,
)
from compactord.storage.base import ObjectInfo, ObjectStore, check_key, check_prefix
from compactord.storage.disk import DISK_FULL, TMP_SUFFIX, fsync_path, remove_path, write_durable

__all__ = ["LocalStore"]

PRIVATE = ".~"
_LOCK = PRIVATE + "cas.lock"
_COUNTER = itertools.count()
# What a key's own place causes (a folder where its file goes, a file where its folder goes, a name too long):
# that object's fault, not the disk's.
_KEY_CONFLICTS = (errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG)


class LocalStore(ObjectStore):
    def __init__(self, root: str | Path) -> None:
        self.root: Path = Path(root).expanduser().resolve()

    def describe(self) -> str:
        return f"local root {self.root}"

    def location(self, key: str) -> str:
        return str(self.root / key)

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    # -- what a local root declares ---------------------------------------------------------------

    @property
    def local_root(self) -> Path:
        return self.root

    def free_bytes(self) -> int:
        # Before the root is made, the file system that will hold it.
        probe = next(p for p in (self.root, *self.root.parents) if p.exists())
        return shutil.disk_usage(probe).free

    def make_folder(self, prefix: str) -> None:
        folder = self.root / check_prefix(prefix).rstrip("/")
        if folder != self.root and not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            fsync_path(folder.parent)

    def scratch_file(self, key: str) -> Path:
        return self._temporary(self._path(key))

    def descriptor(self) -> dict[str, Any]:
        return {"root": str(self.root)}

    # -- reading --------------------------------------------------------------------------------

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        check_prefix(prefix)
        folder, _, start = prefix.rpartition("/")
        base = self.root / folder if folder else self.root
        found: list[ObjectInfo] = []
        with self._errors(f"listing {prefix!r}"):
            for name in _names(base):
                if name.startswith(start):
                    self._walk(base / name, f"{folder}/{name}" if folder else name, found)
        return sorted(found, key=lambda info: info.key)

    def _walk(self, path: Path, key: str, found: builtins.list[ObjectInfo]) -> None:
        try:
            st = path.stat()
        except FileNotFoundError:
            return  # deleted while listed
        if os.path.isdir(path):
            for name in _names(path):
                self._walk(path / name, f"{key}/{name}", found)
        else:
            found.append(_info(key, st))

    def children(self, prefix: str = "") -> builtins.list[str]:
        if prefix and not prefix.endswith("/"):
            raise InvalidArgument(f"children are asked of '' or a prefix ending in '/', got: {prefix!r}")
        check_prefix(prefix)
        base = self.root / prefix
        found = []
        with self._errors(f"listing {prefix!r}"):
            for name in _names(base):
                if not os.path.isdir(base / name):
                    found.append(name)
                elif _holds_objects(base / name):
                    found.append(name + "/")
        return sorted(found)

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        with self._errors(f"reading {key!r}"):
            try:
                st = path.stat()
            except (FileNotFoundError, NotADirectoryError):
                return None
        return None if os.path.isdir(path) else _info(key, st)

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if isinstance(start, bool) or not isinstance(start, int) or start < 0 or (end is not None and end < start):
            raise InvalidArgument(f"a range is 0 <= start <= end, got: start={start!r}, end={end!r}")
        path = self._path(key)
        with self._errors(f"reading {key!r}"), self._found(key), open(path, "rb") as f:
            f.seek(start)
            return f.read() if end is None else f.read(end - start)

    def open_input(self, key: str) -> pa.NativeFile:
        path = self._path(key)
        with self._errors(f"opening {key!r}"), self._found(key):
            if os.path.isdir(path):
                raise FileNotFoundError(errno.ENOENT, "a folder, not an object", str(path))
            try:
                return pa.OSFile(str(path), "r")
            except pa.ArrowException as exc:  # pyarrow's own error for a missing file
                if not path.exists():
                    raise FileNotFoundError(errno.ENOENT, str(exc), str(path)) from exc
                raise OSError(errno.EIO, str(exc), str(path)) from exc

    # -- writing --------------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> str:
        path = self._path(key)
        with self._errors(f"writing {key!r}", key):
            tmp = self._temporary(path)
            try:
                write_durable(tmp, data)
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
            fsync_path(path.parent)
            return _version(path.stat())

    def put_if_absent(self, key: str, data: bytes) -> str:
        path = self._path(key)
        with self._errors(f"creating {key!r}", key):
            tmp = self._temporary(path)
            try:
                write_durable(tmp, data)
                with self._locked():
                    try:
                        os.link(tmp, path)
                    except FileExistsError:
                        raise PreconditionFailed(f"{self.describe()}: {key!r} exists already", key=key,
                                                 current=self._version_of(path)) from None
                    version = _version(path.stat())
            finally:
                tmp.unlink(missing_ok=True)
            fsync_path(path.parent)
            return version

    def put_if_match(self, key: str, data: bytes, version: str) -> str:
        path = self._path(key)
        with self._errors(f"replacing {key!r}", key):
            tmp = self._temporary(path)
            try:
                write_durable(tmp, data)
                with self._locked():
                    current = self._version_of(path)
                    if current != version:
                        raise PreconditionFailed(
                            f"{self.describe()}: {key!r} is at version {current}, not {version}", key=key,
                            current=current)
                    os.replace(tmp, path)
                    new = _version(path.stat())
            finally:
                tmp.unlink(missing_ok=True)
            fsync_path(path.parent)
            return new

    def put_file(self, key: str, path: Path) -> str:
        target = self._path(key)
        source = Path(path)
        if not source.is_file():
            raise FileNotFoundError(errno.ENOENT, "no file to store", str(source))
        with self._errors(f"writing {key!r}", key):
            if source.resolve() == target.resolve():  # written in place (a task's part): only made durable
                fsync_path(target)
                fsync_path(target.parent)
                return _version(target.stat())
            if source.parent == target.parent and source.name.startswith(PRIVATE + target.name + "."):
                fsync_path(source)  # this store's scratch file of the object (``scratch_file``): moved, not copied
                os.replace(source, target)
                fsync_path(target.parent)
                return _version(target.stat())
            tmp = self._temporary(target)
            try:
                shutil.copyfile(source, tmp)
                fsync_path(tmp)
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
            fsync_path(target.parent)
            return _version(target.stat())

    def copy(self, source: str, target: str) -> str:
        src, dst = self._path(source), self._path(target)
        with self._errors(f"copying {source!r} to {target!r}", target), self._found(source):
            if os.path.isdir(src):
                raise FileNotFoundError(errno.ENOENT, "a folder, not an object", str(src))
            tmp = self._temporary(dst)
            try:
                os.link(src, tmp)  # a ledger's files never change: sharing them costs nothing
                os.replace(tmp, dst)
            finally:
                tmp.unlink(missing_ok=True)
            fsync_path(dst.parent)
            return _version(dst.stat())

    # -- removing -------------------------------------------------------------------------------

    def delete(self, key: str) -> None:
        path = self._path(key)
        with self._errors(f"deleting {key!r}"), self._locked():
            if os.path.isdir(path):
                return  # a prefix, not an object
            try:
                path.unlink()
            except (FileNotFoundError, NotADirectoryError):
                return
            fsync_path(path.parent)

    def delete_prefix(self, prefix: str) -> builtins.list[str]:
        # A folder goes as a whole: with it the files a crash left unnamed (a put's or a task's temporary file).
        keys = super().delete_prefix(prefix)
        with self._errors(f"deleting {prefix!r}"), self._locked():
            folder = self.root / prefix.rstrip("/")
            if folder != self.root:
                remove_path(folder)
        return keys

    def recover(self) -> None:
        # Temporary files of interrupted writes, and the folders that hold nothing then (deletes leave them).
        with self._errors("removing temporary files"):
            for folder, _subfolders, names in os.walk(self.root, topdown=False):
                for name in names:
                    if name.startswith(PRIVATE) and name.endswith(TMP_SUFFIX):
                        Path(folder, name).unlink(missing_ok=True)
                if Path(folder) != self.root and not os.listdir(folder):
                    os.rmdir(folder)

    # -- helpers --------------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        check_key(key)
        if any(part.startswith(PRIVATE) for part in key.split("/")):
            raise InvalidArgument(f"object keys starting with {PRIVATE!r} are the local store's own, got: {key!r}")
        return self.root / key

    def _temporary(self, path: Path) -> Path:
        """A new file name beside ``path`` that no listing shows; ``path``'s folders are created."""
        made = []
        for folder in reversed([path.parent, *path.parent.parents]):
            if folder.is_relative_to(self.root) and not folder.is_dir():
                folder.mkdir(exist_ok=True)
                made.append(folder)
        for folder in made:  # a new folder is durable once its parent is fsynced
            fsync_path(folder.parent)
        return path.with_name(f"{PRIVATE}{path.name}.{os.getpid()}-{threading.get_ident()}-{next(_COUNTER)}"
                              f"{TMP_SUFFIX}")

    def _version_of(self, path: Path) -> str | None:
        try:
            return _version(path.stat())
        except (FileNotFoundError, NotADirectoryError):
            return None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the last descriptor of the open file releases its lock

    @contextlib.contextmanager
    def _found(self, key: str) -> Iterator[None]:
        try:
            yield
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise ObjectNotFound(f"{self.describe()} has no object {key!r}", key=key) from exc

    @contextlib.contextmanager
    def _errors(self, what: str, key: str | None = None) -> Iterator[None]:
        """The boundary: a full disk is ``InsufficientDiskSpace``, a key whose place is taken (``key``'s,
        when one is named) ``ObjectConflict``, any other OS error ``StorageUnavailable``."""
        try:
            yield
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            if key is not None and exc.errno in _KEY_CONFLICTS:
                raise ObjectConflict(f"{self.describe()}: {what}: {reason} ({exc})", key=key) from exc
            if exc.errno in DISK_FULL:
                raise InsufficientDiskSpace(f"{self.describe()}: {what}: no space left on the device ({exc})") \
                    from exc
            raise StorageUnavailable(f"{self.describe()}: {what}: {reason} ({exc})", store=self.describe()) \
                from exc


def _names(folder: Path) -> list[str]:
    try:
        return [n for n in os.listdir(folder) if not n.startswith(PRIVATE)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _holds_objects(folder: Path) -> bool:
    """Whether a file other than the store's own is in ``folder`` or below (stops at the first)."""
    return any(not name.startswith(PRIVATE) for _, _, names in os.walk(folder) for name in names)


def _version(st: os.stat_result) -> str:
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"


def _info(key: str, st: os.stat_result) -> ObjectInfo:
    return ObjectInfo(key, st.st_size, _version(st), st.st_mtime_ns / 1e9)
