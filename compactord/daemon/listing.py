"""What ``GET /v1/topics`` answers from: each topic's row as the monitor's last pass read it (``TopicRow``: its
ledger, last recorded run, policies and unload mark), with the task registry's tasks and the monitor's backlogs
and broker views, all in memory. A listing asks neither the broker nor the store; a figure is as old as the pass
(or the task's end) it came from, and the listing says how old.

``select`` pages and filters the topics: in name order, ``limit`` at a time after ``after`` (the last name of
the previous page), by name prefix and by state (``running``: a task of it runs or waits; ``failed``: its last
compaction failed, or it cannot be read; ``behind``: its last measured backlog is past a trigger's threshold,
its max lag in force included).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compactord.daemon.backlogs import Backlog, triggers_fired
from compactord.daemon.broker_view import BrokerTopic
from compactord.errors import CompactordError, InvalidArgument
from compactord.model import LedgerManifest
from compactord.task import CompactionTaskCtx, TaskState

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "STATES", "TopicPage", "TopicRow", "TopicRows", "age_ms", "behind", "check_query",
           "select"]

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
STATES = ("running", "failed", "behind")


@dataclass(frozen=True)
class TopicRow:
    manifest: LedgerManifest | None  # the current ledger's (None: none, or ``error``)
    run: Any  # the last recorded run (``RunRecord``), or None
    error: CompactordError | None  # why the topic cannot be read (a corrupt ledger or pointer)
    strategy: str  # the strategy in force
    policy: dict[str, Any] | None  # the thresholds in force (None: its policies cannot be read)
    unloaded: bool


class TopicRows:
    """The rows of the monitor's last pass, the topics it saw on the broker, and when it asked."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[str, TopicRow] = {}
        self._on_broker: set[str] = set()
        self.pass_at: float | None = None  # when the last pass asked the broker (UTC seconds)

    def replace(self, rows: dict[str, TopicRow], on_broker: set[str], at: float) -> None:
        with self._lock:
            self._rows, self._on_broker, self.pass_at = dict(rows), set(on_broker), at

    def update(self, topic: str, row: TopicRow) -> None:
        with self._lock:
            self._rows[topic] = row

    def seen_on_broker(self, topic: str) -> None:
        with self._lock:
            self._on_broker.add(topic)

    def forget(self, topic: str) -> None:
        with self._lock:
            self._rows.pop(topic, None)
            self._on_broker.discard(topic)

    def snapshot(self) -> tuple[dict[str, TopicRow], set[str]]:
        with self._lock:
            return dict(self._rows), set(self._on_broker)


def behind(backlog: Backlog | None, row: TopicRow | None, known: BrokerTopic | None) -> bool:
    """Whether the topic's last measured backlog is past one of its triggers (its max lag in force included)."""
    if backlog is None or row is None or row.policy is None:
        return False
    policy = dict(row.policy)
    if known is not None:
        policy["maxLagSeconds"] = known.effective_max_lag(policy["maxLagSeconds"])
    return bool(triggers_fired(backlog, policy))


def _failed(last: CompactionTaskCtx | None, row: TopicRow | None) -> bool:
    if last is not None:
        return last.state is TaskState.FAILED
    if row is None:
        return False
    return row.error is not None or (row.run is not None and row.run.state == TaskState.FAILED.value)


@dataclass(frozen=True)
class TopicPage:
    topics: list[str]
    on_broker: set[str]
    rows: dict[str, TopicRow]
    next_after: str | None  # the ``after`` of the next page; None: this is the last


def check_query(limit: int, state: str | None) -> None:
    """:raises InvalidArgument: ``limit`` is not from 1 to ``MAX_LIMIT``, or ``state`` is not one of ``STATES``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidArgument(f"limit must be a whole number from 1 to {MAX_LIMIT}, got: {limit!r}")
    if state is not None and state not in STATES:
        raise InvalidArgument(f"state must be one of {', '.join(STATES)}, got: {state[:40]!r}")


def select(rows: TopicRows, task_topics: set[str], last: Callable[[str], CompactionTaskCtx | None],
           live: Callable[[str], CompactionTaskCtx | None], backlogs: dict[str, Backlog],
           views: dict[str, BrokerTopic], *, limit: int = DEFAULT_LIMIT, after: str | None = None,
           state: str | None = None, prefix: str | None = None) -> TopicPage:
    """One page of the known topics (the last pass's, and those with a task), in name order.

    :raises InvalidArgument: a bad ``limit`` or ``state`` (``check_query``)."""
    check_query(limit, state)
    kept, on_broker = rows.snapshot()
    names = sorted(set(kept) | on_broker | task_topics)
    chosen: list[str] = []
    more = False
    for topic in names:
        if after is not None and topic <= after:
            continue
        if prefix and not topic.startswith(prefix):
            continue
        if state == "running" and live(topic) is None:
            continue
        if state == "failed" and not _failed(last(topic), kept.get(topic)):
            continue
        if state == "behind" and not behind(backlogs.get(topic), kept.get(topic), views.get(topic)):
            continue
        if len(chosen) == limit:
            more = True
            break
        chosen.append(topic)
    return TopicPage(chosen, on_broker, kept, chosen[-1] if more else None)


def age_ms(at: float | None, now: float | None = None) -> int | None:
    """How old a figure measured at ``at`` (UTC seconds) is, in milliseconds (None: never measured)."""
    return None if at is None else max(0, int(((time.time() if now is None else now) - at) * 1000))
