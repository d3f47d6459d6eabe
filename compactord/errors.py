"""The error tree. Every error compactord raises on purpose is a ``CompactordError``.

Each class carries ``code``, the stable machine-readable name the API answers with
(``{"error": code, "message": ...}``), and ``status``, the HTTP status of that answer; a subclass
without its own ``status`` inherits its parent's, and a test checks that every class here sets one.

    CompactordError                     internal_error               500
    +-- ConfigError (ValueError)        bad_config                   422
    |   +-- PluginLoadError             bad_plugin_reference         422
    |   +-- ConfigFileError             bad_config_file              422
    +-- InvalidTopicName (ValueError)   invalid_topic_name           422
    +-- InvalidArgument (ValueError)    invalid_argument             422
    +-- TopicNotFound (LookupError)     topic_not_found              404
    +-- NotCompacted (LookupError)      not_compacted                404
    +-- EntryNotFound (LookupError)     entry_not_found              404
    +-- NoTaskRunning (LookupError)     no_task_running              404
    +-- PoliciesUnreadable              policies_unreadable          500
    +-- NotReady                        not_ready                    503
    +-- ServerBusy                      server_busy                  503
    +-- RequestTooLarge                 request_too_large            413
    +-- RequestTimeout (TimeoutError)   request_timeout              408
    +-- Unhealthy                       unhealthy                    503
    +-- BrokerUnavailable (ConnectionError)
    |                                   broker_unavailable           503
    +-- CompactionAlreadyRunning        compaction_already_running   409
    +-- TaskNotCancellable              task_not_cancellable         409
    +-- IllegalStateTransition (RuntimeError)
    |                                   illegal_state_transition     409
    +-- CompactionCancelled             compaction_cancelled         409
    +-- CompactionFailed (RuntimeError) compaction_failed            500
    |   +-- SparkError                  spark_error                  500
    |   +-- InsufficientDiskSpace       insufficient_disk_space      507
    +-- LedgerCorrupt                   ledger_corrupt               500
    +-- LedgerRetired (RuntimeError)    ledger_retired               410
    +-- TopicRecreated                  topic_recreated              410
    +-- LedgerRootLocked                ledger_root_locked           409
    |   +-- LedgerRootClaimed           ledger_root_claimed          409
    +-- LedgerRootUnwritable (OSError)  ledger_root_unwritable       503
    +-- Fenced                          fenced                       409
    |   +-- ConditionalWriteNotAtomic   store_not_atomic             500
    +-- NoOwner                         no_owner                     503
    +-- OwnerUnreachable (ConnectionError)
    |                                   owner_unreachable            503
    +-- StorageUnavailable (ConnectionError)
    |                                   storage_unavailable          503
    +-- PreconditionFailed              precondition_failed          500   (internal)
    +-- ObjectNotFound (LookupError)    object_not_found             500   (internal)
    +-- ObjectConflict                  object_conflict              500   (internal)
    +-- AuthenticationRequired          unauthorized                 401
    +-- PermissionDenied                permission_denied            403
    +-- HostNotAllowed                  host_not_allowed             400
    +-- MalformedRequest                malformed_request            400
    +-- RouteNotFound (LookupError)     not_found                    404
    +-- MethodNotAllowed                method_not_allowed           405
    +-- UnsupportedMediaType            unsupported_media_type       415
    +-- DaemonRequestFailed             daemon_request_failed        502   (client side)
    +-- DaemonUnreachable (ConnectionError)
    |                                   daemon_unreachable           502   (client side)
    |   +-- NotCompactordApi            not_compactord_api           502   (client side)

Third-party errors (kafka-python, py4j/Spark, the file system) are translated at one boundary each
(``kafka/client.py``, ``engine/spark_session.py``, each backend of ``storage/``) with ``raise ... from exc``.
``PreconditionFailed``, ``ObjectNotFound`` and ``ObjectConflict`` are the store's answers to its callers in ``ledger/``, which
turn them into ``Fenced``, ``LedgerCorrupt`` or ``LedgerRetired``; an API answer with them is a bug.
"""

from __future__ import annotations

from typing import Any


class CompactordError(Exception):
    """Root of compactord's errors. ``code`` is the stable, machine-readable name used by the API,
    ``status`` the HTTP status the API answers with."""

    code: str = "internal_error"
    status: int = 500
    #: The API's answer adds the topic's task in the way (``{"task": ...}``, null if none is live).
    carries_task: bool = False

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class ConfigError(CompactordError, ValueError):
    """A configuration key has a bad value, or is unknown."""

    code = "bad_config"
    status = 422

    def __init__(self, key: str, value: object, allowed: str) -> None:
        super().__init__(f"config key {key}={value!r} is invalid: {allowed}", key=key, value=value)
        self.key = key
        self.value = value


class ConfigFileError(ConfigError):
    """The config file given to ``run --config`` does not exist, cannot be read or is not properties text."""

    code = "bad_config_file"
    status = 422

    def __init__(self, path: object, problem: str) -> None:
        CompactordError.__init__(self, f"config file {path} {problem}", key="--config", value=str(path))
        self.key = "--config"
        self.value = str(path)


