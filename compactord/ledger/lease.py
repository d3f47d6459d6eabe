"""The lease of an object-store ledger root: one writer per root where there is no ``flock``.

``@compactord/lease`` is ``{"holder": {"pid", "host", "started_at_ms", "id", "space"}, "epoch", "renewed",
"seconds"}``, written only by ``put_if_absent`` and ``put_if_match``. Its holder rewrites it every third of
``seconds`` (``renewed`` + 1), so that its version changes while the holder lives.

A contender that finds a lease watches it on its own monotonic clock: a version that changes within
``seconds`` is a live holder (``LedgerRootLocked``); one that does not is taken over, by ``put_if_match`` on
the version seen. No two hosts' wall clocks are ever compared: only "did it change while I watched". A
holder on this host whose process is gone (same boot, same PID namespace) is taken over at once.

Taking the lease raises the root's writer epoch (``pointer.raise_epoch``): every switch writes its daemon's
epoch into the topic's ``CURRENT``, and ``Pointer.switched`` refuses a lower one, so an old holder that
wakes up is fenced on every topic the new one has switched. Before that, the old holder stops itself:
``check()`` fails once its last successful renewal is two thirds of ``seconds`` old, while a contender
waits a whole ``seconds`` from the first time it saw that renewal.

A renewal's requests have a budget of a third of ``seconds`` (``ObjectStore.within``): one hung on a store that stopped
answering must not keep the next from being tried once it answers again. After a failed renewal the next is tried
within a second, and until one succeeds ``overdue()`` says for how long it has not been (the daemon's readiness and
its trigger ask it). A renewal after a lapse is still safe: it is a ``put_if_match`` on the version this holder wrote
last, which fails (the lease is lost) if a contender took the lease over meanwhile.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

from compactord.errors import (
    CompactordError,
    Fenced,
    LedgerRootLocked,
    ObjectNotFound,
    PreconditionFailed,
    StorageUnavailable,
)
from compactord.ledger import layout
from compactord.ledger.pointer import raise_epoch
from compactord.storage import ObjectInfo, ObjectStore

__all__ = ["LEASE_KEY", "Holder", "Lease", "acquire", "check_free"]

log = logging.getLogger(__name__)

LEASE_KEY = layout.lease_key()
Clock = Callable[[], float]
# A switch is allowed until this share of the lease after the start of the last renewal that succeeded: a
# contender waits the whole lease from when it first saw that renewal, which leaves a third as margin.
_VALID_SHARE = 2 / 3
_RENEW_SHARE = 1 / 3
_WATCH_SHARE = 1 / 10
_RETRY_EVERY_S = 1.0  # between renewals that fail: the lease is held again within this of the store answering
# What a holder leaves if it could not delete its lease at its release: free at once.
_RELEASED = b'{"released": true}'


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a lease. ``space`` (this boot and PID namespace) tells whether ``pid`` can be looked up here."""

    pid: int
    host: str
    started_at_ms: int
    id: str
    space: str = ""

    @classmethod
    def this_process(cls) -> Holder:
        return cls(os.getpid(), socket.gethostname(), int(time.time() * 1000), uuid.uuid4().hex, _process_space())

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}"

    def is_dead_here(self) -> bool:
        """Whether this holder is a process of this host's boot and PID namespace that no longer runs."""
        if not self.space or self.space != _process_space() or self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False  # it runs, under another user
        return False


