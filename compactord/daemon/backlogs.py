"""Fresh backlogs for ``GET /v1/topics``: measured on demand when the monitor's are missing or old.

The monitor measures the topics it compacts once an interval; the listing would show "-" for a topic
never measured and, after a compaction, the backlog from before it for up to an interval. So a
listing measures (bounded: ``BUDGET_S`` of broker calls a listing at most) the topics on the broker
whose listing measure is older than ``FRESH_S`` or older than the topic's last task; and a task's end
measures its topic again in the background, for the metrics and the monitor.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from compactord.daemon.broker_watch import PING_DEADLINE_S, OneCallAtATime
from compactord.errors import CompactordError

if TYPE_CHECKING:
    from compactord.daemon.monitor import Backlog, BacklogMonitor
    from compactord.daemon.registry import TaskRegistry

__all__ = ["BUDGET_S", "FRESH_S", "BacklogCache"]

log = logging.getLogger(__name__)
FRESH_S = 5.0  # a measure this young is shown as it is
BUDGET_S = 3.0  # one listing measures topics for at most this long; the others show their last measure


@dataclass(frozen=True)
class _Measure:
    backlog: Backlog
    at: float  # monotonic
    after: tuple[str, str] | None  # the topic's last task (id, state) when it was measured


class BacklogCache:
    def __init__(self, monitor: BacklogMonitor, registry: TaskRegistry) -> None:
        self._monitor = monitor
        self._registry = registry
        self._measures: dict[str, _Measure] = {}
        self._lock = threading.Lock()
        self._calls = OneCallAtATime()  # a listing's broker calls: a stalled broker holds one thread, not them

    def topics_on_broker(self, list_topics: Callable[[], list[str]]) -> list[str]:
        """``list_topics()``, waited for at most ``PING_DEADLINE_S`` (the broker watch's own bound on a
        metadata answer). :raises BrokerUnavailable: no answer by then."""
        return self._calls.call(list_topics, PING_DEADLINE_S, "a list of its topics")

    def _last_task(self, topic: str) -> tuple[str, str] | None:
        last = self._registry.last(topic)
        return None if last is None else (last.task_id, last.state.value)

    def measure(self, topic: str, *, for_listing: bool = True, within_s: float | None = None) -> Backlog | None:
        """Measure ``topic`` now and keep it as the monitor's (with its metrics) and, ``for_listing``, as
        the listing's for ``FRESH_S``; None if the broker does not answer (within ``within_s``, if given)
        or lacks the topic. A task's end measures not for the listing: what is produced right after a run
        is then in the next listing."""
        after = self._last_task(topic)
        try:
            if within_s is None:
                backlog = self._monitor.measure(topic)
            else:
                backlog = self._calls.call(lambda: self._monitor.measure(topic), within_s, f"topic {topic}'s offsets")
        except CompactordError as exc:
            log.debug("backlog of topic %s not measured: %s", topic, exc)
            return None
        if for_listing:
            with self._lock:
                self._measures[topic] = _Measure(backlog, time.monotonic(), after)
        self._monitor.record_backlog(backlog)
        return backlog

    def backlogs(self, on_broker: dict[str, bool]) -> dict[str, Backlog]:
        """The backlog of each topic that has one: fresh ones as they are, the others measured now while
        the budget lasts (a topic with a live task shows its last measure: the run is changing it)."""
        deadline = time.monotonic() + BUDGET_S
        found: dict[str, Backlog] = {}
        for topic, present in on_broker.items():
            kept = self._measures.get(topic)
            fresh = kept is not None and time.monotonic() - kept.at < FRESH_S and kept.after == self._last_task(topic)
            backlog = kept.backlog if fresh and kept is not None else None
            left = deadline - time.monotonic()
            if backlog is None and present and self._registry.live(topic) is None and left > 0:
                backlog = self.measure(topic, within_s=left)
            if backlog is None:  # the last measure, the monitor's or ours, whichever there is
                backlog = self._monitor.backlogs.get(topic) or (kept.backlog if kept is not None else None)
            if backlog is not None:
                found[topic] = backlog
        return found

    def forget(self, topic: str) -> None:
        with self._lock:
            self._measures.pop(topic, None)
