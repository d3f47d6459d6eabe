"""When the root's writer recovers each topic (``LedgerStore.recover_topic``): not all at ``open()``, which would
be a burst of requests per topic before anything is served (several lists and reads each on an object store),
but once per topic per ``open()``, at the first of

- the topic's first touch: every per-topic entry point of ``LedgerStore`` goes through ``TopicRecovery.ready``
  first, so that nothing of a topic is read, written, listed, compacted or deleted before its recovery ran (a
  deletion a restart interrupted is completed before the topic is served);
- the recovery pass: a thread that goes over the root's topics at a bounded pace (``RECOVERY_TOPICS_PER_SECOND``),
  so that every topic is recovered soon after the start without a burst; it stops at ``close()``.

Thread-safe: a topic's recovery runs in one thread while others touching the topic wait for it; the recovering
thread's own calls into the store pass (a lock per topic, held again by its holder). A recovery that raises (the
store does not answer) leaves the topic to recover at its next touch, and the touch fails with the error.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["RECOVERY_TOPICS_PER_SECOND", "RecoveryHook", "TopicRecovery"]

log = logging.getLogger("compactord.ledger.store")  # one logger for what the recovery finds

# The background pass's pace: on an object store a topic's recovery is a few lists and reads, so this is a few
# dozen requests a second, and a root of 1,000 topics is recovered within a minute of the start.
RECOVERY_TOPICS_PER_SECOND = 20.0

# What the store's owner does with a topic once recovered, before the topic is served: (topic, whether the
# recovery completed the topic's deletion).
RecoveryHook = Callable[[str, bool], None]


class TopicRecovery:
    """The topics recovered since the store's ``open()``, the gate in front of the others, and the pass."""

    def __init__(self, recover: Callable[[str], bool | None]) -> None:
        """``recover``: recover one topic (``LedgerStore.recover_topic``): True if it completed its deletion,
        None if it cannot now (the touch passes; the topic recovers at a later one)."""
        self._recover = recover
        self._lock = threading.Lock()
        self._topic_locks: dict[str, threading.RLock] = {}
        self._done: dict[str, bool] = {}  # recovered topic -> whether its deletion was completed
        self._running: set[str] = set()  # topics whose recovery is under way (in the thread holding their lock)
        self._hook: RecoveryHook | None = None
        self._active = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """In force from now (the store's ``open()``): every topic is recovered again at its first touch."""
        with self._lock:
            self._done.clear()
            self._active = True
            self._stop = threading.Event()

    def stop(self) -> None:
        """Out of force (the store's ``close()``): the pass stops; touches recover nothing."""
        with self._lock:
            self._active = False
            self._stop.set()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(30.0)  # a recovery under way ends with its request; it is waited for, within bounds

    def after_recovery(self, hook: RecoveryHook) -> None:
        """Call ``hook`` for every topic recovered from now on, before the topic is served, and at once for those
        recovered already."""
        with self._lock:
            self._hook = hook
            done = dict(self._done)
        for topic, deleted in done.items():
            hook(topic, deleted)

    def recovered(self, topic: str) -> bool:
        return topic in self._done

    def forget(self, topic: str) -> None:
        """Recover ``topic`` again at its next touch (a topic a cluster's member takes: a previous owner wrote it)."""
        with self._lock:
            self._done.pop(topic, None)

    def ready(self, topic: str) -> None:
        """Recover ``topic`` unless it was since the store's ``open()`` (a valid name; the store checks it).

        :raises CompactordError: the recovery failed (the store does not answer, the root's lease is lost): the
            next touch tries again.
        """
        if topic in self._done or not self._active:
            return
        with self._lock:
            lock = self._topic_locks.setdefault(topic, threading.RLock())
        with lock:
            if topic in self._done or topic in self._running or not self._active:
                return  # recovered meanwhile, or this thread's own call from within the recovery
            self._running.add(topic)
            try:
                deleted = self._recover(topic)
                if deleted is not None:
                    self._finish(topic, deleted)
            finally:
                self._running.discard(topic)
        with self._lock:
            self._topic_locks.pop(topic, None)

    def _finish(self, topic: str, deleted: bool) -> None:
        """Call the hook in force, and count the topic recovered unless another hook came meanwhile (which
        ``after_recovery`` did not call for it: it was not recovered yet)."""
        while True:
            with self._lock:
                hook = self._hook
            if hook is not None:
                hook(topic, deleted)
            with self._lock:
                if self._hook is hook:
                    self._done[topic] = deleted
                    return

    def start_pass(self, topics: Callable[[], list[str]], per_second: float = RECOVERY_TOPICS_PER_SECOND) -> None:
        """Recover every topic of ``topics()`` in a thread, ``per_second`` topics a second at most (one of them
        every ``1 / per_second`` seconds); those touched meanwhile are not recovered again. ``per_second`` <= 0:
        no pass (topics recover at their first touch only)."""
        if per_second <= 0:
            return
        with self._lock:
            if not self._active or self._thread is not None:
                return
            stop = self._stop
            self._thread = threading.Thread(target=self._pass, args=(topics, 1.0 / per_second, stop),
                                            name="ledger-recovery", daemon=True)
            self._thread.start()

    def _pass(self, topics: Callable[[], list[str]], interval: float, stop: threading.Event) -> None:
        try:
            names = topics()
        except Exception as exc:  # noqa: BLE001 (each topic still recovers at its first touch)
            log.warning("the recovery pass could not list the root's topics (each recovers at its first use): %s",
                        exc)
            return
        for topic in names:
            if stop.is_set():
                return
            if topic in self._done:
                continue
            try:
                self.ready(topic)
            except Exception as exc:  # noqa: BLE001 (the topic recovers at its next touch, which reports it)
                if not stop.is_set():
                    log.warning("topic %r: not recovered by the recovery pass (it is at its next use): %s", topic, exc)
            if stop.wait(interval):
                return
        log.info("the recovery pass went over the root's %d topics", len(names))
