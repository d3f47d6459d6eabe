"""The OpenAPI schema as the API really answers: the error body ``{"error", "message"}`` (a 409 adds the
running ``task``) instead of FastAPI's default 422 shape, the task, entry and topic objects, and
Kafka's topic-name rule on every ``{topic}`` parameter. Applied to FastAPI's generated schema once, when
``/openapi.json`` is first asked (``describe``).
"""

from __future__ import annotations

import copy
from typing import Any

from compactord.model import MAX_TOPIC_LENGTH, TOPIC_PATTERN
from compactord.task_report import REASON_KINDS

__all__ = ["COMPONENTS", "describe"]

_REF = "#/components/schemas/"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


def _obj(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required if required is not None else list(properties)}


_STR, _INT, _BOOL, _NUM = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "number"}


def _null(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


_TASK = _obj({
    "topic": _STR,
    "status": {"type": "string", "enum": ["NOT_RUN", "RUNNING", "SUCCESS", "ERROR"]},
    "state": _null({"type": "string", "enum": ["Pending", "Creating_Raw_Reader", "Running", "Ending_with_switch_ledger",
                                               "Succeed", "Failed", "Cancelled"]}),
    "task_id": _null(_STR),
    "started_at": _null({"type": "string", "format": "date-time"}),
    "finished_at": _null({"type": "string", "format": "date-time"}),
    "last_error": _null(_STR),
    "progress": _obj({"records_read": _INT, "records_total": _INT}),
    "full_rebuild": _BOOL,
    "recreated": _BOOL,
    "warnings": {"type": "array", "items": _STR},
    "reason": _null({"type": "string", "enum": list(REASON_KINDS),
                     "description": "what started the run (null: the topic was never compacted)"}),
    "reason_detail": _null(_STR),
    "kind": _null({"type": "string", "enum": ["compaction", "preview"],
                   "description": "preview: an exact preview, which never switches a ledger"}),
    "storage_requests": {"type": "object", "additionalProperties": _INT,
                         "description": "the run's requests to an object store's root, by operation (empty on a "
                                        "local root)"},
    "read_throttle": _null(_obj({
        "max_bytes_per_second": _INT, "reading_tasks": _INT, "per_task_bytes_per_second": _null(_INT),
        "bytes_read": _INT, "bytes_per_second": _INT, "throttled_seconds": _NUM})),
})
_ENTRY = _obj({
    "partition": _INT, "offset": _INT,
    "key": _null({"type": "string", "description": "base64, or text with encoding=utf8"}),
    "value": _null({"type": "string", "description": "base64, or text with encoding=utf8; null: a tombstone"}),
    "timestamp": {"type": "integer", "description": "epoch milliseconds"},
    "headers": {"type": "array", "items": _obj({"key": _STR, "value": _null({"type": "string", "format": "byte"})})},
    "event_time": _null(_INT), "marker": _BOOL,
}, required=["partition", "offset", "key", "value", "timestamp", "headers"])
_BACKLOG = _obj({"records": _INT, "bytes": _INT, "age_seconds": _NUM, "dirty_ratio": _NUM})
_TOPIC = _obj({
    "topic": _STR,
    "on_broker": {"type": "boolean", "description": "whether the broker lists the topic now"},
    "unloaded": _BOOL,
    "backlog": _null(_BACKLOG),
    "last_compaction": _ref("Task"),
    "current_task": _null(_ref("Task")),
    "broker": _null({"type": "object", "description": "what the broker last said of the topic"}),
    "warnings": {"type": "array", "items": _STR},
    "error": _ref("Error"),
}, required=["topic", "on_broker"])

#: The objects of the API, by name (``components.schemas``).
COMPONENTS: dict[str, Any] = {
    "Error": _obj({"error": {"type": "string", "description": "a code, e.g. topic_not_found"},
                   "message": {"type": "string", "description": "what was wrong and what is allowed"}}),
    "Conflict": _obj({"error": _STR, "message": _STR, "task": _null(_ref("Task"))}),
    "Task": _TASK,
    "TaskList": _obj({"tasks": {"type": "array", "items": _ref("Task")}}),
    "Entry": _ENTRY,
    "Page": _obj({"topic": _STR, "ledger_id": _INT, "entries": {"type": "array", "items": _ref("Entry")},
                  "next_start": _null(_INT)}),
    "Horizon": _obj({"topic": _STR, "ledger_id": _INT,
                     "partitions": {"type": "array", "items": _obj({"partition": _INT, "offset": _INT})},
                     "rules": {"type": "object"}, "topic_id": _null(_STR),
                     "log_start": {"type": "object", "additionalProperties": _INT}}),
    "Topic": _TOPIC,
    "TopicList": _obj({"topics": {"type": "array", "items": _ref("Topic")}}),
    "Policies": _obj({"topic": _STR, "policies": {"type": "object"}, "effective": {"type": "object"}}),
    "Lifecycle": _obj({"topic": _STR, "unloaded": _BOOL, "deleted": _BOOL, "task": _null(_ref("Task"))},
                      required=["topic"]),
    "Info": _obj({"version": _STR, "broker": _obj({"bootstrap": _STR, "embedded": _BOOL}), "ledger_root": _STR,
                  "spark_master": _STR}),
}

# The success body of each operation, by (path, method).
_SUCCESS: dict[tuple[str, str], str] = {
    ("/v1/topics/{topic}/compaction", "put"): "Task", ("/v1/topics/{topic}/compaction", "get"): "Task",
    ("/v1/topics/{topic}/compaction", "delete"): "Task", ("/v1/tasks", "get"): "TaskList",
    ("/v1/topics", "get"): "TopicList", ("/v1/topics/{topic}/horizon", "get"): "Horizon",
    ("/v1/topics/{topic}/compacted", "get"): "Page", ("/v1/topics/{topic}/compacted/last", "get"): "Entry",
    ("/v1/topics/{topic}/policies", "get"): "Policies", ("/v1/topics/{topic}/policies", "put"): "Policies",
    ("/v1/topics/{topic}/policies", "delete"): "Policies", ("/v1/topics/{topic}/unload", "post"): "Lifecycle",
    ("/v1/topics/{topic}/load", "post"): "Lifecycle", ("/v1/topics/{topic}", "delete"): "Lifecycle",
    ("/v1/info", "get"): "Info",
}
_CONFLICTS = {("/v1/topics/{topic}/compaction", "put"), ("/v1/topics/{topic}/compaction", "delete"),
              ("/v1/topics/{topic}", "delete")}
_ERRORS = {
    "401": "no bearer token (httpAuthToken is set)", "403": "a token that does not allow this",
    "404": "not found (topic_not_found, not_compacted, ...)", "422": "a bad request (invalid_argument, ...)",
    "503": "the broker or the ledger root's store does not answer (broker_unavailable, storage_unavailable) "
           "or the server is busy",
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def describe(generated: dict[str, Any]) -> dict[str, Any]:
    """FastAPI's ``generated`` schema, corrected (a new dict)."""
    schema = copy.deepcopy(generated)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for default in ("HTTPValidationError", "ValidationError"):
        components.pop(default, None)
    components.update(copy.deepcopy(COMPONENTS))
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            if not isinstance(operation, dict):
                continue
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "path" and parameter.get("name") == "topic":
                    parameter.setdefault("schema", {}).update(pattern=TOPIC_PATTERN, maxLength=MAX_TOPIC_LENGTH)
            responses = operation.setdefault("responses", {})
            body = _SUCCESS.get((path, method))
            for status, response in responses.items():
                if body is not None and status.startswith("2"):
                    response["content"] = {"application/json": {"schema": _ref(body)}}
            if path.startswith("/v1"):
                for status, text in _ERRORS.items():
                    responses[status] = _json(_ref("Error"), text)
                if (path, method) in _CONFLICTS:
                    responses["409"] = _json(_ref("Conflict"), "a task is in the way (it is in `task`)")
            elif "422" in responses:
                responses["422"] = _json(_ref("Error"), _ERRORS["422"])
    return schema
