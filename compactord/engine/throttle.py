"""Read throttling (``compactionMaxReadBytesPerSecond``, the policy's ``maxReadBytesPerSecond``; Kafka's
``log.cleaner.io.max.bytes.per.second``): a token bucket per reading task.

A compaction's budget is shared evenly among the reading tasks that run at once (``per_task_rate``):
Spark runs at most one task per core, so the sum over the running tasks stays within the budget. Each
task's bucket starts empty and holds at most ``BURST_SECONDS`` of its rate, so that a task never reads
faster than its share, even at its start. When fewer tasks are left than cores (partitions of unequal
sizes end at different times), the driver hands the ended tasks' share to those still reading
(``running_share``, written to the job's progress folder; the tasks pick it up with their cancel
checks), so that the job reads at its budget to the end. The client's prefetch is sized to the budget too
(``fetch_bytes``), so that the cap is on what is fetched from the brokers, not only on what is consumed.

The reading task calls ``consume`` with the bytes of each batch it reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["BURST_SECONDS", "MIN_FETCH_BYTES", "ReadThrottle", "fetch_bytes", "per_task_rate", "running_share"]

BURST_SECONDS = 1.0
# A sleep is cut into slices this long, so that a cancel stops a throttled reader quickly.
SLICE_SECONDS = 0.1
# The smallest fetch a throttled reader asks for: below it, requests cost more than the data.
MIN_FETCH_BYTES = 64 * 1024


def per_task_rate(budget: int, ranges: int, cores: int) -> float:
    """The share of one reading task of a ``budget`` in bytes per second (0: unlimited), when ``ranges``
    reading tasks run on ``cores`` cores."""
    if budget <= 0:
        return 0.0
    return budget / max(1, min(ranges, cores))


def running_share(budget: int, ranges: int, cores: int, ended: int) -> float:
    """The share of each task still reading once ``ended`` of the ``ranges`` reading tasks have ended:
    the budget over the tasks that can run now (all that are left, when fewer than the cores)."""
    return per_task_rate(budget, max(1, ranges - ended), cores)


def fetch_bytes(rate: float, default: int) -> int:
    """The fetch size of a reader throttled to ``rate`` bytes per second: about one second of it, at
    least ``MIN_FETCH_BYTES``, at most ``default`` (the unthrottled size); ``default`` when unlimited."""
    if rate <= 0:
        return default
    return max(MIN_FETCH_BYTES, min(default, int(rate)))


class ReadThrottle:
    """A token bucket of ``rate`` bytes per second.

    ``check`` is called between the slices of a sleep; what it raises (e.g. the reader's cancellation)
    ends the sleep. ``clock`` and ``sleep`` are the seam of the unit tests.
    """

    def __init__(self, rate: float, check: Callable[[], None] | None = None, *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive (bytes per second), got: {rate}")
        self.rate = float(rate)
        self.capacity = self.rate * BURST_SECONDS
        self._check = check
        self._clock = clock
        self._sleep = sleep
        self._tokens = 0.0
        self._at = clock()
        self.slept = 0.0  # seconds spent waiting for tokens

    def set_rate(self, rate: float) -> None:
        """Go on at ``rate`` from now (the tokens gathered so far at the old rate stay)."""
        if rate <= 0:
            raise ValueError(f"rate must be positive (bytes per second), got: {rate}")
        self._refill()
        self.rate = float(rate)
        self.capacity = self.rate * BURST_SECONDS

    def consume(self, nbytes: int) -> None:
        """Take ``nbytes`` from the bucket, waiting (in slices) until it has refilled enough."""
        self._refill()
        self._tokens -= nbytes
        wait = -self._tokens / self.rate  # the time the bucket needs to pay the debt back
        while wait > 0:
            step = min(SLICE_SECONDS, wait)
            self._sleep(step)
            self.slept += step
            wait -= step
            if self._check is not None:
                self._check()
        self._refill()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now
