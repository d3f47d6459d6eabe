"""What the daemon knows of a dependency it cannot answer without (the broker, the ledger root's store): the
last probe's answer, kept in memory, so that the probes (``/readyz``) and the requests that need it answer at
once, never waiting on a dependency that does not answer.

A probe runs in a thread of its own; one that has not come back within ``timeout_s`` counts as a dependency
that does not answer. A failure seen elsewhere (a request of the API) can mark it down too (``failed``). The
log says each change of state once (down, then up again), not each failure.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from compactord.errors import CompactordError

__all__ = ["Watch"]

log = logging.getLogger(__name__)


class Watch:
    def __init__(self, probe: Callable[[], object], timeout_s: float, *, subject: str, down_log: str,
                 up: bool, error: str = "") -> None:
        """``probe``: raises a ``CompactordError`` when the dependency does not answer. ``subject``: its name in
        the log and in ``problem`` ("the broker"). ``down_log``: what the log says once when it goes down
        (the error's text follows). ``up``/``error``: what is known before the first probe."""
        self._probe = probe
        self._timeout_s = timeout_s
        self._subject = subject
        self._down_log = down_log
        self._ok = up
        self._error = error
        self._lost = False  # it is down (logged once) since its last answer
        self._probe_since: float | None = None  # monotonic start of the probe under way

    @property
    def up(self) -> bool:
        """The last probe (or failure seen) found it answering."""
        return self._ok

    def check(self) -> bool:
        """One probe; True if it answered."""
        self._probe_since = time.monotonic()
        try:
            self._probe()
        except CompactordError as exc:
            self.failed(exc.message)
        else:
            if self._lost:
                log.info("%s answers again", self._subject)
            self._ok, self._error, self._lost = True, "", False
        finally:
            self._probe_since = None
        return self._ok

    def failed(self, reason: str) -> None:
        """It did not answer (``reason``: why, for the log and ``problem``)."""
        if not self._lost:
            log.warning("%s: %s", self._down_log, reason)
        self._lost = True
        self._ok, self._error = False, reason

    def problem(self) -> str | None:
        """Why it counts as not answering now, or None; from memory only (the last probe's answer, and how
        long the probe under way has taken)."""
        since = self._probe_since
        if since is not None and time.monotonic() - since > self._timeout_s:
            return f"{self._subject} does not answer (no answer for {time.monotonic() - since:.0f}s)"
        return None if self._ok else f"{self._subject} does not answer: {self._error}"
