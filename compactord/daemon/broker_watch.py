"""The daemon's watch on the broker: a thread of its own pings it, with a client of its own.

The daemon's client serialises its calls, so a ping through it would queue behind a hung request; and the
probes (``/readyz``, the 503s of requests that need the broker) never wait on the broker: they read what
the last ping found (``watch.Watch``), and a ping that has not come back within kafkaRequestTimeoutMs counts
as a broker that does not answer.
"""

from __future__ import annotations

import threading

from compactord.daemon.watch import Watch
from compactord.interfaces import BrokerMetadata

__all__ = ["BrokerWatch"]

PING_EVERY_S = 5.0  # while it answers; while it does not, RETRY_FIRST_S doubling up to:
RETRY_FIRST_S = 2.0
RETRY_MAX_S = 16.0


class BrokerWatch(Watch):
    def __init__(self, probe: BrokerMetadata, timeout_s: float) -> None:
        """``probe``: a client used for nothing else. ``timeout_s``: how long a ping may take before the
        broker counts as not answering."""
        super().__init__(probe.ping, timeout_s, subject="the broker", up=False,
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