class InvalidTopicName(CompactordError, ValueError):
    code = "invalid_topic_name"
    status = 422


class InvalidArgument(CompactordError, ValueError):
    code = "invalid_argument"
    status = 422


class TopicNotFound(CompactordError, LookupError):
    code = "topic_not_found"
    status = 404

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} does not exist on the broker", topic=topic)
        self.topic = topic


class NotCompacted(CompactordError, LookupError):
    """The topic has no compacted ledger yet."""

    code = "not_compacted"
    status = 404

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} has never been compacted (no ledger)", topic=topic)


class EntryNotFound(CompactordError, LookupError):
    """A read found no entry (e.g. the last entry of an empty partition)."""

    code = "entry_not_found"
    status = 404


class PoliciesUnreadable(CompactordError):
    """A topic's stored policies file is corrupt (PUT or DELETE the policies to repair it)."""

    code = "policies_unreadable"
    status = 500


class NotReady(CompactordError):
    """``/readyz``: ledger reads cannot be served (the ledger root is unreadable, or the daemon is going
    down). A broker or Spark session that is down only degrades readiness (compactions cannot run)."""

    code = "not_ready"
    status = 503


class ServerBusy(CompactordError):
    """The HTTP API serves httpMaxConnections requests at once already: retry later."""

    code = "server_busy"
    status = 503


class RequestTooLarge(CompactordError):
    """A request's body is larger than httpMaxRequestBytes."""

    code = "request_too_large"
    status = 413


class RequestTimeout(CompactordError, TimeoutError):
    """A request's body did not arrive within httpRequestBodyTimeoutSeconds."""

    code = "request_timeout"
    status = 408


class Unhealthy(CompactordError):
    """The daemon cannot go on (its Spark JVM died): the supervisor should restart it."""

    code = "unhealthy"
    status = 503


class NoTaskRunning(CompactordError, LookupError):
    code = "no_task_running"
    status = 404

    def __init__(self, topic: str) -> None:
        super().__init__(f"no compaction of topic {topic!r} is running", topic=topic)


class BrokerUnavailable(CompactordError, ConnectionError):
    code = "broker_unavailable"
    status = 503


class CompactionAlreadyRunning(CompactordError):
    code = "compaction_already_running"
    status = 409
    carries_task = True

    def __init__(self, topic: str, task: Any = None) -> None:
        super().__init__(f"a compaction of topic {topic!r} is already running", topic=topic)
        self.task = task


class TaskNotCancellable(CompactordError):
    """A cancel was asked in a state that does not allow it (the switch, or an ended task)."""

    code = "task_not_cancellable"
    status = 409
    carries_task = True


class IllegalStateTransition(CompactordError, RuntimeError):
    code = "illegal_state_transition"
    status = 409
    carries_task = True


class CompactionCancelled(CompactordError):
    """Raised inside a task's work when it sees that it was cancelled."""

    code = "compaction_cancelled"
    status = 409
    carries_task = True


class CompactionFailed(CompactordError, RuntimeError):
    code = "compaction_failed"
    status = 500


class SparkError(CompactionFailed):
    """A Spark job failed (translated from py4j at ``spark/session.py``)."""

    code = "spark_error"
    status = 500


class LedgerCorrupt(CompactordError):
    """A ledger's files are missing or fail their checksum: it is never served."""

    code = "ledger_corrupt"
    status = 500


class LedgerRetired(CompactordError, RuntimeError):
    """The ledger was replaced by a newer one; acquire the topic's current handle again."""

    code = "ledger_retired"
    status = 410


class TopicRecreated(CompactordError):
    """The topic's log is not the one its ledger was made of (deleted and created again under its name):
    the ledger is not served until the rebuild that follows lands."""

    code = "topic_recreated"
    status = 410

    def __init__(self, topic: str, why: str) -> None:
        super().__init__(
            f"topic {topic!r} was recreated since its ledger was made ({why}); its compacted view is not "
            "served until the next compaction rebuilds it from the new log (PUT .../compaction); "
            f"DELETE /v1/topics/{topic} drops the old view instead",
            topic=topic)


class InsufficientDiskSpace(CompactionFailed):
    code = "insufficient_disk_space"
    status = 507


class LedgerRootLocked(CompactordError):
    """Another live daemon holds the ledger root."""

    code = "ledger_root_locked"
    status = 409


class LedgerRootClaimed(LedgerRootLocked):
    """The ledger root is claimed for another way of writing it: another cluster's (``@compactord/cluster`` names
    it), a cluster's while a single daemon opens it, or a live single daemon's while a cluster member opens it.
    The daemon refuses to start with exit status 2 (the same start fails again until the config changes)."""

    code = "ledger_root_claimed"
    status = 409


class LedgerRootUnwritable(CompactordError, OSError):
    """The ledger root cannot be created or written at start (read-only, full, no permission, an I/O
    error): the daemon refuses to start, with exit status 74 (EX_IOERR), since a disk that is not
    mounted yet may come back."""

    code = "ledger_root_unwritable"
    status = 503


