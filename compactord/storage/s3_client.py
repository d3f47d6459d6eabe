"""The S3 backend's boundary: where its connection is described (``S3Options``), its boto3 clients made, each
request timed for the observer, retried within its budget and its errors mapped to the store's.

Botocore's own retries are off: it cannot tell a read from a write, and the two have separate budgets. A read
(list, head, get) is tried at most twice and gives up within ``read_budget`` seconds (2 by default: a read of
the API answers 503 quickly rather than hanging on a store that is down); a write is retried with backoff until
``write_budget`` seconds (60) are spent, since a compaction's writes are worth waiting for. Each attempt's
connect and read timeouts are cut from its budget, so that a hung endpoint cannot hold an attempt past it.

What is retried: a throttle (503 SlowDown, 429), a server error (5xx), a connection refused, reset or timed out,
a body cut short. Anything else (403, 404, 412, a bad request) is an answer, and is mapped at once.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import botocore.exceptions as boto_errors
from botocore.config import Config

from compactord.errors import ObjectNotFound, PreconditionFailed, StorageUnavailable

__all__ = ["Observer", "RequestFailed", "S3Options", "Transport", "error_code", "status_of"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Called after every request to the store (retries included) with its operation and how long it took.
Observer = Callable[[str, float], None]

_THROTTLED = {"SlowDown", "Throttling", "ThrottlingException", "RequestThrottled", "TooManyRequests",
              "RequestLimitExceeded", "ServiceUnavailable", "InternalError", "RequestTimeout"}
_TRANSIENT = (boto_errors.HTTPClientError, boto_errors.ConnectionError, boto_errors.IncompleteReadError)
_BACKOFF_FIRST_S = 0.1
_BACKOFF_MAX_S = 5.0
_SESSION: Any = None
_SESSION_LOCK = threading.Lock()


@dataclass(frozen=True)
class S3Options:
    """How to reach a bucket: what ``s3Endpoint``, ``s3Region``, the credentials, ``s3PathStyleAccess``,
    ``s3CaBundle`` and the server-side encryption keys say. The secret never shows in its repr."""

    region: str
    endpoint: str = ""  # empty: AWS's endpoint of the region
    access_key_id: str = ""  # both empty: the standard AWS credential chain
    secret_access_key: str = field(default="", repr=False)
    path_style: bool | None = None  # None: path style when an endpoint is set
    ca_bundle: str = ""
    server_side_encryption: str = ""  # "", AES256 or aws:kms
    kms_key_id: str = ""

    def where(self) -> str:
        return self.endpoint or f"AWS S3 in {self.region}"

    def write_args(self) -> dict[str, str]:
        """The arguments every put and multipart upload carries (the server-side encryption)."""
        args: dict[str, str] = {}
        if self.server_side_encryption:
            args["ServerSideEncryption"] = self.server_side_encryption
        if self.kms_key_id:
            args["SSEKMSKeyId"] = self.kms_key_id
        return args


class RequestFailed(Exception):
    """An answer of the store that is not retried (``exc`` is botocore's), or retries that ran out."""

    def __init__(self, exc: Exception, attempts: int) -> None:
        super().__init__(str(exc))
        self.exc = exc
        self.attempts = attempts


def error_code(exc: Exception) -> str:
    """S3's error code of a ``ClientError`` (``NoSuchKey``, ``PreconditionFailed``, ``404``), else ''."""
    if isinstance(exc, boto_errors.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def status_of(exc: Exception) -> int:
    if isinstance(exc, boto_errors.ClientError):
        return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return 0


def _transient(exc: Exception) -> bool:
    if isinstance(exc, _TRANSIENT):
        return True
    status = status_of(exc)
    return status >= 500 or status == 429 or error_code(exc) in _THROTTLED


class Transport:
    """Two boto3 clients on one endpoint (reads and writes, each with its budget's timeouts), the retry loop and
    the observer. ``describe`` names the store in every error."""

    def __init__(self, options: S3Options, describe: str, *, read_budget: float, write_budget: float,
                 observer: Observer | None, session: Any = None) -> None:
        if read_budget <= 0 or write_budget <= 0:
            raise ValueError(f"budgets must be positive, got: read={read_budget}, write={write_budget}")
        import boto3  # the s3 extra: only an S3 root needs it

        self.options = options
        self.describe = describe
        self.read_budget = read_budget
        self.write_budget = write_budget
        self.observer = observer
        session = session or _shared_session(boto3)
        # Within a budget of B, a read's attempt waits at most B/5 to connect and B/5 for each answer: two of them
        # and the pause between fit. A write's attempt may outlast its budget by one attempt's timeouts.
        self._read_attempt_s = 2 * read_budget / 5
        self.reader = self._client(session, connect=read_budget / 5, read=read_budget / 5)
        self.writer = self._client(session, connect=min(5.0, write_budget / 4), read=min(30.0, write_budget / 2))

    def _client(self, session: Any, *, connect: float, read: float) -> Any:
        o = self.options
        path_style = bool(o.endpoint) if o.path_style is None else o.path_style
        config = Config(
            region_name=o.region,
            connect_timeout=connect,
            read_timeout=read,
            retries={"total_max_attempts": 1},  # ours, by budget (see the module's docstring)
            s3={"addressing_style": "path" if path_style else "virtual"},
            max_pool_connections=32,  # Spark's threads and the API's readers share one store
            # Checksums only where S3 requires them: every S3-compatible store accepts that, and a part's
            # integrity is the ledger's own checksum (its manifest), verified on read.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        kwargs: dict[str, Any] = {"config": config, "region_name": o.region}
        if o.endpoint:
            kwargs["endpoint_url"] = o.endpoint
        if o.access_key_id or o.secret_access_key:
            kwargs["aws_access_key_id"] = o.access_key_id
            kwargs["aws_secret_access_key"] = o.secret_access_key
        if o.ca_bundle:
            kwargs["verify"] = o.ca_bundle
        with _SESSION_LOCK:
            return session.client("s3", **kwargs)


    # -- the loop ---------------------------------------------------------------------------------

    def read(self, op: str, call: Callable[[Any], T]) -> T:
        """``call(client)`` as a read: at most two attempts, within the read budget."""
        return self._attempts(op, call, self.reader, self.read_budget, max_attempts=2,
                              attempt_s=self._read_attempt_s)

    def write(self, op: str, call: Callable[[Any], T]) -> T:
        """``call(client)`` as a write: retried with backoff within the write budget."""
        return self._attempts(op, call, self.writer, self.write_budget, max_attempts=None, attempt_s=0.0)

    def _attempts(self, op: str, call: Callable[[Any], T], client: Any, budget: float,
                  max_attempts: int | None, attempt_s: float) -> T:
        deadline = time.monotonic() + budget
        attempt = 0
        while True:
            attempt += 1
            started = time.monotonic()
            try:
                return call(client)
            except Exception as exc:
                if not isinstance(exc, (boto_errors.BotoCoreError, boto_errors.ClientError)):
                    raise
                delay = min(_BACKOFF_MAX_S, _BACKOFF_FIRST_S * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
                last = max_attempts is not None and attempt >= max_attempts
                if not _transient(exc) or last or time.monotonic() + delay + attempt_s >= deadline:
                    raise RequestFailed(exc, attempt) from exc
                log.debug("%s: %s failed (%s), attempt %d, retried in %.2f s", self.describe, op, exc, attempt,
                          delay)
                time.sleep(delay)
            finally:
                if self.observer is not None:
                    self.observer(op, time.monotonic() - started)

    # -- mapping ----------------------------------------------------------------------------------

    def unavailable(self, what: str, failed: RequestFailed) -> StorageUnavailable:
        exc = failed.exc
        tries = f" after {failed.attempts} attempts" if failed.attempts > 1 else ""
        code = error_code(exc)
        reason = f"{code}: {_message(exc)}" if code else f"{type(exc).__name__}: {exc}"
        return StorageUnavailable(f"{self.describe}: {what} failed{tries} ({reason})", store=self.describe,
                                  code=code or type(exc).__name__)

    def not_found(self, key: str) -> ObjectNotFound:
        return ObjectNotFound(f"{self.describe} has no object {key!r}", key=key)

    def precondition(self, key: str, why: str, current: str | None) -> PreconditionFailed:
        return PreconditionFailed(f"{self.describe}: {key!r} {why}", key=key, current=current)


def _message(exc: Exception) -> str:
    if isinstance(exc, boto_errors.ClientError):
        return str(exc.response.get("Error", {}).get("Message", "")) or str(exc)
    return str(exc)


def _shared_session(boto3: Any) -> Any:
    """One boto3 session per process: a client made from it reuses the service model it loaded once (a new
    session reads it again, ~0.3 s a client)."""
    global _SESSION
    with _SESSION_LOCK:
        if _SESSION is None:
            _SESSION = boto3.session.Session()
        return _SESSION
