"""A topic's ``CURRENT`` pointer, its ledger ids and the root's writer epoch: small objects written only by
compare-and-swap (``put_if_absent`` first, ``put_if_match`` after), so that of two writers that read one
version, one wins and the other is ``Fenced``, on a local disk as on an object store.

``<topic>/CURRENT`` is ``{"ledger": 12, "epoch": 3, "retired": [{"id": 11, "until": "2026-11-27T10:00:00Z"}]}``:
the ledger served, the epoch of the writer that switched to it (or, on a root daemons share, that took the topic
last: ``ownership.py``), and the ledgers replaced since that stay readable by id until their ``until``. A topic
taken before it has a ledger has ``"ledger": null``: it records the epoch only, and reads as no ledger. A pointer an
older version wrote (``ledger-12\\n``) reads as ledger 12,
epoch 0, nothing retired, and is replaced by the JSON form at the topic's next switch.

``@compactord/ledger-ids/<topic>`` holds the topic's last ledger id; an id is taken by advancing it by
compare-and-swap from above every id the topic used (the ledgers there, the pointer's, the legacy root-wide
``@compactord/ledger-seq`` of an older version), so ids are positive, strictly increasing per topic and never
reused. It lies outside the topic's folder so that it outlives the topic's deletion: a topic deleted and
compacted again goes on from its last id, and a reader pinned to an id of the deleted one never reads another
ledger under that id.

``@compactord/epoch`` is raised by compare-and-swap by each daemon that opens the root, and by each member of a
cluster that takes a topic; a switch writes its writer's epoch into the pointer, and one from a lower epoch than the
pointer's is fenced.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from compactord.errors import Fenced, LedgerCorrupt, ObjectNotFound, PreconditionFailed
from compactord.ledger import layout
from compactord.ledger.layout import LEDGER_RE
from compactord.storage import ObjectStore

__all__ = ["EPOCH_KEY", "LAST_IDS", "LEGACY_SEQ_KEY", "KnownPointers", "Pointer", "Retired", "allocate_id", "expired", "last_id",
           "parse_pointer", "raise_epoch", "raise_last_id", "read_pointer", "write_pointer"]

LAST_IDS = layout.last_ids_root().rstrip("/")
EPOCH_KEY = layout.epoch_key()
LEGACY_SEQ_KEY = layout.legacy_seq_key()
# Conditional writes that lose to another writer are retried from a fresh read; each loss means another
# writer advanced, so this bound is only reached by a store that fails every condition (a broken store).
_CAS_ATTEMPTS = 100


@dataclass(frozen=True, slots=True)
class Retired:
    """A ledger a switch replaced, readable by id until ``until`` (UTC seconds since the epoch)."""

    id: int
    until: float

    def to_json(self) -> dict[str, Any]:
        stamp = datetime.fromtimestamp(math.ceil(self.until), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"id": self.id, "until": stamp}


@dataclass(frozen=True, slots=True)
class Pointer:
    """A topic's pointer as read, with the store's ``version`` of it (None: there is none)."""

    ledger: int | None
    epoch: int = 0
    retired: tuple[Retired, ...] = field(default_factory=tuple)
    version: str | None = None
    legacy: bool = False  # the one-line form of an older version

    def retired_until(self, ledger_id: int) -> float | None:
        return next((r.until for r in self.retired if r.id == ledger_id), None)

    def switched(self, topic: str, ledger_id: int, epoch: int, retire_for: float | None) -> Pointer:
        """The pointer a writer of ``epoch`` makes of this one to switch to ``ledger_id``; the ledger this
        names joins the retired list for ``retire_for`` seconds (None or <= 0: it does not).

        :raises Fenced: this pointer names a higher epoch (another daemon took the root over since).
        """
        self._check_epoch(topic, epoch, f"ledger {ledger_id} is not made current")
        retired = [r for r in self.retired if r.id not in (ledger_id, self.ledger)]
        if self.ledger is not None and self.ledger != ledger_id and retire_for is not None and retire_for > 0:
            retired.append(Retired(self.ledger, time.time() + retire_for))
        return Pointer(ledger_id, epoch, tuple(retired))

    def without(self, topic: str, ids: set[int], epoch: int) -> Pointer:
        """This pointer with ``ids`` off its retired list, as a writer of ``epoch`` writes it.

        :raises Fenced: this pointer names a higher epoch.
        """
        self._check_epoch(topic, epoch, "its retired ledgers are not swept")
        return Pointer(self.ledger, epoch, tuple(r for r in self.retired if r.id not in ids))

    def taken(self, epoch: int) -> Pointer:
        """This pointer as a writer that took its topic with ``epoch`` writes it: the same ledgers, that epoch."""
        return Pointer(self.ledger, epoch, self.retired)

    def _check_epoch(self, topic: str, epoch: int, consequence: str) -> None:
        if self.epoch > epoch:
            raise Fenced(
                f"the pointer of topic {topic!r} was written by a daemon of epoch {self.epoch}, above this one's "
                f"({epoch}): another daemon took the root over; {consequence}", topic=topic, epoch=self.epoch)

    def to_bytes(self) -> bytes:
        body = {"ledger": self.ledger, "epoch": self.epoch, "retired": [r.to_json() for r in self.retired]}
        return json.dumps(body, separators=(", ", ": ")).encode() + b"\n"


def read_pointer(objects: ObjectStore, topic: str) -> Pointer:
    """The topic's pointer (``Pointer(None)`` if it has none).

    :raises LedgerCorrupt: ``CURRENT`` holds neither form.
    """
    key = layout.pointer_key(topic)
    info = objects.head(key)
    if info is None:
        return Pointer(None)
    try:
        data = objects.get(key)
    except ObjectNotFound:
        return Pointer(None)
    # The version read with ``head`` may be older than the bytes (a switch in between): a write against it
    # then fails its condition, which is what a stale reader must see.
    return parse_pointer(data, topic, info.version)


class KnownPointers:
    """The pointers a root's sole writer (a daemon holding its lease) last read or wrote, by topic: no other
    process writes them then, so a read of the view need not fetch ``CURRENT`` again (on an object store, a
    HEAD and a GET saved per read).

    A write bumps the topic's generation, and a read stores what it fetched only if no write came in between:
    a slow read never puts back a pointer that a switch replaced meanwhile.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[str, Pointer] = {}
        self._generation: dict[str, int] = {}
        self._handed = 0  # the last generation handed out, to any topic: none is handed out twice
        self._since = 0  # the generation of a topic not written since the last ``clear``

    def read(self, topic: str, fetch: Callable[[], Pointer]) -> Pointer:
        with self._lock:
            known, generation = self._known.get(topic), self._generation.get(topic, self._since)
        if known is not None:
            return known
        pointer = fetch()
        with self._lock:
            if self._generation.get(topic, self._since) == generation:
                self._known[topic] = pointer
        return pointer

    def generation(self, topic: str) -> int:
        """The topic's generation: it changes at each ``wrote`` of the topic and at each ``clear``, and never
        comes back to an earlier value."""
        with self._lock:
            return self._generation.get(topic, self._since)

    def wrote(self, topic: str, pointer: Pointer | None) -> None:
        """The topic's pointer is now ``pointer`` (None: unknown, fetched again at the next read)."""
        with self._lock:
            self._handed += 1
            self._generation[topic] = self._handed
            if pointer is None:
                self._known.pop(topic, None)
            else:
                self._known[topic] = pointer

    def clear(self) -> None:
        """Every pointer unknown (the store closed): each fetched again at its next read."""
        with self._lock:
            self._handed += 1
            self._since = self._handed
            self._generation.clear()
            self._known.clear()


