"""The writer guard (``compactord/ledger/guard.py``) through each of its backends: a local root's lock and an S3
root's lease, on a real folder and the session's real S3 server (the ``root`` fixture's params). A backend is
added by adding its param; the differences between backends are visible here, in one place."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from compactord.errors import LedgerRootLocked
from compactord.ledger.guard import LeaseGuard, LockGuard, WriterGuard, writer_guard
from compactord.ledger.pointer import EPOCH_KEY
from compactord.ledger.store import LedgerStore
from compactord.storage import ObjectStore, open_local
from tests.support.s3_server import S3Server

LEASE_S = 5.0  # storageLeaseSeconds' minimum
TOPICS = ("orders", "payments")


@dataclass
class Root:
    """A ledger root: its store, and how a LedgerStore names it."""

    text: str
    objects: ObjectStore
    sole_writer: bool  # whether its guard vouches that no other process writes its pointers meanwhile
    backend: type[WriterGuard]

    def guard(self) -> WriterGuard:
        return writer_guard(self.objects, Path(self.text), LEASE_S)


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Root]:
    if request.param == "local":
        yield Root(str(tmp_path / "root"), open_local(tmp_path / "root"), False, LockGuard)
    elif request.param == "s3":  # a fresh prefix of the session's SeaweedFS
        server: S3Server = request.getfixturevalue("s3_server")
        objects = server.store()
        yield Root(f"s3://{objects.bucket}/{objects.prefix}", objects, True, LeaseGuard)
    else:  # pragma: no cover - a new backend needs its fixture here
        raise AssertionError(f"no fixture for backend {request.param}")


@pytest.fixture
def guards() -> Iterator[list[WriterGuard]]:
    """The guards a test acquires, released at its end (also when it fails)."""
    taken: list[WriterGuard] = []
    yield taken
    for guard in taken:
        guard.release()


def test_the_store_picks_its_backend(root: Root) -> None:
    assert type(root.guard()) is root.backend


def test_a_guard_not_acquired_holds_nothing_and_fences_with_epoch_zero(root: Root) -> None:
    guard = root.guard()
    assert not guard.held and not guard.lost
    assert [guard.fence(topic) for topic in TOPICS] == [0, 0]
    for topic in TOPICS:
        guard.check(topic)  # a store that is only read asks nothing of it
        assert guard.sole_writer(topic) is False
    assert guard.overdue() is None and guard.problem() is None and guard.lease is None


def test_acquiring_raises_the_epoch_every_topic_is_fenced_with(root: Root, guards: list[WriterGuard]) -> None:
    guard = root.guard()
    guards.append(guard)
    guard.acquire()
    assert guard.held
    epoch = int(root.objects.get(EPOCH_KEY))
    assert [guard.fence(topic) for topic in TOPICS] == [epoch, epoch] and epoch >= 1
    for topic in TOPICS:
        guard.check(topic)
        assert guard.sole_writer(topic) is root.sole_writer
    assert guard.overdue() is None and guard.problem() is None and not guard.lost
    assert (guard.lease is not None) is (root.backend is LeaseGuard)
    guard.acquire()  # idempotent: held already, the epoch stays
    assert guard.fence(TOPICS[0]) == epoch == int(root.objects.get(EPOCH_KEY))


def test_a_second_writer_is_refused_while_the_first_holds_and_takes_over_at_once_after(
        root: Root, guards: list[WriterGuard]) -> None:
    first, second = root.guard(), root.guard()
    guards += [first, second]
    first.acquire()
    with pytest.raises(LedgerRootLocked, match="another compactord"):
        second.acquire()  # an S3 lease is watched for its time, in which its holder renews it
    assert not second.held and first.held
    first.release()
    first.release()  # idempotent
    assert not first.held
    second.acquire()
    assert second.held and second.fence(TOPICS[0]) == first.fence(TOPICS[0]) + 1


def test_every_pointer_write_carries_the_guards_fence(root: Root) -> None:
    store = LedgerStore(root.text, root.objects, lease_seconds=LEASE_S).open()
    try:
        assert store.guard.held and store.is_open
        for topic in TOPICS:
            store.ready(topic)  # recovered first, as a ledger's writer is after allocate_ledger
            store.objects.put(f"{topic}/ledger-1/manifest.json", b"{}")  # switch() asks only that it exists
            store.switch(topic, 1)
            assert store.pointer(topic).epoch == store.guard.fence(topic) == store.epoch
        assert store.sole_writer is root.sole_writer
    finally:
        store.close()
    assert not store.guard.held and not store.is_open
