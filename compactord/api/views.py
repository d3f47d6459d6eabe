"""The JSON shapes of the API: every dict an endpoint answers with is built here.

Every error is ``{"error": code, "message": text}`` (and, for a 409, the task in the way). A server
error (5xx) answers a fixed text for its code, never its details: those name ledger paths, broker
addresses and exception texts, which go to the log (the caller may hold no token).
"""

from __future__ import annotations

import binascii
import logging
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse

from compactord.errors import CompactordError, InvalidArgument
from compactord.model import Entry, LedgerManifest, iso_utc
from compactord.task import CompactionTaskCtx, TaskState

if TYPE_CHECKING:
    from compactord.config import Settings
    from compactord.daemon.core import Daemon, Readiness
    from compactord.daemon.policies import TopicPolicies

__all__ = [
    "deleted_json",
    "entry_json",
    "error_response",
    "horizon_json",
    "optional_task_status",
    "page_json",
    "policies_json",
    "problem_response",
    "readiness_json",
    "task_status",
    "tasks_json",
    "topic_status",
    "topics_json",
    "unloaded_json",
]

log = logging.getLogger(__name__)

_NO_PROGRESS = {"records_read": 0, "records_total": 0}
# What a server error says over HTTP, by code. A code not listed gets the last line.
_SERVER_ERROR_TEXT = {
    "ledger_corrupt": ("the topic's compacted ledger or its pointer is corrupt (a rebuild replaces it: PUT "
                       "/v1/topics/{topic}/compaction?rebuild=true); details are in the daemon's log"),
    "policies_unreadable": ("the topic's stored policies (policies.json) cannot be read; PUT or DELETE its "
                            "policies to replace them; details are in the daemon's log"),
    "broker_unavailable": "the broker does not answer; details are in the daemon's log",
    "insufficient_disk_space": "the ledger root's disk is full; details are in the daemon's log",
    "spark_error": "a Spark job failed; details are in the daemon's log",
    "compaction_failed": "the compaction failed; details are in the daemon's log",
}
_SERVER_ERROR_DEFAULT = "the daemon could not answer this request; details are in the daemon's log"
# Built from fixed phrases and config values only (``Daemon.readiness_problems``, ``api/limits.py``): safe
# to answer as is.
_PLAIN_SERVER_ERRORS = frozenset({"not_ready", "unhealthy", "server_busy"})


# -- errors -------------------------------------------------------------------------------------


def public_message(status: int, code: str, message: str) -> str:
    """What an error says over HTTP: a client error its own message (it is about the request), a
    server error a fixed text for its code (its message stays in the log)."""
    if status < 500 or code in _PLAIN_SERVER_ERRORS:
        return message
    return _SERVER_ERROR_TEXT.get(code, _SERVER_ERROR_DEFAULT)