def parse_pointer(data: bytes, topic: str, version: str | None) -> Pointer:
    """:raises LedgerCorrupt: ``data`` is neither ``ledger-<id>\\n`` nor the JSON pointer."""
    text = data.decode("utf-8", errors="replace")
    legacy = LEDGER_RE.fullmatch(text.rstrip("\n"))
    if legacy is not None and text.count("\n") <= 1:
        return Pointer(int(legacy.group(1)), version=version, legacy=True)
    try:
        body = json.loads(text)
        ledger, epoch = body["ledger"], body["epoch"]
        retired = tuple(Retired(_positive(r["id"]), _timestamp(r["until"])) for r in body["retired"])
        if not (_is_int(epoch) and epoch >= 0):
            raise ValueError(f"epoch {epoch!r} is not a non-negative integer")
        if ledger is None and epoch < 1:
            raise ValueError("a pointer that names no ledger records a writer's epoch (1 or more)")
        return Pointer(None if ledger is None else _positive(ledger), epoch, retired, version)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LedgerCorrupt(
            f"pointer {layout.pointer_key(topic)} of topic {topic!r} holds {text[:120]!r}: {exc}; expected "
            '{"ledger": <id or null>, "epoch": <n>, "retired": [...]} or one line \'ledger-<id>\'', topic=topic) from None


