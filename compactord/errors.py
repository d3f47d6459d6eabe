"""The error tree. Every error compactord raises on purpose is a ``CompactordError``.

Third-party errors (kafka-python, py4j/Spark, the file system) are translated at one boundary each
(``kafka/client.py``, ``spark/session.py``, ``ledger/store.py``) with ``raise ... from exc``.
``HTTP_STATUS`` maps every class to the HTTP status the API answers with; a test checks that every
subclass defined here has an entry.
"""

from __future__ import annotations

from typing import Any


class CompactordError(Exception):
    """Root of compactord's errors. ``code`` is the stable, machine-readable name used by the API."""

    code = "internal_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class ConfigError(CompactordError, ValueError):
    """A configuration key has a bad value, or is unknown."""

    code = "bad_config"

    def __init__(self, key: str, value: object, allowed: str) -> None:
        super().__init__(f"config key {key}={value!r} is invalid: {allowed}", key=key, value=value)
        self.key = key
        self.value = value


class InvalidTopicName(CompactordError, ValueError):
    code = "invalid_topic_name"


class InvalidArgument(CompactordError, ValueError):
    code = "invalid_argument"


class TopicNotFound(CompactordError, LookupError):
    code = "topic_not_found"

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} does not exist on the broker", topic=topic)
        self.topic = topic


class NotCompacted(CompactordError, LookupError):
    """The topic has no compacted ledger yet."""

    code = "not_compacted"

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} has never been compacted (no ledger)", topic=topic)


class EntryNotFound(CompactordError, LookupError):
    """A read found no entry (e.g. the last entry of an empty partition)."""

    code = "entry_not_found"


class PoliciesUnreadable(CompactordError):
    """A topic's stored policies file is corrupt (PUT or DELETE the policies to repair it)."""

    code = "policies_unreadable"


class NotReady(CompactordError):
    """The daemon is starting or its broker or Spark session is down."""

    code = "not_ready"


class NoTaskRunning(CompactordError, LookupError):
    code = "no_task_running"

    def __init__(self, topic: str) -> None:
        super().__init__(f"no compaction of topic {topic!r} is running", topic=topic)


class BrokerUnavailable(CompactordError, ConnectionError):
    code = "broker_unavailable"


class CompactionAlreadyRunning(CompactordError):
    code = "compaction_already_running"

    def __init__(self, topic: str, task: Any = None) -> None:
        super().__init__(f"a compaction of topic {topic!r} is already running", topic=topic)
        self.task = task


class TaskNotCancellable(CompactordError):
    """A cancel was asked in a state that does not allow it (the switch, or an ended task)."""

    code = "task_not_cancellable"


class IllegalStateTransition(CompactordError, RuntimeError):
    code = "illegal_state_transition"


class CompactionCancelled(CompactordError):
    """Raised inside a task's work when it sees that it was cancelled."""

    code = "compaction_cancelled"


class CompactionFailed(CompactordError, RuntimeError):
    code = "compaction_failed"


class SparkError(CompactionFailed):
    """A Spark job failed (translated from py4j at ``spark/session.py``)."""

    code = "spark_error"


class LedgerCorrupt(CompactordError):
    """A ledger's files are missing or fail their checksum: it is never served."""

    code = "ledger_corrupt"


class LedgerRetired(CompactordError, RuntimeError):
    """The ledger was replaced by a newer one; acquire the topic's current handle again."""

    code = "ledger_retired"


class InsufficientDiskSpace(CompactionFailed):
    code = "insufficient_disk_space"


class LedgerRootLocked(CompactordError):
    """Another live daemon holds the ledger root."""

    code = "ledger_root_locked"


class PluginLoadError(ConfigError):
    """A ``module:Class`` reference in the configuration cannot be resolved."""

    code = "bad_plugin_reference"


class AuthenticationRequired(CompactordError):
    code = "unauthorized"


class PermissionDenied(CompactordError):
    code = "forbidden"


HTTP_STATUS: dict[type[CompactordError], int] = {
    CompactordError: 500,
    ConfigError: 422,
    InvalidTopicName: 422,
    InvalidArgument: 422,
    TopicNotFound: 404,
    NotCompacted: 404,
    NoTaskRunning: 404,
    EntryNotFound: 404,
    NotReady: 503,
    PoliciesUnreadable: 500,
    BrokerUnavailable: 503,
    CompactionAlreadyRunning: 409,
    TaskNotCancellable: 409,
    IllegalStateTransition: 409,
    CompactionCancelled: 409,
    CompactionFailed: 500,
    SparkError: 500,
    LedgerCorrupt: 500,
    LedgerRetired: 410,
    InsufficientDiskSpace: 507,
    LedgerRootLocked: 409,
    PluginLoadError: 422,
    AuthenticationRequired: 401,
    PermissionDenied: 403,
}


def http_status(exc: CompactordError) -> int:
    """The HTTP status of an error: its own class's entry, else its nearest ancestor's."""
    for cls in type(exc).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]  # type: ignore[index]
    return 500
