"""The store in an S3 bucket (AWS or any S3-compatible server): an object is an object under the root's prefix.

A version is the object's ETag, what S3's conditional writes compare: ``put_if_absent`` is a put with
``If-None-Match: *``, ``put_if_match`` one with ``If-Match: <ETag>``; the server decides, so of writers racing
exactly one wins. An ETag names the bytes (the MD5 of a single put), so two writes of the same bytes have one
version. A conditional write retried after a lost answer may find its own first attempt done: a 412 then is a
win when the object holds the bytes it wrote.

Large files go up in parts (``put_file``), each part retried within the write budget, the upload aborted when
it fails. Some S3-compatible servers keep a folder entry once its last object is deleted, which a delimited
listing shows as a prefix: each delete also deletes the folder markers (``a/b/``) of the keys it deleted, which
such a server does only for an empty folder and S3 itself treats as absent keys (a free request).

``check`` is what a daemon's start asks: the bucket is there, the credentials are good, the endpoint answers,
and conditional writes are enforced (a store that ignores them would let two writers both win).
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from compactord.errors import InvalidArgument, LedgerRootUnwritable, PreconditionFailed, StorageUnavailable
from compactord.storage.base import ObjectInfo, ObjectStore, RangedFile, check_key, check_prefix
from compactord.storage.s3_client import Observer, RequestFailed, S3Options, Transport, error_code, status_of

__all__ = ["DEFAULT_PART_SIZE", "S3Options", "S3Store"]

DEFAULT_PART_SIZE = 16 * 1024 * 1024
_MIN_PART_SIZE = 5 * 1024 * 1024  # S3's floor for every part but the last
_DELETE_BATCH = 1000  # S3's most keys in one DeleteObjects
_RETRIED_WIN_MAX_BYTES = 1024 * 1024  # a 412 after a retry: compare the object with what was written
_CHECK_PREFIX = "@compactord/check/"
# The settings a task needs to reach the bucket, in a store's descriptor; the keys travel apart (``credentials``).
DESCRIBED_OPTIONS = ("region", "endpoint", "path_style", "ca_bundle", "server_side_encryption", "kms_key_id")


class S3Store(ObjectStore):
    """The objects under ``s3://bucket/prefix``. ``observer`` hears of every request (its operation and seconds);
    ``read_budget`` and ``write_budget`` are the seconds a read and a write may spend retrying."""

    versions_identify_bytes = True  # a version is the ETag, and S3 checks each upload's bytes and keeps them

    def __init__(self, bucket: str, prefix: str, options: S3Options, *, observer: Observer | None = None,
                 read_budget: float = 2.0, write_budget: float = 60.0, part_size: int = DEFAULT_PART_SIZE,
                 session: Any = None) -> None:
        if part_size < _MIN_PART_SIZE:
            raise InvalidArgument(f"part_size must be at least {_MIN_PART_SIZE} bytes (S3's floor), got: {part_size}")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.options = options
        self.part_size = part_size
        self.read_budget, self.write_budget = read_budget, write_budget
        self._base = f"{self.prefix}/" if self.prefix else ""
        self._io = Transport(options, self.describe(), read_budget=read_budget, write_budget=write_budget,
                             observer=observer, session=session)
        self._observer, self._session = observer, session

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def __repr__(self) -> str:
        return f"S3Store({self.describe()!r}, endpoint={self.options.where()!r})"

    def descriptor(self) -> dict[str, Any]:
        return {"root": f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}",
                "s3": {name: getattr(self.options, name) for name in DESCRIBED_OPTIONS},
                # storageReadRetrySeconds and storageWriteRetrySeconds: a task's writes give up as the driver's do
                "budgets": {"read_budget": self.read_budget, "write_budget": self.write_budget}}

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    def credentials(self) -> dict[str, str]:
        if not self.options.access_key_id:
            return {}  # none, or the AWS chain
        return {"access_key_id": self.options.access_key_id, "secret_access_key": self.options.secret_access_key}

    def within(self, seconds: float) -> S3Store:
        super().within(seconds)
        return S3Store(self.bucket, self.prefix, self.options, observer=self._observer, part_size=self.part_size,
                       read_budget=min(self.read_budget, seconds), write_budget=min(self.write_budget, seconds),
                       session=self._session)

    # -- reading --------------------------------------------------------------------------------

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        check_prefix(prefix)
        found = [self._info(item) for page in self._pages(prefix, delimiter=False) for item in page.get("Contents", [])]
        return sorted((i for i in found if i is not None), key=lambda info: info.key)

    def children(self, prefix: str = "") -> builtins.list[str]:
        if prefix and not prefix.endswith("/"):
            raise InvalidArgument(f"children are asked of '' or a prefix ending in '/', got: {prefix!r}")
        check_prefix(prefix)
        names: set[str] = set()
        cut = len(self._base) + len(prefix)
        for page in self._pages(prefix, delimiter=True):
            names.update(item["Key"][cut:] for item in page.get("Contents", []) if not item["Key"].endswith("/"))
            names.update(common["Prefix"][cut:] for common in page.get("CommonPrefixes", []))
        return sorted(name for name in names if name and name != "/")

    def _pages(self, prefix: str, *, delimiter: bool) -> Iterable[dict[str, Any]]:
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._base + prefix}
        if delimiter:
            args["Delimiter"] = "/"
        while True:
            try:
                page = self._io.read("list", lambda c: c.list_objects_v2(**args))
            except RequestFailed as failed:
                raise self._io.unavailable(f"listing {prefix!r}", failed) from failed.exc
            yield page
            if not page.get("IsTruncated"):
                return
            args["ContinuationToken"] = page["NextContinuationToken"]

    def _info(self, item: dict[str, Any]) -> ObjectInfo | None:
        key = item["Key"][len(self._base):]
        if key.endswith("/") or not key:  # a folder marker, not an object of the store
            return None
        return ObjectInfo(key, int(item["Size"]), item["ETag"], _seconds(item["LastModified"]))

    def head(self, key: str) -> ObjectInfo | None:
        full = self._key(key)
        try:
            answer = self._io.read("head", lambda c: c.head_object(Bucket=self.bucket, Key=full))
        except RequestFailed as failed:
            if status_of(failed.exc) == 404:
                return None
            raise self._io.unavailable(f"reading {key!r}", failed) from failed.exc
        return ObjectInfo(key, int(answer["ContentLength"]), answer["ETag"], _seconds(answer["LastModified"]))

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if isinstance(start, bool) or not isinstance(start, int) or start < 0 or (end is not None and end < start):
            raise InvalidArgument(f"a range is 0 <= start <= end, got: start={start!r}, end={end!r}")
        full = self._key(key)
        if end == start:  # S3 has no empty range; the object must still exist
            if self.head(key) is None:
                raise self._io.not_found(key)
            return b""
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": full}
        if start or end is not None:
            args["Range"] = f"bytes={start}-" + ("" if end is None else str(end - 1))

        def call(c: Any) -> bytes:
            body = c.get_object(**args)["Body"]
            try:
                return body.read()  # inside the attempt: a body cut short is retried
            finally:
                body.close()

        try:
            return self._io.read("get", call)
        except RequestFailed as failed:
            if error_code(failed.exc) == "NoSuchKey" or status_of(failed.exc) == 404:
                raise self._io.not_found(key) from failed.exc
            if status_of(failed.exc) == 416:  # a range that starts at or past the end
                return b""
            raise self._io.unavailable(f"reading {key!r}", failed) from failed.exc

    def open_input(self, key: str) -> pa.NativeFile:
        info = self.head(key)
        if info is None:
            raise self._io.not_found(key)
        return pa.PythonFile(RangedFile(self, key, info.size), mode="r")  # each read a ranged GET

    # -- writing --------------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> str:
        return self._put("put", key, data, {})

    def put_if_absent(self, key: str, data: bytes) -> str:
        return self._put("put_if_absent", key, data, {"IfNoneMatch": "*"})

    def put_if_match(self, key: str, data: bytes, version: str) -> str:
        return self._put("put_if_match", key, data, {"IfMatch": version})

    def _put(self, op: str, key: str, data: bytes, condition: dict[str, str]) -> str:
        full = self._key(key)
        args = {"Bucket": self.bucket, "Key": full, "Body": data, **condition, **self.options.write_args()}
        tries = 0

        def call(c: Any) -> str:
            nonlocal tries
            tries += 1
            return str(c.put_object(**args)["ETag"])

        try:
            return self._io.write(op, call)
        except RequestFailed as failed:
            if not condition or not (error_code(failed.exc) in ("PreconditionFailed", "ConditionalRequestConflict")
                                     or status_of(failed.exc) in (409, 412)
                                     or (error_code(failed.exc) == "NoSuchKey" and "IfMatch" in condition)):
                raise self._io.unavailable(f"writing {key!r}", failed) from failed.exc
            current = self.head(key)
            if tries > 1 and current is not None and len(data) <= _RETRIED_WIN_MAX_BYTES \
                    and self.get(key) == data:
                return current.version  # an earlier attempt of this write won; its answer was lost
            why = "exists already" if "IfNoneMatch" in condition else (
                f"is at version {current.version if current else 'none (absent)'}, not {condition['IfMatch']}")
            raise self._io.precondition(key, why, current.version if current else None) from failed.exc

    def put_file(self, key: str, path: Path) -> str:
        source = Path(path)
        if not source.is_file():
            raise FileNotFoundError(2, "no file to store", str(source))
        size = source.stat().st_size
        if size <= self.part_size:
            return self._put("put_file", key, source.read_bytes(), {})
        return self._multipart(key, source, size)

    def copy(self, source: str, target: str) -> str:
        # Within the bucket, by the server (CopyObject: objects up to 5 GB, far above a ledger part's size).
        args = {"Bucket": self.bucket, "Key": self._key(target),
                "CopySource": {"Bucket": self.bucket, "Key": self._key(source)}, **self.options.write_args()}
        try:
            etag = str(self._io.write("copy", lambda c: c.copy_object(**args))["CopyObjectResult"]["ETag"])
            return etag if etag.startswith('"') else f'"{etag}"'  # some servers leave a copy's ETag unquoted
        except RequestFailed as failed:
            if error_code(failed.exc) == "NoSuchKey" or status_of(failed.exc) == 404:
                raise self._io.not_found(source) from failed.exc
            raise self._io.unavailable(f"copying {source!r} to {target!r}", failed) from failed.exc

    def _multipart(self, key: str, source: Path, size: int) -> str:
        full = self._key(key)
        what = f"uploading {key!r}"
        try:
            upload = self._io.write("put_file", lambda c: c.create_multipart_upload(
                Bucket=self.bucket, Key=full, **self.options.write_args()))["UploadId"]
        except RequestFailed as failed:
            raise self._io.unavailable(what, failed) from failed.exc
        try:
            parts = []
            with open(source, "rb") as f:
                for number, offset in enumerate(range(0, size, self.part_size), start=1):
                    f.seek(offset)
                    chunk = f.read(self.part_size)
                    def put_part(c: Any, n: int = number, b: bytes = chunk) -> str:
                        return c.upload_part(Bucket=self.bucket, Key=full, UploadId=upload, PartNumber=n, Body=b)["ETag"]

                    etag = self._io.write("put_file", put_part)
                    parts.append({"PartNumber": number, "ETag": etag})
            return str(self._io.write("put_file", lambda c: c.complete_multipart_upload(
                Bucket=self.bucket, Key=full, UploadId=upload, MultipartUpload={"Parts": parts}))["ETag"])
        except RequestFailed as failed:
            self._abort(full, upload)
            raise self._io.unavailable(what, failed) from failed.exc
        except BaseException:
            self._abort(full, upload)
            raise

    def _abort(self, full: str, upload: str) -> None:
        # Best effort: an upload left behind is what the bucket's lifecycle rule (abort after a day) and
        # ``recover`` remove.
        try:
            self._io.read("put_file", lambda c: c.abort_multipart_upload(Bucket=self.bucket, Key=full,
                                                                          UploadId=upload))
        except RequestFailed:
            pass

    # -- removing -------------------------------------------------------------------------------

    def delete(self, key: str) -> None:
        self.delete_many([key])

    def delete_many(self, keys: Iterable[str]) -> None:
        batch: list[str] = []
        markers: set[str] = set()
        for key in keys:
            full = self._key(key)
            batch.append(full)
            markers.update(_folders(full, self._base))
            if len(batch) == _DELETE_BATCH:
                self._delete_batch(batch)
                batch = []
        # Deepest first: a folder is empty only once the folders below it are gone.
        ordered = batch + sorted(markers, key=lambda m: (-m.count("/"), m))
        for start in range(0, len(ordered), _DELETE_BATCH):
            self._delete_batch(ordered[start:start + _DELETE_BATCH])

    def _delete_batch(self, keys: builtins.list[str]) -> None:
        if not keys:
            return
        request = {"Objects": [{"Key": k} for k in keys], "Quiet": True}
        try:
            answer = self._io.write("delete", lambda c: c.delete_objects(Bucket=self.bucket, Delete=request))
        except RequestFailed as failed:
            raise self._io.unavailable(f"deleting {len(keys)} objects", failed) from failed.exc
        errors = [e for e in answer.get("Errors", []) if not e.get("Key", "").endswith("/")]
        if errors:  # a folder marker that is not empty is refused, and stays, as it should
            first = errors[0]
            raise StorageUnavailable(
                f"{self.describe()}: deleting {first.get('Key')!r} failed ({first.get('Code')}: "
                f"{first.get('Message')}; {len(errors)} keys not deleted)", store=self.describe())

    def recover(self) -> None:
        """Abort the multipart uploads under the root that a process left unfinished."""
        for upload in self._uploads(""):
            self._abort(upload["Key"], upload["UploadId"])

    def abort_uploads(self, prefix: str, started_before: float) -> int:
        check_prefix(prefix)
        old = [u for u in self._uploads(prefix) if _seconds(u["Initiated"]) < started_before]
        for upload in old:
            self._abort(upload["Key"], upload["UploadId"])
        return len(old)

    def _uploads(self, prefix: str) -> Iterable[dict[str, Any]]:
        """The unfinished multipart uploads under ``prefix`` (keys in full, with the root's prefix)."""
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._base + prefix}
        while True:
            try:
                page = self._io.read("list", lambda c: c.list_multipart_uploads(**args))
            except RequestFailed as failed:
                raise self._io.unavailable("listing unfinished uploads", failed) from failed.exc
            yield from page.get("Uploads", [])
            if not page.get("IsTruncated"):
                return
            args["KeyMarker"] = page.get("NextKeyMarker", "")
            args["UploadIdMarker"] = page.get("NextUploadIdMarker", "")

    # -- the start's checks ---------------------------------------------------------------------

    def check(self, key_name: str = "compactedLedgerRoot") -> None:
        """Refuse a root the daemon cannot use: the bucket missing, the credentials wrong, the endpoint
        unreachable, or conditional writes not enforced.

        :raises LedgerRootUnwritable: one of those, in one line naming ``key_name`` and what was wrong.
        """
        where = self.options.where()
        try:
            self._io.read("head", lambda c: c.head_bucket(Bucket=self.bucket))
        except RequestFailed as failed:
            raise LedgerRootUnwritable(f"{key_name}={self.describe()}: {_start_problem(failed, where)}") \
                from failed.exc
        probe = f"{_CHECK_PREFIX}{uuid.uuid4().hex}"
        try:
            try:
                first = self.put_if_absent(probe, b"1")
                enforced = _refused(lambda: self.put_if_absent(probe, b"2")) \
                    and _refused(lambda: self.put_if_match(probe, b"3", '"0123456789abcdef0123456789abcdef"'))
                self.put_if_match(probe, b"4", first)
            finally:
                self.delete(probe)
        except StorageUnavailable as exc:
            raise LedgerRootUnwritable(f"{key_name}={self.describe()}: cannot be written ({exc.message})") \
                from exc
        except Exception as exc:  # the conditional writes of a store that ignores them fail in odd ways
            raise LedgerRootUnwritable(
                f"{key_name}={self.describe()}: the store at {where} does not enforce conditional writes "
                f"({type(exc).__name__}: {exc})") from exc
        if not enforced:
            raise LedgerRootUnwritable(
                f"{key_name}={self.describe()}: the store at {where} ignores conditional writes (a put with "
                "If-None-Match on an existing object or If-Match on another ETag succeeded); the ledger "
                "pointer needs them, so two writers could both win")

    # -- helpers --------------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        return self._base + check_key(key)


def _refused(write: Any) -> bool:
    try:
        write()
    except PreconditionFailed:
        return True
    return False


def _start_problem(failed: RequestFailed, where: str) -> str:
    status, code = status_of(failed.exc), error_code(failed.exc)
    if status == 404 or code == "NoSuchBucket":
        return f"the bucket does not exist at {where}"
    if status in (401, 403) or code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied"):
        return f"access denied at {where}: wrong credentials, or no permission on the bucket ({code or status})"
    if code or status:
        return f"the store at {where} answered {code or status}"
    return f"the store at {where} cannot be reached ({type(failed.exc).__name__}: {failed.exc})"


def _folders(full: str, base: str) -> list[str]:
    """The folder markers above ``full`` below the root's prefix: ``p/t/l/k`` under ``p/`` -> t/l/, t/."""
    parts = full[len(base):].split("/")[:-1]
    return [base + "/".join(parts[:n]) + "/" for n in range(len(parts), 0, -1)]


def _seconds(modified: datetime) -> float:
    return modified.timestamp()
