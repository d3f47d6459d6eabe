"""The identity check of the read paths: is the topic on the broker the one the ledger was made of?

Every read of a ledger (a page, the last entry, the horizon, the sampled preview) checks it against what
the broker says of the topic (its id, its offsets: ``kafka.identity.new_log_reason``; a read confirms only the
ends at or below the ledger's horizon, ``BrokerMetadata.log_now``), at most ``MAX_AGE_S`` old: one broker
request per topic per ``MAX_AGE_S`` however many reads come (reads of a topic whose answer is being asked wait
for it; a ledger of a higher horizon than the answer was asked for asks again), for at most ``MAX_TOPICS``
topics (the least recently read are dropped). A broker that cannot be asked (known down, or failing the
request) does not fail a read: the check uses the last answer it had (its own, or the monitor's, whichever is
newer) and says so (``Checked.headers``: ``Compactord-Identity-Checked-At``, the time of that answer, or
``never``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from compactord.errors import TopicNotFound, TopicRecreated
from compactord.interfaces import BrokerMetadata
from compactord.kafka.identity import LogNow, new_log_reason
from compactord.model import LedgerManifest, PartitionOffsets, iso_utc

__all__ = ["CHECKED_AT_HEADER", "MAX_AGE_S", "MAX_TOPICS", "Checked", "IdentityAnswer", "TopicIdentities"]

log = logging.getLogger(__name__)

MAX_AGE_S = 1.0
MAX_TOPICS = 4096
CHECKED_AT_HEADER = "Compactord-Identity-Checked-At"


@dataclass(frozen=True, slots=True)
class IdentityAnswer:
    """What the broker said of a topic's identity. ``offsets`` None: it has no such topic."""

    topic_id: str | None
    offsets: Mapping[int, PartitionOffsets] | None
    asked_at: float  # wall clock, when it was asked (before its first answer)


@dataclass(frozen=True, slots=True)
class Checked:
    """How a read's identity check was made: with a fresh answer, or with ``answer`` (None: none was ever
    had) because the broker could not be asked."""

    fresh: bool
    answer: IdentityAnswer | None

    def headers(self) -> dict[str, str]:
        """The response headers that mark a check made without a fresh answer (none for a fresh one)."""
        if self.fresh:
            return {}
        at = iso_utc(self.answer.asked_at) if self.answer is not None else None
        return {CHECKED_AT_HEADER: at or "never"}


class _Topic:
    def __init__(self) -> None:
        self.lock = threading.Lock()  # held while the broker is asked: the other reads wait for its answer
        self.answer: IdentityAnswer | None = None
        self.answered_at = 0.0  # monotonic
        self.failed_at: float | None = None  # monotonic: the last ask that failed
        # The horizon the answer was asked for: its ends at or below it were confirmed by a read, those above it
        # are as listed (``BrokerMetadata.log_now``); it answers a check of a ledger whose horizon is no higher.
        self.horizon: Mapping[int, int] = {}


class TopicIdentities:
    def __init__(self, broker: BrokerMetadata, broker_problem: Callable[[], str | None],
                 last_seen: Callable[[str], IdentityAnswer | None] = lambda _topic: None, *,
                 max_age_s: float = MAX_AGE_S, max_topics: int = MAX_TOPICS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``broker``: a client the reads may wait on. ``broker_problem``: why the broker is known down now
        (None: it answers), from memory. ``last_seen``: another answer to fall back on (the monitor's)."""
        if not max_age_s > 0:
            raise ValueError(f"max_age_s must be positive, got: {max_age_s!r}")
        if max_topics < 1:
            raise ValueError(f"max_topics must be at least 1, got: {max_topics!r}")
        self._broker = broker
        self._broker_problem = broker_problem
        self._last_seen = last_seen
        self._max_age_s = max_age_s
        self._max_topics = max_topics
        self._clock = clock
        self._topics: OrderedDict[str, _Topic] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, topic: str, manifest: LedgerManifest) -> Checked:
        """Check that ``manifest``'s ledger is of the topic the broker has now.

        :raises TopicRecreated: the broker's topic is another incarnation than the ledger's.
        """
        checked = self._answer(topic, manifest)
        answer = checked.answer
        # An answer asked before the ledger was made tells nothing of it (the run that made it saw later).
        if answer is not None and answer.offsets is not None and answer.asked_at * 1000 >= manifest.finished_at_ms:
            why = new_log_reason(manifest, answer.offsets, LogNow(answer.topic_id))
            if why is not None:
                raise TopicRecreated(topic, why)
        return checked

    def forget(self, topic: str) -> None:
        with self._lock:
            self._topics.pop(topic, None)

    def _entry(self, topic: str) -> _Topic:
        with self._lock:
            entry = self._topics.get(topic)
            if entry is None:
                entry = self._topics[topic] = _Topic()
                while len(self._topics) > self._max_topics:
                    self._topics.popitem(last=False)
            else:
                self._topics.move_to_end(topic)
            return entry

    def _answer(self, topic: str, manifest: LedgerManifest) -> Checked:
        entry = self._entry(topic)
        with entry.lock:
            now = self._clock()
            kept = entry.answer
            if kept is not None and now - entry.answered_at < self._max_age_s \
                    and kept.asked_at * 1000 >= manifest.finished_at_ms and _covers(entry.horizon, manifest.horizon):
                return Checked(True, kept)
            recently_failed = entry.failed_at is not None and now - entry.failed_at < self._max_age_s
            problem = self._broker_problem()
            if problem is None and not recently_failed:
                try:
                    entry.answer = self._ask(topic, manifest.horizon)
                    entry.answered_at, entry.failed_at = self._clock(), None
                    entry.horizon = dict(manifest.horizon)
                    return Checked(True, entry.answer)
                except Exception as exc:  # noqa: BLE001 (whatever the broker did, the read goes on)
                    entry.failed_at = self._clock()
                    problem = str(exc)
            log.debug("topic %s: identity checked against the last answer (%s)", topic,
                      problem or "the broker failed a request just now")
            return Checked(False, self._newest(entry.answer, self._last_seen(topic)))

    def _ask(self, topic: str, horizon: Mapping[int, int]) -> IdentityAnswer:
        asked = time.time()
        try:
            topic_id, offsets = self._broker.log_now(topic, horizon)
        except TopicNotFound:
            return IdentityAnswer(None, None, asked)  # deleted, not (yet) recreated: the ledger is the last view
        return IdentityAnswer(topic_id, offsets, asked)

    @staticmethod
    def _newest(*answers: IdentityAnswer | None) -> IdentityAnswer | None:
        return max((a for a in answers if a is not None), key=lambda a: a.asked_at, default=None)


def _covers(asked_for: Mapping[int, int], horizon: Mapping[int, int]) -> bool:
    """Whether an answer asked for the horizon ``asked_for`` confirmed every end a ledger of ``horizon`` needs."""
    return all(asked_for.get(p, -1) >= h for p, h in horizon.items())
