"""The JSON bodies of the API: every dict an endpoint answers with is built here (their models, which the
OpenAPI document is made of, are in ``models.py``).

Every error is ``{"error": code, "message": text}`` (and, for a 409, the task in the way). A server
error (5xx) answers a fixed text for its code, never its details: those name ledger paths, broker
addresses and exception texts, which go to the log (the caller may hold no token).
"""

from __future__ import annotations

import binascii
import contextvars
import logging
import time
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse

from compactord import __version__
from compactord.api.schema import error_classes
from compactord.daemon.listing import DEFAULT_LIMIT, TopicRow, age_ms, behind, select
from compactord.errors import CompactordError, InvalidArgument
from compactord.model import Entry, LedgerManifest, iso_utc
from compactord.task import CompactionTaskCtx, TaskState

if TYPE_CHECKING:
    from compactord.config import Settings
    from compactord.daemon.broker_view import BrokerTopic
    from compactord.daemon.core import Daemon
    from compactord.daemon.health import Readiness
    from compactord.daemon.history import RunPage, RunRecord
    from compactord.daemon.policies import TopicPolicies

__all__ = [
    "READER",
    "deleted_json",
    "entry_json",
    "error_response",
    "history_json",
    "horizon_json",
    "info_json",
    "optional_task_status",
    "page_json",
    "policies_json",
    "problem_response",
    "readiness_json",
    "run_json",
    "task_error",
    "task_status",
    "tasks_json",
    "topic_status",
    "topics_json",
    "unloaded_json",
]

log = logging.getLogger(__name__)

_NO_PROGRESS = {"records_read": 0, "records_total": 0}
FIRST_PASS_WAIT_S = 5.0  # a listing before the monitor's first pass ended waits this long for it
#: True while answering a request of httpReadToken (set by ``api/auth.py``): a task's or a run's error is
#: then its code's fixed text (``public_message``), since its message may hold the store's endpoint, bucket
#: and keys or an exception's own text; the admin token, the log and the CLI of the operator see it whole.
READER: contextvars.ContextVar[bool] = contextvars.ContextVar("compactord_read_token", default=False)
# What a server error says over HTTP, by code. A code not listed gets the last line.
_SERVER_ERROR_TEXT = {
    "ledger_corrupt": ("the topic's compacted ledger or its pointer is corrupt (a rebuild replaces it: PUT "
                       "/v1/topics/{topic}/compaction?rebuild=true); details are in the daemon's log"),
    "policies_unreadable": ("the topic's stored policies (policies.json) cannot be read; PUT or DELETE its "
                            "policies to replace them; details are in the daemon's log"),
    "broker_unavailable": "the broker does not answer; details are in the daemon's log",
    "insufficient_disk_space": "the ledger root's disk is full; details are in the daemon's log",
    "storage_unavailable": ("the ledger root's store does not answer (retry later; GET /readyz says when reads "
                            "are served again); details are in the daemon's log"),
    "spark_error": "a Spark job failed; details are in the daemon's log",
    "compaction_failed": "the compaction failed; details are in the daemon's log",
    "owner_unreachable": ("the member of the cluster that owns the topic did not answer the request forwarded to "
                          "it (retry in a second); details are in the daemon's log"),
}
_SERVER_ERROR_DEFAULT = "the daemon could not answer this request; details are in the daemon's log"
# Built from fixed phrases and config values only (``Daemon.readiness_problems``, ``api/limits.py``): safe
# to answer as is.
_PLAIN_SERVER_ERRORS = frozenset({"not_ready", "unhealthy", "server_busy"})


# -- errors -------------------------------------------------------------------------------------


def _error_status(code: str) -> int:
    """The HTTP status of an error code of the tree (500 for a code it does not have, e.g. an exception's
    class name)."""
    found = [cls.status for cls in error_classes() if cls.code == code]
    return found[0] if found else 500


