"""The writer guard of a root a cluster's daemons share (``compactord/ledger/ownership.py``): two members in two
processes on one root, a local folder (shared by processes of one host) and a prefix of the session's S3 server."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from compactord.errors import ConditionalWriteNotAtomic, Fenced, LedgerCorrupt, LedgerRootClaimed
from compactord.ledger import layout
from compactord.ledger.ownership import OwnershipGuard
from compactord.ledger.pointer import EPOCH_KEY, Pointer, parse_pointer, read_pointer
from compactord.ledger.store import LedgerStore
from compactord.server import EXIT_CONFIG, refuse_start
from compactord.storage import ObjectStore, open_local
from tests.support.s3_server import S3Server
from tests.unit.ledger.members import Member, Refused

LEASE_S = 5.0  # storageLeaseSeconds' minimum: how long a member watches a single daemon's lease
CLUSTER = "blue"


@dataclass
class Root:
    text: str
    objects: ObjectStore

    def pointer(self, topic: str) -> Pointer:
        return read_pointer(self.objects, topic)

    def ledgers(self, topic: str) -> list[str]:
        return sorted(name.rstrip("/") for name in self.objects.children(layout.topic_prefix(topic))
                      if name.startswith("ledger-"))


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Root:
    if request.param == "local":
        return Root(str(tmp_path / "root"), open_local(tmp_path / "root"))
    server: S3Server = request.getfixturevalue("s3_server")
    objects = server.store()
    return Root(f"s3://{objects.bucket}/{objects.prefix}", objects)


@pytest.fixture
def members(root: Root) -> Iterator[Callable[..., Member]]:
    """Start a member process on the root (of ``cluster``, opened unless told); every one is stopped at the end."""
    started: list[Member] = []

    def start(cluster: str = CLUSTER, open_root: bool = True) -> Member:
        member = Member(root.objects, cluster, LEASE_S)
        started.append(member)
        if open_root:
            member("open")
        return member

    yield start
    for member in started:
        member.stop()


@pytest.fixture
def stores() -> Iterator[list[LedgerStore]]:
    """Stores a test opens in its own process, closed at its end."""
    opened: list[LedgerStore] = []
    yield opened
    for store in opened:
        store.close()


def test_a_new_owner_raises_the_epoch_and_the_previous_owners_switch_deletion_and_policies_are_fenced(
        root: Root, members: Callable[..., Member]) -> None:
    a, b = members(), members()
    first = a("take", "orders")
    assert root.pointer("orders") == Pointer(None, first, version=root.pointer("orders").version)  # no ledger yet
    assert a("begin", "orders") == 1 and a("commit", "orders") == 1
    stale = a("begin", "orders")  # A's next task reads its base, then B takes the topic over
    second = b("take", "orders")
    assert second > first == a("epoch", "orders")
    taken = root.pointer("orders")
    assert (taken.ledger, taken.epoch) == (1, second)  # B keeps the view A switched to
    with pytest.raises(Refused) as switch:
        a("commit", "orders")
    assert switch.value.code == "fenced"
    assert root.pointer("orders") == taken  # the pointer is B's, as B wrote it
    for refused in ("delete", "put_policies"):
        with pytest.raises(Refused) as write:
            a(refused, "orders")
        assert write.value.code == "fenced", refused
    assert root.pointer("orders") == taken and root.objects.head(layout.policies_key("orders")) is None
    assert root.objects.head(layout.deleting_key("orders")) is None
    newer = b("begin", "orders")
    assert newer not in (1, stale) and b("commit", "orders") == newer  # the new owner's ids go on past the old's
    b("put_policies", "orders")
    assert root.objects.head(layout.policies_key("orders")) is not None


def test_members_write_their_own_topics_freely_and_ids_never_collide(
        root: Root, members: Callable[..., Member]) -> None:
    a, b = members(), members()
    a("take", "orders")
    b("take", "payments")
    for _ in range(3):  # each topic's ids are its own: both go 1, 2, 3
        for member, topic in ((a, "orders"), (b, "payments")):
            ledger_id = member("begin", topic)
            assert member("commit", topic) == ledger_id
    assert [root.pointer(t).ledger for t in ("orders", "payments")] == [3, 3]
    assert root.ledgers("orders") == root.ledgers("payments") == ["ledger-1", "ledger-2", "ledger-3"]
    # an old and a new owner of one topic: every id either hands out is its own
    old = a("allocate", "orders", 2)
    b("take", "orders")
    new = b("allocate", "orders", 2)
    later = a("allocate", "orders", 2)  # the old owner, not yet told
    ids = old + new + later
    assert len(set(ids)) == len(ids) and min(ids) > 3, ids


def test_two_processes_allocating_ids_of_one_topic_at_once_never_share_one(tmp_path: Path) -> None:
    # The local root's conditional writes are decided atomically across processes (an flock around each); an S3
    # server that is not atomic under racing If-Match writes is named in docs/object-storage.md.
    objects = open_local(tmp_path / "root")
    pair = [Member(objects, CLUSTER, LEASE_S) for _ in range(2)]
    try:
        for member in pair:
            member("open")
        pair[0]("take", "orders")
        pair[1]("take", "orders")  # the first is a stale owner now, whose allocations still race the new one's
        for member in pair:
            member.send("allocate", "orders", 40)
        ids = [i for member in pair for i in member.answer("allocate")]
    finally:
        for member in pair:
            member.stop()
    assert len(ids) == 80 and len(set(ids)) == 80, sorted(ids)


def test_a_member_whose_membership_is_not_current_writes_nothing(root: Root, members: Callable[..., Member]) -> None:
    a = members()
    a("take", "orders")
    a("begin", "orders")
    assert a("sole_writer", "orders") is True
    a("membership", False)
    assert a("sole_writer", "orders") is False
    for operation in ("commit", "allocate", "put_policies", "take"):
        with pytest.raises(Refused) as refused:
            a(operation, "orders")
        assert refused.value.code == "fenced" and "membership" in str(refused.value), operation
    assert root.pointer("orders").ledger is None
    a("membership", True)
    assert a("begin", "orders") == 2 and a("commit", "orders") == 2
    a("release", "orders")
    with pytest.raises(Refused, match="not taken by this member"):
        a("begin", "orders")
    assert a("sole_writer", "orders") is False


def test_a_root_is_one_clusters_and_no_single_daemon_writes_it(
        root: Root, members: Callable[..., Member], stores: list[LedgerStore]) -> None:
    members("blue")
    assert json.loads(root.objects.get(layout.cluster_key())) == {"cluster": "blue"}
    other = members("green", open_root=False)
    with pytest.raises(Refused) as refused:
        other("open")
    assert refused.value.code == "ledger_root_claimed" and "'blue'" in str(refused.value)
    assert "clusterName=blue" in str(refused.value)
    members("blue")  # another member of the same cluster joins
    single = LedgerStore(root.text, root.objects, lease_seconds=LEASE_S)
    stores.append(single)
    with pytest.raises(LedgerRootClaimed, match="without clusterName may not write it") as claimed:
        single.open()
    assert claimed.value.details["cluster"] == "blue" and not single.guard.held
    assert refuse_start(claimed.value) == EXIT_CONFIG  # the daemon exits 2: the same start fails again
    assert root.objects.head(layout.lease_key()) is None  # a refused lease is given back


def test_a_root_a_single_daemon_writes_refuses_a_cluster_member(
        root: Root, members: Callable[..., Member], stores: list[LedgerStore]) -> None:
    single = LedgerStore(root.text, root.objects, lease_seconds=LEASE_S).open()
    stores.append(single)
    member = members(open_root=False)
    with pytest.raises(Refused) as refused:
        member("open")  # on S3 the lease is watched for its time, in which the daemon renews it
    assert refused.value.code == "ledger_root_claimed" and "single daemon" in str(refused.value)
    assert root.objects.head(layout.cluster_key()) is None  # the root stays the single daemon's
    single.close()
    single.open()  # and opens again after a restart


def test_a_pointer_another_write_replaced_behind_the_writers_back_fails_as_the_stores_fault(
        root: Root, stores: list[LedgerStore]) -> None:
    behind: list[Pointer] = []

    def double_winner(topic: str, written: Pointer) -> None:
        if behind:  # what a store that lets two racing conditional writes win leaves: the other's landed last
            root.objects.put(layout.pointer_key(topic), behind.pop().to_bytes())

    guard = OwnershipGuard(root.objects, root.text, CLUSTER, after_write=double_winner)
    store = LedgerStore(root.text, root.objects, recovery_per_second=0, guard=guard).open()
    stores.append(store)
    behind.append(Pointer(7, 1))  # a previous owner's switch, over the take's
    epoch = store.take("orders")
    assert epoch > 1 and root.pointer("orders").epoch == epoch  # taken again over what the store kept
    ledger_id, _ = store.allocate_ledger("orders")
    root.objects.put(f"{layout.ledger_prefix('orders', ledger_id)}manifest.json", b"{}")
    other = Pointer(9, epoch + 1)
    behind.append(other)
    with pytest.raises(ConditionalWriteNotAtomic, match="does not decide conditional writes atomically") as exc:
        store.switch("orders", ledger_id)
    assert exc.value.code == "store_not_atomic" and isinstance(exc.value, Fenced)
    assert (root.pointer("orders").ledger, root.pointer("orders").epoch) == (9, epoch + 1)
    assert store.current_ledger_id("orders") == 9  # what this store serves is the pointer's, not its own write


def test_recovering_a_taken_topic_cleans_that_topic_only(root: Root, members: Callable[..., Member]) -> None:
    a = members()
    for topic in ("orders", "payments"):
        a("take", topic)
        assert a("begin", topic) == 1 and a("commit", topic) == 1
        assert a("orphan", topic) == 2  # an interrupted run's ledger
    a.stop()  # the owner is gone
    b = members()
    b("take", "orders")  # recovers what A left of orders
    assert root.ledgers("orders") == ["ledger-1"]
    assert b("current", "payments") == 1  # read as it is: another member's to recover
    assert root.ledgers("payments") == ["ledger-1", "ledger-2"]


def test_a_deleted_topic_keeps_its_epoch_and_reads_as_no_ledger(root: Root, members: Callable[..., Member]) -> None:
    a, b = members(), members()
    a("take", "orders")
    a("begin", "orders")  # A's task began before the topic had a ledger: its switch would create the pointer
    epoch = b("take", "orders")
    assert b("begin", "orders") == 2 and b("commit", "orders") == 2
    b("delete", "orders")
    pointer = root.pointer("orders")
    assert (pointer.ledger, pointer.epoch, pointer.retired) == (None, epoch, ())
    assert root.ledgers("orders") == [] and root.objects.head(layout.deleting_key("orders")) is None
    with pytest.raises(Refused) as refused:
        a("commit", "orders")
    assert refused.value.code == "fenced" and root.pointer("orders") == pointer
    reader = LedgerStore(root.text, root.objects)  # not opened: a reader
    assert reader.current_ledger_id("orders") is None


def test_a_pointer_naming_no_ledger_records_an_epoch() -> None:
    assert parse_pointer(b'{"ledger": null, "epoch": 4, "retired": []}\n', "orders", "v") == Pointer(None, 4, (), "v")
    with pytest.raises(LedgerCorrupt, match="records a writer's epoch"):
        parse_pointer(b'{"ledger": null, "epoch": 0, "retired": []}\n', "orders", "v")


def test_each_take_raises_the_roots_epoch_so_a_single_daemon_opening_it_later_is_above_every_topic(
        root: Root, stores: list[LedgerStore]) -> None:
    guard = OwnershipGuard(root.objects, root.text, CLUSTER)
    store = LedgerStore(root.text, root.objects, recovery_per_second=0, guard=guard).open()
    stores.append(store)
    epochs = [store.take(topic) for topic in ("orders", "payments", "orders")]
    assert epochs == sorted(set(epochs)) and int(root.objects.get(EPOCH_KEY)) == epochs[-1]
    store.close()
    root.objects.delete(layout.cluster_key())  # the operator gives the root back to a single daemon
    single = LedgerStore(root.text, root.objects, lease_seconds=LEASE_S).open()
    stores.append(single)
    assert single.epoch > max(epochs)
