"""The CLI's readable output: one table or block per command, from the API's JSON body.

A missing value prints as ``-`` (never Python's ``None``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["print_body", "print_task"]


def _s(value: Any) -> str:
    """A cell: ``-`` for a missing value."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def print_task(t: dict[str, Any]) -> None:
    prog = t.get("progress") or {}
    print(f"topic     {_s(t.get('topic'))}\nstatus    {_s(t.get('status'))}\nstate     {_s(t.get('state'))}\n"
          f"task      {_s(t.get('task_id'))}\nstarted   {_s(t.get('started_at'))}\n"
          f"finished  {_s(t.get('finished_at'))}\n"
          f"progress  {prog.get('records_read', 0)}/{prog.get('records_total', 0)} records")
    if t.get("last_error"):
        print(f"error     {t['last_error']}")


def _horizon(body: dict[str, Any]) -> None:
    print(f"topic {body['topic']}  ledger {body['ledger_id']}")
    print(f"{'PARTITION':>9}  {'OFFSET':>12}")
    for p in body["partitions"]:
        print(f"{p['partition']:>9}  {p['offset']:>12}")


def _read(body: dict[str, Any]) -> None:
    print(f"{'PARTITION':>9}  {'OFFSET':>10}  {'KEY':<24}  VALUE")
    for e in body["entries"]:
        print(f"{e['partition']:>9}  {e['offset']:>10}  {_s(e['key']):<24}  {_s(e['value'])}")
    if body.get("next_start") is not None:
        print(f"(more: --start {body['next_start']})")


def _topics(body: dict[str, Any]) -> None:
    print(f"{'TOPIC':<32} {'ON_BROKER':<9} {'BACKLOG':>10} {'LAST':<8} {'STATE':<26} FINISHED")
    for t in body["topics"]:
        on_broker = _s(t.get("on_broker"))
        if "error" in t:  # the topic's ledger cannot be read: its error instead of its status
            print(f"{t['topic']:<32} {on_broker:<9} {'-':>10} {'ERROR':<8} {t['error']['error']}")
            continue
        last = t["last_compaction"]
        backlog = t["backlog"]["records"] if t.get("backlog") else None
        print(f"{t['topic']:<32} {on_broker:<9} {_s(backlog):>10} {_s(last['status']):<8} "
              f"{_s(last.get('state')):<26} {_s(last.get('finished_at'))}")


def _tasks(body: dict[str, Any]) -> None:
    print(f"{'TOPIC':<32} {'STATUS':<8} {'STATE':<26} {'TASK':<36} STARTED")
    for t in body["tasks"]:
        print(f"{t['topic']:<32} {_s(t['status']):<8} {_s(t['state']):<26} {_s(t['task_id']):<36} "
              f"{_s(t['started_at'])}")


def _policies(body: dict[str, Any]) -> None:
    print(f"topic {body['topic']}")
    print(f"{'KEY':<20} {'OVERRIDE':<20} IN FORCE")
    overrides = body.get("policies") or {}
    effective = body.get("effective") or {}
    for key in sorted(set(overrides) | set(effective)):
        print(f"{key:<20} {_s(overrides.get(key)):<20} {_s(effective.get(key))}")


def _lifecycle(body: dict[str, Any]) -> None:
    for key, value in body.items():
        if key != "task":
            print(f"{key:<9} {_s(value)}")
    task = body.get("task")
    print(f"task      {_s(task and task.get('task_id'))} {_s(task and task.get('state'))}" if task else "task      -")


def _info(body: dict[str, Any]) -> None:
    broker = body.get("broker") or {}
    print(f"version       {_s(body.get('version'))}\n"
          f"broker        {_s(broker.get('bootstrap'))}{' (embedded)' if broker.get('embedded') else ''}\n"
          f"ledger root   {_s(body.get('ledger_root'))}\nspark master  {_s(body.get('spark_master'))}")


def _history(body: dict[str, Any]) -> None:
    print(f"{'FINISHED':<24}  {'STATE':<9}  {'REASON':<15}  {'READ':>9}  {'WRITTEN':>9}  {'TASK':<36}  DETAIL")
    for r in body["runs"]:
        detail = r.get("error") or r.get("reason_detail") or (f"by {r['caller']}" if r.get("caller") else None)
        print(f"{_s(r['finished_at']):<24}  {_s(r['state']):<9}  {_s(r['reason']):<15}  {_s(r['records_read']):>9}  "
              f"{_s(r['records_written']):>9}  {_s(r['task_id']):<36}  {_s(detail)}")
    if body.get("next") is not None:
        print(f"(older runs: --cursor {body['next']})")


def _preview(body: dict[str, Any]) -> None:
    kind = "exact" if body["exact"] else f"estimate from {body['sample_records']} tail records"
    eta = "-" if body.get("estimated_seconds") is None else f"{body['estimated_seconds']} s"
    print(f"topic {body['topic']}  ({kind})\n"
          f"records  kept {body['records_kept']:>12,}  removed {body['records_removed']:>12,}\n"
          f"bytes    kept {body['bytes_kept']:>12,}  removed {body['bytes_removed']:>12,}\n"
          f"dirty ratio {body['dirty_ratio']:.3f}  estimated duration {eta}")


_PRINTERS: dict[str, Callable[[dict[str, Any]], None]] = {
    "compact": print_task, "rebuild": print_task, "status": print_task, "cancel": print_task,
    "horizon": _horizon, "read": _read, "topics": _topics, "tasks": _tasks, "policies": _policies,
    "unload": _lifecycle, "load": _lifecycle, "delete-topic": _lifecycle, "info": _info,
    "history": _history, "preview": _preview,
}


def print_body(cmd: str, body: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(body))
    else:
        _PRINTERS[cmd](body)