def problem_response(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    """An error answer that has no class in the error tree (a 404 route, a 405, a validation error)."""
    return JSONResponse({"error": code, "message": public_message(status, code, message), **extra},
                        status_code=status)


def error_response(exc: CompactordError, **extra: Any) -> JSONResponse:
    """The answer to a ``CompactordError``: its class's status and code, its message."""
    return problem_response(exc.status, exc.code, exc.message, **extra)


# -- health -------------------------------------------------------------------------------------


def readiness_json(readiness: Readiness) -> dict[str, Any]:
    return {"status": readiness.status, "compactions": readiness.compactions, "reads": readiness.reads,
            "problems": readiness.problems}


# -- tasks and topics ---------------------------------------------------------------------------


def task_status(ctx: CompactionTaskCtx) -> dict[str, Any]:
    """The status object of a task (with its topic)."""
    state = ctx.state
    if state is TaskState.SUCCEED:
        status = "SUCCESS"
    elif state in (TaskState.FAILED, TaskState.CANCELLED):
        status = "ERROR"
    else:
        status = "RUNNING"
    return {
        "topic": ctx.topic,
        "status": status,
        "state": state.value,
        "task_id": ctx.task_id,
        "started_at": iso_utc(ctx.started_at or ctx.created_at),
        "finished_at": iso_utc(ctx.finished_at),
        "last_error": ctx.error,
        "progress": {"records_read": ctx.progress.records_read, "records_total": ctx.progress.records_total},
        "full_rebuild": ctx.stats.full_rebuild,
        "recreated": ctx.stats.recreated,
        "warnings": [ctx.stats.switch_warning] if ctx.stats.switch_warning else [],
    }


def tasks_json(tasks: list[CompactionTaskCtx]) -> dict[str, Any]:
    """``tasks`` newest first."""
    return {"tasks": [task_status(t) for t in reversed(tasks)]}


def optional_task_status(ctx: CompactionTaskCtx | None) -> dict[str, Any] | None:
    return task_status(ctx) if ctx is not None else None


def topic_status(daemon: Daemon, topic: str) -> dict[str, Any]:
    """The status of the topic's last compaction: the last task's, else the current ledger's
    (a ledger from before this process started), else NOT_RUN."""
    last = daemon.registry.last(topic)
    if last is not None:
        return task_status(last)
    service = daemon.registry.existing_service(topic)
    manifest = None if service is None else service.ledger_info()
    none = {"topic": topic, "state": None, "task_id": None, "last_error": None, "progress": dict(_NO_PROGRESS),
            "full_rebuild": False, "recreated": False, "warnings": []}
    if manifest is None:
        return {**none, "status": "NOT_RUN", "started_at": None, "finished_at": None}
    return {**none, "status": "SUCCESS", "started_at": iso_utc(manifest.started_at_ms / 1000),
            "finished_at": iso_utc(manifest.finished_at_ms / 1000), "full_rebuild": manifest.full_rebuild}


def topics_json(daemon: Daemon) -> dict[str, Any]:
    """Every known topic with its backlog, last compaction and current task."""
    out = []
    for topic, on_broker in daemon.known_topics().items():
        try:
            out.append(_topic_json(daemon, topic, on_broker))
        except CompactordError as exc:  # one broken topic does not hide the others
            log.error("GET /v1/topics: topic %s: %s", topic, exc)
            out.append({"topic": topic, "on_broker": on_broker,
                        "error": {"error": exc.code, "message": public_message(exc.status, exc.code, exc.message)}})
    return {"topics": out}


def _topic_json(daemon: Daemon, topic: str, on_broker: bool) -> dict[str, Any]:
    backlog = daemon.monitor.backlogs.get(topic)
    return {
        "topic": topic,
        "on_broker": on_broker,
        "unloaded": daemon.policies.unloaded(topic),
        "backlog": None if backlog is None else {
            "records": backlog.records, "bytes": backlog.bytes,
            "age_seconds": round(backlog.age_seconds, 3), "dirty_ratio": round(backlog.dirty_ratio, 6),
        },
        "last_compaction": topic_status(daemon, topic),
        "current_task": optional_task_status(daemon.registry.live(topic)),
        **broker_view_json(daemon, topic),
    }


def broker_view_json(daemon: Daemon, topic: str) -> dict[str, Any]:
    """What the monitor last heard from the broker of the topic (its cleanup configs; "unknown" as
    nulls where the broker does not describe them) and the warnings about the view that follow."""
    known = daemon.monitor.known(topic)
    if known is None:
        return {"broker": None, "warnings": []}
    warnings = known.warnings(daemon.strategy_name(topic))
    try:
        service = daemon.registry.existing_service(topic)
        manifest = None if service is None else service.ledger_info()
    except CompactordError:
        manifest = None
    recreated = known.new_log(manifest) if manifest is not None else None
    if recreated is not None:
        warnings.append(f"the topic was recreated ({recreated}); its view is served again after the next compaction")
    return {
        "broker": {
            "topic_id": known.topic_id,
            "log_start": {str(p): s for p, s in sorted(known.log_starts().items())},
            "configs": known.configs.to_json(),
            "implicit_max_lag_seconds": known.implicit_max_lag_seconds(),
            "refreshed_at": iso_utc(known.refreshed_at),
        },
        "warnings": warnings,
    }


def policies_json(topic: str, policies: TopicPolicies, settings: Settings) -> dict[str, Any]:
    return {"topic": topic, "policies": policies.to_json(), "effective": policies.effective(settings)}


# -- ledger reads -------------------------------------------------------------------------------


def horizon_json(topic: str, manifest: LedgerManifest) -> dict[str, Any]:
    return {
        "topic": topic,
        "ledger_id": manifest.ledger_id,
        "partitions": [{"partition": p, "offset": o} for p, o in sorted(manifest.horizon.items())],
        "rules": manifest.strategy.rules(),
    }


def page_json(topic: str, manifest: LedgerManifest, entries: list[Entry], encoding: str, markers: bool,
              next_start: int | None) -> dict[str, Any]:
    return {
        "topic": topic,
        "ledger_id": manifest.ledger_id,
        "entries": [entry_json(e, encoding, markers) for e in entries],
        "next_start": next_start,
    }


def _base64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def _encode(data: bytes | None, encoding: str) -> str | None:
    if data is None:
        return None
    if encoding == "utf8":
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgument(
                "an entry holds bytes that are not UTF-8; read it with encoding=base64 (the default)"
            ) from None
    return _base64(data)


def entry_json(entry: Entry, encoding: str, markers: bool = False) -> dict[str, Any]:
    data = {
        "partition": entry.partition,
        "offset": entry.offset,
        "key": _encode(entry.key, encoding),
        "value": _encode(entry.value, encoding),
        "timestamp": entry.timestamp,
        # A null header value stays null (Kafka allows it), an empty one is "".
        "headers": [{"key": k, "value": None if v is None else _base64(v)} for k, v in entry.headers]
        if entry.headers else [],
    }
    if markers:  # what the compacted reader needs to apply the event-time strategy
        data["event_time"] = entry.event_time
        data["marker"] = entry.marker
    return data


# -- topic lifecycle ----------------------------------------------------------------------------


def unloaded_json(topic: str, unloaded: bool, task: CompactionTaskCtx | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"topic": topic, "unloaded": unloaded}
    if unloaded:  # an unload stops the topic's task; a load has none to show
        body["task"] = optional_task_status(task)
    return body


def deleted_json(topic: str, deleted: bool, task: CompactionTaskCtx | None) -> dict[str, Any]:
    return {"topic": topic, "deleted": deleted, "task": optional_task_status(task)}
