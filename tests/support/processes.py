"""A process tree read from /proc: the tests find a daemon's Spark JVM and check that nothing a
killed process started survived it."""

from __future__ import annotations

import os

__all__ = ["alive", "descendants", "executable", "start_time"]


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, children before grandchildren."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            parents.setdefault(int(stat[1]), []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        children = parents.get(todo.pop(0), [])
        found.extend(children)
        todo.extend(children)
    return found


def executable(pid: int) -> str | None:
    """The path of the program ``pid`` runs, or None (gone, or not ours to read)."""
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def start_time(pid: int) -> str | None:
    stat = _stat(pid)
    return stat[19] if stat else None  # field 22: start time, tells a reused PID apart


def alive(pid: int, started: str | None = None) -> bool:
    """``pid`` runs and is no zombie (and, given ``started``, is still the process that started then)."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z" and (started is None or stat[19] == started)