def task_error(code: str | None, message: str | None) -> str | None:
    """A task's or a run's error as this request may see it (see ``READER``)."""
    if message is None or not READER.get():
        return message
    code = code or "compaction_failed"
    return public_message(_error_status(code), code, message)


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
    """The answer to a ``CompactordError``: its class's status and code, its message (a server error's only if
    it was raised ``public=True``: built from fixed phrases, numbers and config values, as a refusal of
    ``api/limits.py`` can be; otherwise its code's fixed text)."""
    if exc.details.get("public") is True:
        return JSONResponse({"error": exc.code, "message": exc.message, **extra}, status_code=exc.status)
    return problem_response(exc.status, exc.code, exc.message, **extra)


# -- health -------------------------------------------------------------------------------------


def readiness_json(readiness: Readiness) -> dict[str, Any]:
    return {"status": readiness.status, "compactions": readiness.compactions, "reads": readiness.reads,
            "problems": readiness.problems}


def info_json(daemon: Daemon) -> dict[str, Any]:
    settings = daemon.settings
    return {"version": __version__,
            "broker": {"bootstrap": settings.kafka_bootstrap_servers, "embedded": daemon.embedded_broker},
            "ledger_root": daemon.store.location, "spark_master": settings.spark_master,
            "kafka_listeners": settings.kafka_advertised_listeners or settings.kafka_listeners or None}


def cluster_json(daemon: Daemon) -> dict[str, Any]:
    cluster = daemon.cluster
    if cluster is None:
        return {"name": "", "member_url": None, "member_id": None, "generation": None,
                "coordination_partitions": None, "members": [], "owned_topics": [], "unowned_partitions": None,
                "rebalances": None, "last_rebalance_at": None, "last_rebalance_seconds": None}
    view = cluster.view()
    membership = cluster.membership
    return {"name": view.name, "member_url": view.me, "member_id": membership.member_id or None,
            "generation": membership.generation if membership.generation >= 0 else None,
            "coordination_partitions": view.partitions,
            "members": [{"member_id": m.member_id, "url": m.url, "version": m.version,
                         "partitions": sorted(m.partitions), "generation": m.generation} for m in view.members],
            "owned_topics": cluster.taken(), "unowned_partitions": view.unowned_partitions,
            "rebalances": membership.rebalances, "last_rebalance_at": view.last_rebalance_at,
            "last_rebalance_seconds": view.last_rebalance_seconds}


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
        "reason": ctx.reason.kind,
        "reason_detail": ctx.reason.detail,
        "kind": ctx.kind,  # "compaction", or "preview" (an exact preview: never switches a ledger)
        "started_at": iso_utc(ctx.started_at or ctx.created_at),
        "finished_at": iso_utc(ctx.finished_at),
        "last_error": task_error(ctx.error_type, ctx.error),
        "progress": {"records_read": ctx.progress.records_read, "records_total": ctx.progress.records_total},
        "full_rebuild": ctx.stats.full_rebuild,
        "recreated": ctx.stats.recreated,
        "storage_requests": ctx.stats.storage_requests.snapshot(),
        "read_throttle": _read_throttle(ctx),
        "warnings": [ctx.stats.switch_warning] if ctx.stats.switch_warning else [],
    }


def _read_throttle(ctx: CompactionTaskCtx) -> dict[str, Any] | None:
    """A throttled run's budget, its share per reading task, and the rate it read at so far."""
    progress = ctx.progress
    if progress.max_read_bytes_per_second <= 0:
        return None
    start = progress.read_started_at or ctx.started_at or ctx.created_at
    end = progress.read_ended_at if ctx.done and progress.read_ended_at else ctx.finished_at or time.time()
    elapsed = max(1e-3, end - start)
    tasks = progress.read_tasks
    return {
        "max_bytes_per_second": progress.max_read_bytes_per_second,
        "reading_tasks": tasks,
        "per_task_bytes_per_second": progress.max_read_bytes_per_second // tasks if tasks else None,
        "bytes_read": progress.bytes_read,
        "bytes_per_second": int(progress.bytes_read / elapsed),  # since the reading began
        "throttled_seconds": round(progress.throttled_seconds, 3),
    }


def tasks_json(tasks: list[CompactionTaskCtx]) -> dict[str, Any]:
    """``tasks`` newest first."""
    return {"tasks": [task_status(t) for t in reversed(tasks)]}


def optional_task_status(ctx: CompactionTaskCtx | None) -> dict[str, Any] | None:
    return task_status(ctx) if ctx is not None else None


