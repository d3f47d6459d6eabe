"""One periodic pass (the backlog monitor's, the storage sweep's): a timer starts it, one runs at a time, and
a stopped pass starts no more.

Each pass runs in a daemon thread of its own, not in the scheduler's pool: the pool's threads are joined when
the process exits, and a pass stuck in a request (kafka-python's bootstrap can wait without a bound when its
network thread is closed under it) kept a stopped process alive.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from compactord.errors import BrokerUnavailable, CompactordError

__all__ = ["PeriodicPass"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class PeriodicPass(Generic[T]):
    """``run_once`` runs ``body`` unless a pass is under way (then ``idle``); ``start_pass`` runs it in a thread
    of its own (a timer's job); ``on_result("ok" | "error")`` counts each pass. A ``CompactordError`` is one log
    line naming ``what`` (a ``BrokerUnavailable`` a debug line: the broker's probe logs the outage); anything
    else a traceback."""

    def __init__(self, name: str, what: str, body: Callable[..., T], idle: T,
                 on_result: Callable[[str], None]) -> None:
        self._name = name
        self._what = what
        self._body = body
        self._idle = idle
        self._on_result = on_result
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        self.last_run: float | None = None
        self.passes = threading.Event()  # set once a pass has ended (whatever its result)

    def start_pass(self) -> None:
        if not self.stopping.is_set():
            threading.Thread(target=self.run_once, name=self._name, daemon=True).start()

    def stop(self) -> None:
        """No new pass starts; the body ends a pass under way at its next check of ``stopping``."""
        self.stopping.set()

    def run_once(self, *args: object) -> T:
        """One pass now (``args`` to the body); ``idle`` when a pass is under way."""
        if not self._lock.acquire(blocking=False):
            return self._idle  # the previous pass is still running
        try:
            answer = self._body(*args)
            self._on_result("ok")
            return answer
        except CompactordError as exc:
            (log.debug if isinstance(exc, BrokerUnavailable) else log.warning)("%s failed: %s", self._what, exc)
            self._on_result("error")
        except Exception:
            log.exception("%s failed", self._what)
            self._on_result("error")
        finally:
            self.last_run = time.time()
            self.passes.set()
            self._lock.release()
        return self._idle
