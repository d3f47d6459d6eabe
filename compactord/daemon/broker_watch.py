"""The daemon's watch on the broker: a thread of its own pings it, with a client of its own.

The daemon's client serialises its calls, so a ping through it would queue behind a hung request; and the
probes (``/readyz``, the 503s of requests that need the broker) never wait on the broker: they read what
the last ping found, and a ping that has not come back within kafkaRequestTimeoutMs counts as a broker that
does not answer. The log says each change of state once (down, then up again), not each failure.
"""

from __future__ import annotations

import logging
import threading
import time

from compactord.errors import CompactordError
from compactord.interfaces import BrokerMetadata

__all__ = ["BrokerWatch"]

log = logging.getLogger(__name__)
PING_EVERY_S = 5.0  # while it answers; while it does not, RETRY_FIRST_S doubling up to:
RETRY_FIRST_S = 2.0
RETRY_MAX_S = 16.0


class BrokerWatch:
    def __init__(self, probe: BrokerMetadata, timeout_s: float) -> None:
        """``probe``: a client used for nothing else. ``timeout_s``: how long a ping may take before the
        broker counts as not answering."""
        self._probe = probe
        self._timeout_s = timeout_s
        self._ok = False
        self._error = "the broker has not been asked yet"
        self._lost = False  # it is down (logged once) since its last answer
        self._ping_since: float | None = None  # monotonic start of the ping under way

    def run(self, stop: threading.Event) -> None:
        """Ping until ``stop`` is set (a thread's target)."""
        down_for = 0  # pings failed in a row: the next one waits longer, up to RETRY_MAX_S
        while not stop.is_set():
            self.check()
            down_for = 0 if self._ok else down_for + 1
            stop.wait(PING_EVERY_S if self._ok else min(RETRY_FIRST_S * 2 ** (down_for - 1), RETRY_MAX_S))

    def check(self) -> None:
        """One ping."""
        self._ping_since = time.monotonic()
        try:
            self._probe.ping()
            if self._lost:
                log.info("the broker answers again")
            self._ok, self._error, self._lost = True, "", False
        except CompactordError as exc:
            if not self._lost:
                log.warning("broker unavailable (checked again in the background; requests that need it "
                            "answer 503 broker_unavailable until it answers): %s", exc)
            self._lost = True
            self._ok, self._error = False, exc.message
        finally:
            self._ping_since = None

    def problem(self) -> str | None:
        """Why the broker counts as unreachable now, or None; from memory only (the last ping's answer, and
        how long the ping under way has taken)."""
        since = self._ping_since
        if since is not None and time.monotonic() - since > self._timeout_s:
            return f"the broker does not answer (no answer for {time.monotonic() - since:.0f}s)"
        return None if self._ok else f"the broker does not answer: {self._error}"
