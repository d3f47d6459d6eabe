"""The CLI's readable output: one table or block per command, from the API's JSON body.

A missing value prints as ``-`` (never Python's ``None``). Every table goes through ``_table``: each
column is as wide as its widest cell, so a long key or name never pushes the columns out of line.

Everything printed that came from outside (topic names, keys, values, the server's messages) goes
through ``printable``: a control character is shown escaped, as Python's ``repr`` shows it (``\\x1b``,
``\\n``), and a backslash doubled, so a stored value can neither move the cursor, retitle the terminal nor
break a row. A key or a value is cut to ``KEY_WIDTH``/``VALUE_WIDTH`` characters with a marker saying how
much more there is; ``--json`` prints it whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["KEY_WIDTH", "VALUE_WIDTH", "outcome", "print_body", "print_task", "printable", "shown_datum"]

_GAP = "  "
KEY_WIDTH = 48  # characters of a key shown in a table (escapes included)
VALUE_WIDTH = 200  # characters of a value shown in a table (escapes included)
NULL = "(null)"  # a key that is null
TOMBSTONE = "(tombstone)"  # a value that is null: the key's deletion
EMPTY = '""'  # an empty key or value
_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


class _Shown(str):
    """A cell already made printable (``shown_datum``): ``_s`` leaves it as it is."""


def _escaped(ch: str) -> str:
    """One character as it is printed: itself, or its escape (a byte that was not UTF-8 as ``\\xNN``)."""
    if ch in _ESCAPES:
        return _ESCAPES[ch]
    if ch.isprintable():
        return ch
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8, as ``surrogateescape`` decoded it
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with every character that is not printable escaped, and each backslash doubled."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(_escaped(ch) for ch in text)


def _cut(text: str, width: int) -> str:
    """``text`` made printable, cut to ``width`` characters with a marker of what is left out."""
    out: list[str] = []
    used = 0
    for index, ch in enumerate(text):
        piece = _escaped(ch)
        used += len(piece)
        if used > width:
            return "".join(out) + f"...[+{len(text) - index} chars]"
        out.append(piece)
    return "".join(out)


def shown_datum(data: bytes | str | None, width: int, null: str) -> str:
    """A key or a value as a table shows it: ``null`` for a missing one, ``""`` for an empty one, the
    text (bytes read as UTF-8, any byte that is not shown as ``\\xNN``) escaped and cut to ``width``."""
    if data is None:
        return _Shown(null)
    text = data.decode("utf-8", errors="surrogateescape") if isinstance(data, bytes) else data
    return _Shown(_cut(text, width) if text else EMPTY)


def _s(value: Any) -> str:
    """A cell: ``-`` for a missing value, text made printable."""
    if isinstance(value, _Shown):
        return value
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return printable(str(value))


def outcome(task: dict[str, Any]) -> str:
    """A task's or run's end as the CLI names it: the API's status, but CANCELLED for a cancelled one
    (a cancel or a shutdown ended it: not an error)."""
    return "CANCELLED" if task.get("state") == "Cancelled" else _s(task.get("status"))


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
    print(f"topic     {_s(t.get('topic'))}\nstatus    {outcome(t)}\nstate     {_s(t.get('state'))}\n"
          f"task      {_s(t.get('task_id'))}\nstarted   {_s(t.get('started_at'))}\n"
          f"finished  {_s(t.get('finished_at'))}\n"
          f"progress  {prog.get('records_read', 0)}/{prog.get('records_total', 0)} records")
    if t.get("last_error"):
        print(f"{'cancelled' if t.get('state') == 'Cancelled' else 'error    '} {_s(t['last_error'])}")


def _horizon(body: dict[str, Any]) -> None:
    print(f"topic {_s(body['topic'])}  ledger {_s(body['ledger_id'])}")
    _table(["PARTITION", "OFFSET"], [[p["partition"], p["offset"]] for p in body["partitions"]],
           right=("PARTITION", "OFFSET"))


def _read(body: dict[str, Any]) -> None:
    _table(["PARTITION", "OFFSET", "KEY", "VALUE"],
           [[e["partition"], e["offset"], shown_datum(e["key"], KEY_WIDTH, NULL),
             shown_datum(e["value"], VALUE_WIDTH, TOMBSTONE)] for e in body["entries"]],
           right=("PARTITION", "OFFSET"))
    if body.get("next_start") is not None:
        if body.get("next_partition") is not None:  # read across partitions: go on from here, through the rest
            print(f"(more: --from {body['next_partition']}:{body['next_start']})")
        else:
            print(f"(more: --start {body['next_start']})")


def _topics(body: dict[str, Any]) -> None:
    rows = []
    for t in body["topics"]:
        if "error" in t:  # the topic's ledger cannot be read: its error instead of its status
            rows.append([t["topic"], t.get("on_broker"), None, "ERROR", t["error"]["error"], None])
            continue
        last = t["last_compaction"]
        backlog = t["backlog"]["records"] if t.get("backlog") else None
        rows.append([t["topic"], t.get("on_broker"), backlog, outcome(last), last.get("state"),
                     last.get("finished_at")])
    _table(["TOPIC", "ON_BROKER", "BACKLOG", "LAST", "STATE", "FINISHED"], rows, right=("BACKLOG",))


def _tasks(body: dict[str, Any]) -> None:
    _table(["TOPIC", "STATUS", "STATE", "TASK", "STARTED"],
           [[t["topic"], outcome(t), t["state"], t["task_id"], t["started_at"]] for t in body["tasks"]])


def _policies(body: dict[str, Any]) -> None:
    print(f"topic {_s(body['topic'])}")
    overrides = body.get("policies") or {}
    effective = body.get("effective") or {}
    _table(["KEY", "OVERRIDE", "IN FORCE"],
           [[key, overrides.get(key), effective.get(key)] for key in sorted(set(overrides) | set(effective))])


def _lifecycle(body: dict[str, Any]) -> None:
    for key, value in body.items():
        if key != "task":
            print(f"{_s(key):<9} {_s(value)}")
    task = body.get("task")
    print(f"task      {_s(task and task.get('task_id'))} {_s(task and task.get('state'))}" if task else "task      -")


def _info(body: dict[str, Any]) -> None:
    broker = body.get("broker") or {}
    print(f"version       {_s(body.get('version'))}\n"
          f"broker        {_s(broker.get('bootstrap'))}{' (embedded)' if broker.get('embedded') else ''}\n"
          f"ledger root   {_s(body.get('ledger_root'))}\nspark master  {_s(body.get('spark_master'))}\n"
          f"kafka listener {_s(body.get('kafka_listeners'))}")


def _cluster(body: dict[str, Any]) -> None:
    if not body.get("name"):
        print("not a cluster's member (clusterName is empty): this daemon compacts every topic of its root")
        return
    print(f"cluster       {_s(body['name'])} (generation {_s(body.get('generation'))}, "
          f"{_s(body.get('coordination_partitions'))} coordination partitions, "
          f"{_s(body.get('unowned_partitions'))} unowned)\nthis member   {_s(body.get('member_url'))}, "
          f"{len(body.get('owned_topics') or [])} topics owned\nrebalanced    {_s(body.get('last_rebalance_seconds'))} s "
          f"(rebalances here: {_s(body.get('rebalances'))})")
    _table(["MEMBER", "URL", "VERSION", "PARTITIONS"],
           [[m["member_id"], m["url"], m["version"], len(m["partitions"])] for m in body.get("members") or []],
           right=("PARTITIONS",))


def _history(body: dict[str, Any]) -> None:
    rows = []
    for r in body["runs"]:
        detail = r.get("error") or r.get("reason_detail") or (f"by {r['caller']}" if r.get("caller") else None)
        rows.append([r["finished_at"], r["state"], r["reason"], r["records_read"], r["records_written"],
                     r["task_id"], detail])
    _table(["FINISHED", "STATE", "REASON", "READ", "WRITTEN", "TASK", "DETAIL"], rows, right=("READ", "WRITTEN"))
    if body.get("next") is not None:
        print(f"(older runs: --cursor {_s(body['next'])})")


def _preview(body: dict[str, Any]) -> None:
    kind = "exact" if body["exact"] else f"estimate from {body['sample_records']} tail records"
    eta = "-" if body.get("estimated_seconds") is None else f"{body['estimated_seconds']} s"
    print(f"topic {_s(body['topic'])}  ({kind})\n"
          f"records  kept {body['records_kept']:>12,}  removed {body['records_removed']:>12,}\n"
          f"bytes    kept {body['bytes_kept']:>12,}  removed {body['bytes_removed']:>12,}\n"
          f"dirty ratio {body['dirty_ratio']:.3f}  estimated duration {eta}")


_PRINTERS: dict[str, Callable[[dict[str, Any]], None]] = {
    "compact": print_task, "rebuild": print_task, "status": print_task, "cancel": print_task,
    "horizon": _horizon, "read": _read, "topics": _topics, "tasks": _tasks, "policies": _policies,
    "unload": _lifecycle, "load": _lifecycle, "delete-topic": _lifecycle, "info": _info,
    "cluster": _cluster,
    "history": _history, "preview": _preview,
}


def print_body(cmd: str, body: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(body))
    else:
        _PRINTERS[cmd](body)
