"""What a run's reading tasks report to the driver, and its sum (``TailRead``): the driver's view of a read."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from compactord.model import RecordFingerprint

__all__ = ["TailRead", "sum_reports"]


@dataclass(frozen=True, slots=True)
class TailRead:
    """What the Kafka readers report they read (each range's last report, summed)."""

    records: int = 0
    bytes: int = 0
    last: dict[int, RecordFingerprint] = field(default_factory=dict)  # per partition, the last data record
    started_at: float | None = None  # when the first reading task started (epoch seconds)
    throttled_seconds: float = 0.0  # the reading tasks' waits for the read budget, summed
    ended: int = 0  # reading tasks that have ended
    ended_at: float | None = None  # when the last of those read its last record (epoch seconds)
    spilled_bytes: int = 0  # what the reading tasks wrote to local disk (windows past their memory budget)
    cpu_seconds: float = 0.0  # the reading tasks' CPU time (their workers' threads), summed
    wall_seconds: float = 0.0  # the reading tasks' wall time from their first fetch, summed
    storage_requests: dict[str, int] = field(default_factory=dict)  # the tasks' requests to the store, by operation

    @property
    def cpu_ratio(self) -> float | None:
        """The reading tasks' CPU seconds per wall second (None before any task read): near 1 when each had a
        core; far below 1 when they waited for one (more slots than cores) or for the broker."""
        return self.cpu_seconds / self.wall_seconds if self.wall_seconds > 0 else None


def sum_reports(reports: Iterable[Mapping[str, Any]]) -> TailRead:
    """The last report of each range (``RangeReadTask._report``), summed; a malformed one is skipped (a task
    is not trusted to break the driver's view)."""
    records = size = ended = spilled = 0
    throttled = cpu = wall = 0.0
    started: list[float] = []
    ended_at: list[float] = []
    last: dict[int, RecordFingerprint] = {}
    requests: dict[str, int] = {}
    for data in reports:
        try:
            found = RecordFingerprint.from_json(data["last"]) if data.get("last") is not None else None
            partition = int(data["partition"])
            records += int(data.get("records", 0))
            size += int(data.get("bytes", 0))
            throttled += float(data.get("throttled_seconds", 0.0))
            spilled += int(data.get("spilled_bytes", 0))
            cpu += float(data.get("cpu_seconds", 0.0))
            wall += float(data.get("wall_seconds", 0.0))
            for op, n in dict(data.get("storage_requests") or {}).items():
                requests[str(op)] = requests.get(str(op), 0) + int(n)
            if data.get("started_at") is not None:
                started.append(float(data["started_at"]))
            if data.get("done"):
                ended += 1
                if data.get("read_ended_at") is not None:
                    ended_at.append(float(data["read_ended_at"]))
        except (KeyError, TypeError, ValueError):
            continue
        if found is not None and (partition not in last or found.offset > last[partition].offset):
            last[partition] = found
    return TailRead(records, size, last, min(started, default=None), throttled, ended, max(ended_at, default=None),
                    spilled, cpu, wall, dict(sorted(requests.items())))
