"""One thread for every topic's sweep of retired ledgers (``service.SparkTopicCompactionService``): each topic
asks for its sweep at a time (``SweepScheduler.at``), kept in a heap; the one thread calls each at its time, so
that the threads do not grow with the topics (1,000 topics with a retired ledger each make one thread, not
1,000 timers). The thread ends when nothing is left to call, and starts again with the next call asked for.

A call runs on that thread: a slow one (a store that does not answer) delays the calls due after it, never
drops them.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["SWEEPS", "SweepScheduler"]

log = logging.getLogger(__name__)


class SweepScheduler:
    """Calls each function asked for at its time (UTC seconds), on one thread, earliest first. Thread-safe."""

    def __init__(self, name: str) -> None:
        self.name = name  # the thread's
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()  # equal times: in the order asked
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def at(self, when: float, fn: Callable[[], None]) -> None:
        """Call ``fn`` at ``when`` (UTC seconds; now if past). A call no longer wanted is the caller's to ignore
        when it comes (``fn`` checks that it is still the one asked for)."""
        with self._changed:
            heapq.heappush(self._heap, (when, next(self._order), fn))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            else:
                self._changed.notify()

    def pending(self) -> int:
        """The calls waiting for their time."""
        with self._changed:
            return len(self._heap)

    def _run(self) -> None:
        while True:
            with self._changed:
                while True:
                    if not self._heap:
                        self._thread = None  # the next ``at`` starts another
                        return
                    when = self._heap[0][0]
                    delay = when - time.time()
                    if delay <= 0:
                        _when, _order, fn = heapq.heappop(self._heap)
                        break
                    self._changed.wait(delay)
            try:
                fn()
            except Exception:  # the thread has no caller: the next switch, read or start asks again
                log.exception("a scheduled sweep of retired ledgers failed")


#: The process's one scheduler of retired-ledger sweeps, shared by every topic's service.
SWEEPS = SweepScheduler("retired-ledger-sweeps")
