"""The daemon's watch on the broker: a thread of its own pings it, with a client of its own.

The daemon's client serialises its calls, so a ping through it would queue behind a hung request; and the
probes (``/readyz``, the 503s of requests that need the broker) never wait on the broker: they read what
the last ping found (``watch.Watch``), and a ping that has not come back within kafkaRequestTimeoutMs counts
as a broker that does not answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from compactord.daemon.watch import Watch
from compactord.errors import BrokerUnavailable
from compactord.interfaces import BrokerMetadata

__all__ = ["PING_DEADLINE_S", "BrokerWatch", "OneCallAtATime"]

PING_EVERY_S = 5.0  # while it answers; while it does not, RETRY_FIRST_S doubling up to:
RETRY_FIRST_S = 2.0
RETRY_MAX_S = 16.0
# A ping (one metadata request) that has not come back within this counts as a broker that does not answer,
# however long kafkaRequestTimeoutMs lets a request wait: a metadata answer takes milliseconds, and a broker
# that stalls (a paused process, a full GC, a dead host behind an open TCP connection) must degrade
# readiness in seconds, not after a request timeout sized for produce and fetch.
PING_DEADLINE_S = 5.0

T = TypeVar("T")


class BrokerWatch(Watch):
    def __init__(self, probe: BrokerMetadata, timeout_s: float) -> None:
        """``probe``: a client used for nothing else. ``timeout_s``: kafkaRequestTimeoutMs; a ping that takes
        longer than it or ``PING_DEADLINE_S`` counts as a broker that does not answer."""
        super().__init__(probe.ping, min(timeout_s, PING_DEADLINE_S), subject="the broker", up=False,
                         error="the broker has not been asked yet",
                         down_log="broker unavailable (checked again in the background; requests that need it "
                                  "answer 503 broker_unavailable until it answers)")

    def run(self, stop: threading.Event) -> None:
        """Ping until ``stop`` is set (a thread's target)."""
        down_for = 0  # pings failed in a row: the next one waits longer, up to RETRY_MAX_S
        while not stop.is_set():
            ok = self.check()
            down_for = 0 if ok else down_for + 1
            stop.wait(PING_EVERY_S if ok else min(RETRY_FIRST_S * 2 ** (down_for - 1), RETRY_MAX_S))


class OneCallAtATime:
    """Broker calls that a request waits for at most a deadline: each runs on a thread of its own, one at a
    time (the client serialises its calls anyway), and a caller that has no answer by its deadline is
    answered ``BrokerUnavailable`` while the call finishes in the background. A hung broker holds one thread
    here, however many requests ask."""

    def __init__(self) -> None:
        self._free = threading.Semaphore(1)

    def call(self, fn: Callable[[], T], deadline_s: float, what: str) -> T:
        """``fn()``'s answer or error. :raises BrokerUnavailable: none within ``deadline_s`` (``what``
        names the call in the message)."""
        end = time.monotonic() + deadline_s
        late = BrokerUnavailable(f"the broker did not answer {what} within {deadline_s:g}s")
        if not self._free.acquire(timeout=max(deadline_s, 0.0)):
            raise late
        done = threading.Event()
        answer: list[T] = []
        failure: list[BaseException] = []

        def run() -> None:
            try:
                answer.append(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
                failure.append(exc)
            finally:
                done.set()
                self._free.release()

        threading.Thread(target=run, name="broker-call", daemon=True).start()
        if not done.wait(max(end - time.monotonic(), 0.0)):
            raise late
        if failure:
            raise failure[0]
        return answer[0]