def _process_space() -> str:
    """This boot and PID namespace ("" where they cannot be read): a PID means the same process only within it."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as boot:
            return f"{boot.read().strip()}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def _body(holder: Holder, epoch: int, renewed: int, seconds: float) -> bytes:
    return json.dumps({"holder": asdict(holder), "epoch": epoch, "renewed": renewed, "seconds": seconds}).encode()


@dataclass(frozen=True, slots=True)
class _Seen:
    """A lease as read: its holder (None: none, or a body that does not parse: it can only be waited out),
    whether its holder released it, and the lease time its holder renews for (0: unknown)."""

    holder: Holder | None = None
    released: bool = False
    seconds: float = 0.0


def _peek(objects: ObjectStore) -> _Seen:
    try:
        data = objects.get(LEASE_KEY)
    except ObjectNotFound:
        return _Seen()
    if data == _RELEASED:
        return _Seen(released=True)
    try:
        body = json.loads(data)
        return _Seen(Holder(**body["holder"]), seconds=float(body["seconds"]))
    except (ValueError, TypeError, KeyError):
        log.warning("%s does not hold a lease compactord wrote; it is taken over once it stops changing",
                    objects.location(LEASE_KEY))
        return _Seen()


def _holder_of(objects: ObjectStore) -> Holder | None:
    return _peek(objects).holder


def _locked(objects: ObjectStore, holder: Holder | None, why: str) -> LedgerRootLocked:
    who = holder.describe() if holder is not None else "an unknown holder"
    return LedgerRootLocked(
        f"ledger root {objects.describe()} is held by another compactord ({who}, see "
        f"{objects.location(LEASE_KEY)}): {why}; only one daemon may write a root",
        root=objects.describe(), holder=asdict(holder) if holder is not None else {})


def _watch(objects: ObjectStore, seen: ObjectInfo, lease_seconds: float, clock: Clock,
           sleep: Callable[[float], object]) -> ObjectInfo | None:
    """Re-read the lease until ``lease_seconds`` passed on our clock; return it as last read if it never changed
    or its holder released it (None: it went away). :raises LedgerRootLocked: its holder renewed it."""
    started = clock()
    while clock() - started < lease_seconds:
        sleep(min(lease_seconds * _WATCH_SHARE, max(0.0, lease_seconds - (clock() - started))))
        now = objects.head(LEASE_KEY)
        if now is None:
            return None
        if now.version != seen.version:
            lease = _peek(objects)
            if lease.released:
                return now
            raise _locked(objects, lease.holder, f"its lease was renewed within {lease_seconds:g} s")
    return seen


def _take(objects: ObjectStore, lease_seconds: float, clock: Clock,
          sleep: Callable[[float], object]) -> tuple[Holder, str]:
    """Create the lease, or take over one that is released, stale, or whose holder died on this host; return
    this process's holder and the lease's version."""
    me = Holder.this_process()
    first = _body(me, 0, 0, lease_seconds)
    info = objects.head(LEASE_KEY)
    if info is not None:
        lease = _peek(objects)
        if lease.released:
            log.info("ledger root %s: its last holder released its lease", objects.describe())
        elif lease.holder is not None and lease.holder.is_dead_here():
            log.warning("taking over the lease of ledger root %s at once: its holder (%s) no longer runs",
                        objects.describe(), lease.holder.describe())
        else:
            who = lease.holder.describe() if lease.holder is not None else "unknown holder"
            # A holder with a longer lease renews less often: watch for its time.
            watched = max(lease_seconds, lease.seconds)
            log.info("ledger root %s has a lease (%s); watching it for %g s", objects.describe(), who, watched)
            info = _watch(objects, info, watched, clock, sleep)
            if info is not None:
                log.warning("taking over the lease of ledger root %s: it did not change in %g s (%s)",
                            objects.describe(), watched, who)
    try:
        if info is None:
            return me, objects.put_if_absent(LEASE_KEY, first)
        return me, objects.put_if_match(LEASE_KEY, first, info.version)
    except PreconditionFailed as exc:
        raise _locked(objects, _holder_of(objects), "another daemon took its lease first") from exc


def acquire(objects: ObjectStore, lease_seconds: float, clock: Clock = time.monotonic,
            sleep: Callable[[float], object] = time.sleep) -> Lease:
    """Take the root's lease (watching one that is there for ``lease_seconds``, or the lease time its holder
    wrote if longer, before taking it over), raise the root's writer epoch,
    and start renewing; the returned lease carries the epoch.

    :raises LedgerRootLocked: a live daemon holds the root (its lease changed while watched, or it took the
        lease first).
    :raises StorageUnavailable: the store failed.
    """
    if not lease_seconds > 0:
        raise ValueError(f"lease_seconds must be positive, got: {lease_seconds!r}")
    me, version = _take(objects, lease_seconds, clock, sleep)
    try:
        epoch = raise_epoch(objects)
        started = clock()
        version = objects.put_if_match(LEASE_KEY, _body(me, epoch, 0, lease_seconds), version)
    except PreconditionFailed as exc:  # only by one who did not watch it (no compactord does)
        raise _locked(objects, _holder_of(objects), "it was taken from under this daemon") from exc
    except BaseException:
        _give_back(objects, version, lease_seconds)  # the next start need not wait it out
        raise
    lease = Lease(objects, me, epoch, version, lease_seconds, started, clock)
    log.info("took the lease of ledger root %s (epoch %d, renewed every %g s)", objects.describe(), epoch,
             lease_seconds * _RENEW_SHARE)
    return lease


def check_free(store: ObjectStore, lease_seconds: float) -> None:
    """Return if no daemon holds the root (no lease, or one that does not change while watched for
    ``lease_seconds``, or the lease time its holder wrote if longer); take nothing.

    :raises LedgerRootLocked: a daemon holds it (its lease changed while watched).
    """
    info = store.head(LEASE_KEY)
    if info is None:
        return
    lease = _peek(store)
    if lease.released or (lease.holder is not None and lease.holder.is_dead_here()):
        return
    _watch(store, info, max(lease_seconds, lease.seconds), time.monotonic, time.sleep)


class Lease:
    """A lease this process holds, renewed by a thread of its own until ``release()``."""

    def __init__(self, objects: ObjectStore, holder: Holder, epoch: int, version: str, seconds: float,
                 started: float, clock: Clock) -> None:
        self.objects, self.holder, self.epoch, self.seconds = objects, holder, epoch, seconds
        self._version, self._renewed, self._clock = version, 0, clock
        self._valid_until = started + seconds * _VALID_SHARE
        self._renewed_at = started
        self._lost: str | None = None  # why it is lost for good (taken over)
        self._problem = ""  # the last renewal's failure
        # A late answer to a renewal is worth nothing: the next one is due by then.
        self._renewing = objects.within(seconds * _RENEW_SHARE)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, name="lease-renewal", daemon=True)
        self._thread.start()

    @property
    def lost(self) -> bool:
        """Whether another daemon took the lease over (for good)."""
        return self._lost is not None

    def overdue(self) -> float | None:
        """The seconds since the start of the last renewal that succeeded, when that is too long for this
        process to write the root (two thirds of the lease: the store failed or did not answer the renewals
        since); None while it may write, and once the lease is lost or released for good (``lost``, ``check``).
        From memory only: the probes ask it."""
        if self._lost is not None or self._stop.is_set():
            return None
        now = self._clock()
        return now - self._renewed_at if now >= self._valid_until else None

    def check(self) -> None:
        """Return if this process may write the root now.

        :raises Fenced: another daemon took the lease over.
        :raises StorageUnavailable: the lease has not been renewed for too long (the store fails): a contender
            may take it over soon (``overdue``).
        """
        if self._lost is not None:
            raise Fenced(f"ledger root {self.objects.describe()}: {self._lost}; this daemon no longer writes it",
                         epoch=self.epoch)
        if self._stop.is_set():
            raise Fenced(f"ledger root {self.objects.describe()}: this daemon released its lease", epoch=self.epoch)
        overdue = self.overdue()
        if overdue is not None:
            raise StorageUnavailable(
                f"the lease of ledger root {self.objects.describe()} has not been renewed for {overdue:.1f} s "
                f"(lease {self.seconds:g} s; {self._problem or 'no answer yet'}): nothing is written to the root "
                "until it is, since another daemon may take it over")

    def renew(self) -> None:
        """Rewrite the lease once, within a third of the lease (the thread does this every third of the lease,
        and every second after a failure).

        :raises CompactordError: the store failed, or the lease is lost (then ``lost`` is true).
        """
        started = self._clock()
        body = _body(self.holder, self.epoch, self._renewed + 1, self.seconds)
        try:
            self._version = self._renewing.put_if_match(LEASE_KEY, body, self._version)
        except PreconditionFailed:
            if self._adopt(body):
                pass  # an earlier try of this renewal won; its answer was lost
            else:
                holder = _holder_of(self._renewing)
                self._lost = f"its lease was taken over by {holder.describe() if holder else 'another daemon'}"
                log.error("ledger root %s: %s; this daemon makes no more switches there", self.objects.describe(),
                          self._lost)
                raise
        self._renewed += 1
        self._renewed_at = started
        self._valid_until = started + self.seconds * _VALID_SHARE
        self._problem = ""

    def _adopt(self, body: bytes) -> bool:
        info = self._renewing.head(LEASE_KEY)
        if info is not None and self._renewing.get(LEASE_KEY) == body:
            self._version = info.version
            return True
        return False

    def _renew_loop(self) -> None:
        every = wait = self.seconds * _RENEW_SHARE
        failing_since: float | None = None  # while renewals fail: when the last one that succeeded started
        while not self._stop.wait(wait):
            last = self._renewed_at
            try:
                self.renew()
            except PreconditionFailed:
                return
            except Exception as exc:  # renewals go on for as long as the daemon runs
                self._problem = str(exc)
                wait = min(_RETRY_EVERY_S, every)
                if failing_since is not None:
                    log.debug("the lease of ledger root %s was not renewed again: %s", self.objects.describe(), exc)
                    continue
                failing_since = last
                log.warning("the lease of ledger root %s was not renewed (tried again every %g s): %s",
                            self.objects.describe(), wait, exc, exc_info=not isinstance(exc, CompactordError))
                continue
            wait = every
            if failing_since is not None:
                log.info("the lease of ledger root %s is renewed again, %.1f s after its last renewal",
                         self.objects.describe(), self._renewed_at - failing_since)
                failing_since = None

    def release(self) -> None:
        """Stop renewing and remove the lease if it is still this process's (best effort), so that the next
        daemon starts at once (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        if self._lost is not None:
            return
        _give_back(self.objects, self._version, self.seconds)


def _give_back(objects: ObjectStore, version: str, seconds: float) -> None:
    """Remove a lease this process holds at ``version`` (best effort)."""
    try:
        # Rewriting it proves it is still ours; no contender takes a lease within a lease of a change.
        objects.put_if_match(LEASE_KEY, _RELEASED, version)
        objects.delete(LEASE_KEY)
    except CompactordError as exc:
        log.warning("the lease of ledger root %s was not released (%s): the next daemon may wait %g s for it",
                    objects.describe(), exc, seconds)
