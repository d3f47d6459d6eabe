"""The CLI's readable output: one table or block per command, from the API's JSON body.

A missing value prints as ``-`` (never Python's ``None``). Every table goes through ``_table``: each
column is as wide as its widest cell, so a long key or name never pushes the columns out of line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["print_body", "print_task"]

_GAP = "  "


def _s(value: Any) -> str:
    """A cell: ``-`` for a missing value."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _table(headers: list[str], rows: list[list[Any]], right: tuple[str, ...] = ()) -> None:
    """Print a table: a header line, then a line per row; the ``right`` columns (numbers) right-aligned,
    the others left-aligned (a last column of any length only ends its line)."""
    cells = [[_s(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
    for line in [headers, *cells]:
        out = [c.rjust(w) if h in right else c.ljust(w) for h, c, w in zip(headers, line, widths, strict=True)]
        print(_GAP.join(out).rstrip())


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
    _table(["PARTITION", "OFFSET"], [[p["partition"], p["offset"]] for p in body["partitions"]],
           right=("PARTITION", "OFFSET"))


def _read(body: dict[str, Any]) -> None:
    _table(["PARTITION", "OFFSET", "KEY", "VALUE"],
           [[e["partition"], e["offset"], e["key"], e["value"]] for e in body["entries"]],
           right=("PARTITION", "OFFSET"))
    if body.get("next_start") is not None:
        where = f"--partition {body['next_partition']} " if body.get("next_partition") is not None else ""
        print(f"(more: {where}--start {body['next_start']})")


def _topics(body: dict[str, Any]) -> None:
    rows = []
    for t in body["topics"]:
        if "error" in t:  # the topic's ledger cannot be read: its error instead of its status
            rows.append([t["topic"], t.get("on_broker"), None, "ERROR", t["error"]["error"], None])
            continue
        last = t["last_compaction"]
        backlog = t["backlog"]["records"] if t.get("backlog") else None
        rows.append([t["topic"], t.get("on_broker"), backlog, last["status"], last.get("state"),
                     last.get("finished_at")])
    _table(["TOPIC", "ON_BROKER", "BACKLOG", "LAST", "STATE", "FINISHED"], rows, right=("BACKLOG",))


def _tasks(body: dict[str, Any]) -> None:
    _table(["TOPIC", "STATUS", "STATE", "TASK", "STARTED"],
           [[t["topic"], t["status"], t["state"], t["task_id"], t["started_at"]] for t in body["tasks"]])


def _policies(body: dict[str, Any]) -> None:
    print(f"topic {body['topic']}")
    overrides = body.get("policies") or {}
    effective = body.get("effective") or {}
    _table(["KEY", "OVERRIDE", "IN FORCE"],
           [[key, overrides.get(key), effective.get(key)] for key in sorted(set(overrides) | set(effective))])


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
    rows = []
    for r in body["runs"]:
        detail = r.get("error") or r.get("reason_detail") or (f"by {r['caller']}" if r.get("caller") else None)
        rows.append([r["finished_at"], r["state"], r["reason"], r["records_read"], r["records_written"],
                     r["task_id"], detail])
    _table(["FINISHED", "STATE", "REASON", "READ", "WRITTEN", "TASK", "DETAIL"], rows, right=("READ", "WRITTEN"))
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
