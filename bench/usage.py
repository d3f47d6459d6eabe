"""What a benchmark run costs, read from ``/proc``: CPU seconds by role (the daemon, the Spark JVM, Spark's
Python workers, the floor's readers, the broker) and peak memory."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

__all__ = ["ROLES", "MemorySampler", "cpu_by_role", "mb", "status_kb"]


def status_kb(pid: int | str, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def _descendants(root: int) -> Iterator[int]:
    tree = _children()
    todo = list(tree.get(root, []))
    while todo:
        pid = todo.pop()
        yield pid
        todo.extend(tree.get(pid, []))


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and of its children that have ended."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / _TICK  # utime, stime, cutime, cstime


ROLES = ("daemon", "spark jvm", "spark python", "floor readers", "broker")


def cpu_by_role(broker: int | None, jvm: int | None) -> dict[str, float]:
    """CPU seconds used so far by this process and its descendants, by role.

    ``daemon`` is this process (the daemon's own, with the py4j client); ``spark python`` are the JVM's
    Python workers and planning daemons; ``floor readers`` the floor's processes (and producers that ended).
    """
    tree = _children()
    roles = dict.fromkeys(ROLES, 0.0)
    roles["daemon"] = _cpu_seconds(os.getpid())

    def walk(root: int, role: str) -> None:
        todo = [root]
        while todo:
            pid = todo.pop()
            roles[role] += _cpu_seconds(pid)
            todo.extend(tree.get(pid, []))

    for child in tree.get(os.getpid(), []):
        if child == broker:
            walk(child, "broker")
        elif child == jvm:
            roles["spark jvm"] += _cpu_seconds(child)
            for worker in tree.get(child, []):
                walk(worker, "spark python")
        else:
            walk(child, "floor readers")
    return roles


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


class MemorySampler:
    """Peak RSS of the Spark driver JVM and of Spark's Python workers (the JVM's Python children).

    VmHWM is the kernel's own peak of a process, so the JVM's figure is exact; the workers come and go,
    so their peak is sampled (every 0.5 s) as the largest sum over live workers.
    """

    def __init__(self) -> None:
        self.jvm_pid: int | None = None
        self.jvm_hwm_kb = 0
        self.workers_peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def start(self) -> MemorySampler:
        self._sample()  # finds the JVM now, so that CPU accounting sees it from the first measurement
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _find_jvm(self) -> int | None:
        for pid in _descendants(os.getpid()):
            if _comm(pid) == "java":
                return pid
        return None

    def _sample(self) -> None:
        if self.jvm_pid is None:
            self.jvm_pid = self._find_jvm()
        if self.jvm_pid is None:
            return
        self.jvm_hwm_kb = max(self.jvm_hwm_kb, status_kb(self.jvm_pid, "VmHWM"))
        workers = sum(status_kb(pid, "VmRSS") for pid in _descendants(self.jvm_pid) if _comm(pid).startswith("python"))
        self.workers_peak_kb = max(self.workers_peak_kb, workers)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self._sample()


def mb(kb: int) -> str:
    return f"{kb / 1024:.0f} MB"
