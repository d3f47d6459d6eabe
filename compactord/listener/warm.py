"""The batches of a new ledger made before a client asks for them: when this daemon switches a topic that the
listener served from a ledger in the last ``WINDOW_S`` (an application reads it through the listener), the first
page of each of its partitions is read and encoded in a thread of its own (``TopicView.warm``), so the first
fetches of an application that bootstraps from the new ledger are answered from the batch cache, as a broker
answers from its page cache, with no Parquet read and no encoding.

A switch is seen by the topic's pointer generation (``LedgerStore.pointer_generation``, from memory), looked at
every ``INTERVAL_S`` for the topics served in the window: another cluster member's switch is not seen here (the
member that made the ledger warms it for its own clients).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from compactord.errors import CompactordError
from compactord.listener.view import TopicView

__all__ = ["INTERVAL_S", "WINDOW_S", "Warmer"]

log = logging.getLogger(__name__)

INTERVAL_S = 0.1
WINDOW_S = 600.0


class _Store(Protocol):
    def pointer_generation(self, topic: str) -> int: ...


class Warmer:
    def __init__(self, view: TopicView, store: _Store, interval_s: float = INTERVAL_S,
                 window_s: float = WINDOW_S) -> None:
        self._view = view
        self._store = store
        self._interval_s = interval_s
        self._window_s = window_s
        self._seen: dict[str, int] = {}  # topic: the pointer generation last looked at
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Warmer:
        self._thread = threading.Thread(target=self._run, name="kafka-listener-warm", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None

    def look(self) -> list[str]:
        """Warm each served topic whose pointer this daemon wrote since the last look; the topics warmed."""
        warmed = []
        served = self._view.served_since(time.monotonic() - self._window_s)
        for topic in set(self._seen) - set(served):
            del self._seen[topic]
        for topic in served:
            generation = self._store.pointer_generation(topic)
            before = self._seen.get(topic)
            self._seen[topic] = generation
            if before is None or before == generation:
                continue
            try:
                encoded = self._view.warm(topic)
            except CompactordError as exc:  # the store down, a ledger that fails its check: a fetch reads it
                log.debug("Kafka listener: the new ledger of %s not warmed: %s", topic, exc)
                continue
            if encoded:
                warmed.append(topic)
                log.debug("Kafka listener: %d bytes of batches of %s's new ledger kept", encoded, topic)
        return warmed

    def _run(self) -> None:
        while not self._stopping.wait(self._interval_s):
            try:
                self.look()
            except Exception:  # a bug here must not end the warming of every other topic
                log.exception("Kafka listener: warming new ledgers failed")