def run_status(run: RunRecord) -> dict[str, Any]:
    """The status object of a run read from the history (a task of an earlier process)."""
    return {
        "topic": run.topic,
        "status": "SUCCESS" if run.state == TaskState.SUCCEED.value else "ERROR",
        "state": run.state,
        "task_id": run.task_id,
        "reason": run.reason,
        "reason_detail": run.reason_detail,
        "started_at": iso_utc(run.started_at or run.created_at),
        "finished_at": iso_utc(run.finished_at),
        "last_error": task_error(run.error_type, run.error),
        "progress": {"records_read": run.records_read, "records_total": run.records_read},
        "full_rebuild": run.full_rebuild,
        "recreated": run.recreated,
        "storage_requests": dict(run.storage_requests),
        "read_throttle": None,
        "kind": "compaction",
        "warnings": [],
    }


def topic_status(daemon: Daemon, topic: str) -> dict[str, Any]:
    """The status of the topic's last compaction: the last task's, else the last run of its history (a
    task of an earlier process), else the current ledger's, else NOT_RUN."""
    status = _last_status(daemon, topic)
    table_behind = daemon.iceberg.warning(topic) if daemon.iceberg is not None else None
    if table_behind is not None:  # the compaction succeeded; its Iceberg table lags (compactord_iceberg_lag_ledgers)
        status["warnings"] = [*status["warnings"], table_behind]
    return status


def _last_status(daemon: Daemon, topic: str) -> dict[str, Any]:
    last = daemon.registry.last(topic)
    if last is not None:
        return task_status(last)
    service = daemon.registry.existing_service(topic)
    # Read first: a ledger that cannot be read (LedgerCorrupt) is the topic's status, whatever its history.
    manifest = None if service is None else service.ledger_info()
    run = daemon.history.last(topic)
    if run is not None:
        return run_status(run)
    return _status_of_ledger(topic, manifest)


def topics_json(daemon: Daemon, limit: int = DEFAULT_LIMIT, after: str | None = None, state: str | None = None,
                prefix: str | None = None) -> dict[str, Any]:
    """A page of the known topics with their backlog, last compaction and current task, from memory
    (``daemon/listing.py``): the monitor's last pass, the task registry and the broker's last answers."""
    monitor, registry = daemon.monitor, daemon.registry
    if monitor.last_run is None:  # the first pass runs at the start: wait for it a little
        monitor.passed.wait(FIRST_PASS_WAIT_S)
    page = select(monitor.rows, {t.topic for t in registry.tasks()}, registry.last, registry.live,
                  monitor.backlogs, monitor.topics, limit=limit, after=after, state=state, prefix=prefix)
    now = time.time()
    out = []
    for topic in page.topics:
        row = page.rows.get(topic)
        on_broker = topic in page.on_broker
        if row is not None and row.error is not None and registry.last(topic) is None:
            exc = row.error  # one broken topic does not hide the others
            out.append({"topic": topic, "on_broker": on_broker,
                        "error": {"error": exc.code, "message": public_message(exc.status, exc.code, exc.message)}})
            continue
        out.append(_topic_json(daemon, topic, on_broker, row, now))
        if daemon.cluster is not None:
            owner = daemon.cluster.owner(topic)
            out[-1]["owner"] = daemon.member_url if owner.here else owner.url
    return {"topics": out, "next_after": page.next_after, "monitor_pass_at": iso_utc(monitor.rows.pass_at)}


def _topic_json(daemon: Daemon, topic: str, on_broker: bool, row: TopicRow | None, now: float) -> dict[str, Any]:
    backlog = daemon.monitor.backlogs.get(topic)
    known = daemon.monitor.known(topic)
    return {
        "topic": topic,
        "on_broker": on_broker,
        "unloaded": _unloaded(daemon, topic, row),
        "backlog": None if backlog is None else {
            "records": backlog.records, "bytes": backlog.bytes,
            "age_seconds": round(backlog.age_seconds, 3), "dirty_ratio": round(backlog.dirty_ratio, 6),
            "measured_at": iso_utc(backlog.measured_at), "measure_age_ms": age_ms(backlog.measured_at, now),
        },
        "behind": behind(backlog, row, known),
        "last_compaction": _listed_status(daemon, topic, row),
        "current_task": optional_task_status(daemon.registry.live(topic)),
        **_view_json(known, row.manifest if row is not None else None,
                     row.strategy if row is not None else daemon.settings.compaction_strategy),
    }