class Fenced(CompactordError):
    """A switch lost: the topic's pointer changed since the task read it, or names a writer of a higher epoch.
    The task fails and changes nothing; the view stays as the winner left it."""

    code = "fenced"
    status = 409


class ConditionalWriteNotAtomic(Fenced):
    """A pointer written by compare-and-swap did not read back as written: the store let another writer's
    conditional write win from the same version too (it does not decide conditions atomically). The switch is
    not made; the view is the one the pointer names now."""

    code = "store_not_atomic"
    status = 500


class NoOwner(CompactordError):
    """In a cluster, a request that only a topic's owner may carry out found no member owning the topic (the
    cluster is rebalancing): retry after ``Retry-After``."""

    code = "no_owner"
    status = 503


class OwnerUnreachable(CompactordError, ConnectionError):
    """In a cluster, the member that owns a topic did not answer a request forwarded to it."""

    code = "owner_unreachable"
    status = 503


class StorageUnavailable(CompactordError, ConnectionError):
    """The ledger root's store failed an operation (an I/O error, a permission, an unreachable store)."""

    code = "storage_unavailable"
    status = 503


class PreconditionFailed(CompactordError):
    """A conditional write of the store found the object in another state than its condition
    (``put_if_absent``: it exists; ``put_if_match``: another version, or none)."""

    code = "precondition_failed"
    status = 500

    def __init__(self, message: str, *, key: str, current: str | None = None) -> None:
        super().__init__(message, key=key, current=current)
        self.key = key
        self.current = current


class ObjectNotFound(CompactordError, LookupError):
    """The store holds no object under the key read."""

    code = "object_not_found"
    status = 500

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message, key=key)
        self.key = key


class ObjectConflict(CompactordError):
    """An object's key is not usable as one: a folder is there, or the key passes through an object (a local
    root). The key's object is at fault, not the store, which answers."""

    code = "object_conflict"
    status = 500

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message, key=key)
        self.key = key


class PluginLoadError(ConfigError):
    """A ``module:Class`` reference in the configuration cannot be resolved."""

    code = "bad_plugin_reference"
    status = 422


class AuthenticationRequired(CompactordError):
    code = "unauthorized"
    status = 401


class PermissionDenied(CompactordError):
    code = "permission_denied"
    status = 403


class HostNotAllowed(CompactordError):
    """The request's Host header is not a name this daemon answers to (DNS rebinding)."""

    code = "host_not_allowed"
    status = 400


class MalformedRequest(CompactordError):
    """The request is not well-formed: HTTP its parser refuses (a raw non-ASCII target), or a body that is
    not JSON (not UTF-8, nested past the parser's depth)."""

    code = "malformed_request"
    status = 400


class RouteNotFound(CompactordError, LookupError):
    """No route of the API has this path."""

    code = "not_found"
    status = 404


class MethodNotAllowed(CompactordError):
    """The path is a route of the API, but not for this method."""

    code = "method_not_allowed"
    status = 405


class UnsupportedMediaType(CompactordError):
    """A state-changing request without ``Authorization`` must say ``Content-Type: application/json``
    (a browser cannot send that cross-site without a preflight)."""

    code = "unsupported_media_type"
    status = 415


class DaemonRequestFailed(CompactordError):
    """Client side (``client.DaemonClient``): the daemon answered with an error. The API never
    answers with this class; a proxy that relays it answers 502. ``answer_status`` and ``error`` are
    the daemon's status and code."""

    code = "daemon_request_failed"
    status = 502

    def __init__(self, method: str, path: str, answer_status: int, error: str | None, text: str,
                 answer: Any = None) -> None:
        super().__init__(f"{method} {path} failed ({answer_status}) {text}", answer_status=answer_status,
                         error=error)
        self.answer_status = answer_status
        self.error = error
        self.answer = answer  # the error's JSON body (a 409's holds the task in the way)


class DaemonUnreachable(CompactordError, ConnectionError):
    """Client side (``client.DaemonClient``): no answer from the daemon's URL."""

    code = "daemon_unreachable"
    status = 502

    def __init__(self, url: str, reason: object) -> None:
        super().__init__(f"cannot reach compactord at {url}: {reason}; start the daemon (compactord run) "
                         "or point --url (COMPACTORD_URL) at a running one", url=url)


class NotCompactordApi(DaemonUnreachable):
    """Client side (``client.DaemonClient``): something accepts connections at the daemon's URL but
    does not answer as its API: no HTTP answer, even to ``/healthz`` (often the broker's address), or
    HTTP answers that are not the API's (``answered`` says what came: another HTTP service)."""

    code = "not_compactord_api"
    status = 502

    def __init__(self, address: str, answered: str | None = None) -> None:
        if answered:
            text = (f"{address} {answered}, but it is not compactord's API: is it another HTTP service's "
                    "address (an S3 server's, say)?")
        else:
            text = f"{address} answers, but it is not compactord's API: is it the broker's address?"
        CompactordError.__init__(self, f"{text} point --url (COMPACTORD_URL) at the daemon's HTTP port", url=address)