def write_pointer(objects: ObjectStore, topic: str, new: Pointer, base: Pointer) -> Pointer:
    """Write ``new`` only if the pointer is still ``base`` (its version); return ``new`` with its version.

    :raises Fenced: the pointer is no longer ``base``: another writer switched since.
    """
    key = layout.pointer_key(topic)
    try:
        if base.version is None:
            version = objects.put_if_absent(key, new.to_bytes())
        else:
            version = objects.put_if_match(key, new.to_bytes(), base.version)
    except PreconditionFailed as exc:
        raise Fenced(
            f"the pointer of topic {topic!r} changed since it was read (it named ledger {base.ledger}): another "
            f"writer switched; ledger {new.ledger} is not made current", topic=topic, ledger_id=new.ledger) from exc
    return replace(new, version=version)


def allocate_id(objects: ObjectStore, topic: str, used: list[int]) -> int:
    """Take the topic's next ledger id: above its last id, ``used`` (ids found under the topic) and the
    legacy root counter.

    :raises LedgerCorrupt: the last id or the legacy counter does not hold an integer.
    """
    legacy = _read_int(objects, LEGACY_SEQ_KEY) or 0
    return _advance(objects, layout.last_id_key(topic), lambda last: max([last or 0, legacy, *used]) + 1,
                    "advanced", topic)


def last_id(objects: ObjectStore, topic: str) -> int | None:
    """The topic's last ledger id as ``allocate_id`` counts from it (its record, or the legacy root counter if
    higher); None if neither exists.

    :raises LedgerCorrupt: either does not hold an integer.
    """
    found = [n for n in (_read_int(objects, layout.last_id_key(topic)), _read_int(objects, LEGACY_SEQ_KEY)) if n]
    return max(found, default=None)


def raise_last_id(objects: ObjectStore, topic: str, at_least: int) -> int:
    """Raise the topic's last ledger id to ``at_least`` unless it is higher (compare-and-swap); return it: a root
    the topic's ledgers were copied to never hands out an id they used.

    :raises LedgerCorrupt: the last id does not hold an integer.
    """
    return _advance(objects, layout.last_id_key(topic), lambda last: max(last or 0, at_least), "raised", topic)


def raise_epoch(objects: ObjectStore, above: int = 0) -> int:
    """Raise the root's writer epoch by one, and above ``above`` (compare-and-swap); return it: of writers racing,
    each gets its own.

    :raises LedgerCorrupt: ``@compactord/epoch`` does not hold an integer.
    """
    return _advance(objects, EPOCH_KEY, lambda current: max(current or 0, above) + 1, "raised")


def _advance(objects: ObjectStore, key: str, following: Callable[[int | None], int], verb: str,
             topic: str | None = None) -> int:
    """Write the integer object ``key`` as ``following(its value)`` (None: absent) by compare-and-swap, again
    while another writer advances it first; return the value written.

    :raises LedgerCorrupt: it does not hold an integer, or the store does not hold its conditions.
    """
    for _ in range(_CAS_ATTEMPTS):
        info = objects.head(key)
        value = following(_read_int(objects, key) if info is not None else None)
        try:
            if info is None:
                objects.put_if_absent(key, f"{value}\n".encode())
            else:
                objects.put_if_match(key, f"{value}\n".encode(), info.version)
            return value
        except PreconditionFailed:
            continue  # another writer advanced it: take the next one
    raise LedgerCorrupt(f"{objects.describe()}: {key} could not be {verb} in {_CAS_ATTEMPTS} conditional writes; "
                        "the store does not hold its conditions", topic=topic)


def expired(pointer: Pointer, now: float | None = None) -> list[int]:
    """The retired ledgers of ``pointer`` past their ``until``."""
    now = time.time() if now is None else now
    return [r.id for r in pointer.retired if r.until <= now]


def _read_int(objects: ObjectStore, key: str) -> int | None:
    try:
        text = objects.get(key).decode("ascii", errors="replace")
    except ObjectNotFound:
        return None
    if not text.strip().isdigit():
        raise LedgerCorrupt(f"{objects.describe()}: {key} holds {text[:40]!r}; expected an integer")
    return int(text)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive(value: object) -> int:
    if not _is_int(value) or value < 1:  # type: ignore[operator]
        raise ValueError(f"ledger id {value!r} is not a positive integer")
    return value  # type: ignore[return-value]


def _timestamp(value: object) -> float:
    if not isinstance(value, str):
        raise ValueError(f"until {value!r} is not a time")
    return datetime.fromisoformat(value).timestamp()