def _unloaded(daemon: Daemon, topic: str, row: TopicRow | None) -> bool:
    known = daemon.policies.unloaded_as_known(topic)  # as this process last read or set it
    return known if known is not None else row is not None and row.unloaded


def _listed_status(daemon: Daemon, topic: str, row: TopicRow | None) -> dict[str, Any]:
    """``topic_status`` from memory: the last task, else the row's last run, else its ledger, else NOT_RUN."""
    last = daemon.registry.last(topic)
    if last is not None:
        return task_status(last)
    if row is not None and row.run is not None:
        return run_status(row.run)
    return _status_of_ledger(topic, row.manifest if row is not None else None)


def _status_of_ledger(topic: str, manifest: LedgerManifest | None) -> dict[str, Any]:
    none: dict[str, Any] = {"topic": topic, "state": None, "task_id": None, "reason": None, "reason_detail": None,
            "last_error": None, "progress": dict(_NO_PROGRESS), "full_rebuild": False, "recreated": False,
            "storage_requests": {}, "read_throttle": None, "kind": None, "warnings": []}
    if manifest is None:
        return {**none, "status": "NOT_RUN", "started_at": None, "finished_at": None}
    return {**none, "status": "SUCCESS", "started_at": iso_utc(manifest.started_at_ms / 1000),
            "finished_at": iso_utc(manifest.finished_at_ms / 1000), "full_rebuild": manifest.full_rebuild,
            "kind": "compaction"}


def _view_json(known: BrokerTopic | None, manifest: LedgerManifest | None, strategy: str) -> dict[str, Any]:
    if known is None:
        return {"broker": None, "warnings": []}
    warnings = known.warnings(strategy)
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


def run_json(run: RunRecord) -> dict[str, Any]:
    """One run of a topic's history."""
    return {
        "task_id": run.task_id,
        "state": run.state,
        "reason": run.reason,
        "reason_detail": run.reason_detail,
        "caller": run.caller,
        "created_at": iso_utc(run.created_at),
        "started_at": iso_utc(run.started_at),
        "finished_at": iso_utc(run.finished_at),
        "records_read": run.records_read,
        "bytes_read": run.bytes_read,
        "records_written": run.records_written,
        "bytes_written": run.bytes_written,
        "spilled_bytes": run.spilled_bytes,
        "task_cpu_ratio": run.task_cpu_ratio,
        "storage_requests": run.storage_requests,
        "removed": run.removed,
        "ledger_before": run.ledger_before,
        "ledger_after": run.ledger_after,
        "full_rebuild": run.full_rebuild,
        "recreated": run.recreated,
        "skipped": run.skipped,
        "error": task_error(run.error_type, run.error),
        "error_type": run.error_type,
        "member": run.member,
    }


def history_json(topic: str, page: RunPage) -> dict[str, Any]:
    """A page of the topic's run history, newest first."""
    return {"topic": topic, "runs": [run_json(r) for r in page.runs], "next": page.next}


def policies_json(topic: str, policies: TopicPolicies, settings: Settings) -> dict[str, Any]:
    return {"topic": topic, "policies": policies.to_json(), "effective": policies.effective(settings)}


# -- ledger reads -------------------------------------------------------------------------------


def horizon_json(topic: str, manifest: LedgerManifest) -> dict[str, Any]:
    return {
        "topic": topic,
        "ledger_id": manifest.ledger_id,
        "partitions": [{"partition": p, "offset": o} for p, o in sorted(manifest.horizon.items())],
        "rules": {**manifest.strategy.rules(), "key_ttl_ms": manifest.key_ttl_ms},
        # The identity of the log the ledger was made of, for a reader's own check of the tail it reads.
        "topic_id": manifest.topic_id,
        "log_start": {str(p): s for p, s in sorted(manifest.log_start.items())},
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
