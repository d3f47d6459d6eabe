"""The lease of an object-store ledger root, on the session's real S3 server (SeaweedFS): taken on an empty root,
refused while its holder renews it, taken over once it stops changing (the epoch rising, the old holder fenced),
switches stopped when renewals fail, released for the next holder at once; and ``check_free``."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, replace

import pytest

from compactord.errors import Fenced, LedgerCorrupt, LedgerRootLocked, StorageUnavailable
from compactord.ledger.lease import LEASE_KEY, Holder, Lease, acquire, check_free
from compactord.ledger.pointer import EPOCH_KEY, read_pointer, write_pointer
from compactord.ledger.store import LedgerStore
from compactord.storage.s3 import S3Store
from tests.support.fault_proxy import FaultProxy
from tests.support.s3_server import S3Server
from tests.support.waiting import wait_for

LEASE_S = 5.0  # storageLeaseSeconds' minimum


def _no_wait(seconds: float) -> None:
    raise AssertionError(f"the lease was watched ({seconds:g} s sleep) where it should be taken at once")


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _write_lease(store: S3Store, holder: Holder, epoch: int = 0) -> None:
    body = {"holder": asdict(holder), "epoch": epoch, "renewed": 7, "seconds": LEASE_S}
    store.put(LEASE_KEY, json.dumps(body).encode())


def _elsewhere() -> Holder:
    """A holder on another host: only waiting tells whether it still runs."""
    return replace(Holder.this_process(), pid=4242, host="other-host.example")


@pytest.fixture
def leases() -> Iterator[list[Lease]]:
    """The leases a test takes, released at its end (also when it fails)."""
    taken: list[Lease] = []
    yield taken
    for lease in taken:
        lease.release()


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(int(s3_server.endpoint.rsplit(":", 1)[1])) as p:
        yield p


def test_acquire_on_an_empty_root_writes_the_lease_and_raises_the_epoch(s3_server: S3Server,
                                                                        leases: list[Lease]) -> None:
    store = s3_server.store()
    lease = acquire(store, LEASE_S, sleep=_no_wait)
    leases.append(lease)
    body = json.loads(store.get(LEASE_KEY))
    assert body["holder"]["pid"] == os.getpid() and body["holder"]["host"] == socket.gethostname()
    assert body["epoch"] == lease.epoch == int(store.get(EPOCH_KEY)) == 1
    assert body["seconds"] == LEASE_S and body["holder"]["id"] == lease.holder.id
    lease.check()
    before = store.head(LEASE_KEY)
    lease.renew()
    assert json.loads(store.get(LEASE_KEY))["renewed"] == body["renewed"] + 1
    assert store.head(LEASE_KEY).version != before.version  # type: ignore[union-attr]


def test_a_second_acquire_is_refused_naming_the_holder_while_the_first_renews(s3_server: S3Server,
                                                                             leases: list[Lease]) -> None:
    store = s3_server.store()
    leases.append(acquire(store, LEASE_S))
    with pytest.raises(LedgerRootLocked) as refused:
        acquire(s3_server.store(store.prefix), LEASE_S)
    message = str(refused.value)
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in message and store.describe() in message
    assert refused.value.details["holder"]["id"] == leases[0].holder.id
    assert json.loads(store.get(LEASE_KEY))["holder"]["id"] == leases[0].holder.id  # the holder kept it


def test_a_holder_with_a_longer_lease_is_watched_for_its_time(s3_server: S3Server, leases: list[Lease]) -> None:
    store = s3_server.store()
    leases.append(acquire(store, 4 * LEASE_S))  # renews every 6.7 s: longer than this contender's lease
    with pytest.raises(LedgerRootLocked, match="renewed within 20 s"):
        acquire(s3_server.store(store.prefix), LEASE_S)
    assert json.loads(store.get(LEASE_KEY))["holder"]["id"] == leases[0].holder.id


def test_a_lease_that_stops_changing_is_taken_over_and_the_epoch_rises(
        s3_server: S3Server, leases: list[Lease], caplog: pytest.LogCaptureFixture) -> None:
    store = s3_server.store()
    store.put(EPOCH_KEY, b"3\n")
    _write_lease(store, _elsewhere(), epoch=3)  # a daemon on another host that died
    with caplog.at_level(logging.INFO, logger="compactord.ledger.lease"):
        lease = acquire(store, LEASE_S)
    leases.append(lease)
    assert lease.epoch == 4 == int(store.get(EPOCH_KEY))
    assert json.loads(store.get(LEASE_KEY))["holder"]["id"] == lease.holder.id
    assert "did not change in 5 s (pid 4242 on host other-host.example)" in caplog.text


def test_after_a_takeover_the_old_holder_is_fenced(s3_server: S3Server, proxy: FaultProxy) -> None:
    """The old holder's store goes through a proxy that fails while it is paused: the new one takes over."""
    prefix = s3_server.store().prefix
    old = LedgerStore(f"s3://x/{prefix}", s3_server.store(prefix, endpoint=proxy.endpoint, read_budget=0.5,
                                                          write_budget=0.5), lease_seconds=LEASE_S).open()
    new = LedgerStore(f"s3://x/{prefix}", s3_server.store(prefix), lease_seconds=LEASE_S)
    try:
        proxy.fail(10**6)
        new.open()  # waits out the old lease
        assert new.epoch == old.epoch + 1
        proxy.heal()
        old_lease = old.guard.lease
        assert old_lease is not None
        wait_for(lambda: old_lease.lost, 3 * LEASE_S, "the old holder to find its lease taken over")
        with pytest.raises(Fenced, match="taken over by pid"):
            old_lease.check()
        topic = "fenced-topic"
        new.ready(topic)  # recovered first, as a ledger's writer is after allocate_ledger
        new.objects.put(f"{topic}/ledger-1/manifest.json", b"{}")  # switch() asks only that it exists
        new.switch(topic, 1)
        with pytest.raises(Fenced, match="taken over"):
            old.switch(topic, 1)
        with pytest.raises(Fenced, match="taken over"):
            old.delete_topic(topic)
        # Without its lease's check, the old epoch is refused by the pointer the new holder switched.
        base = read_pointer(old.objects, topic)
        with pytest.raises(Fenced, match="another daemon took the root over"):
            write_pointer(old.objects, topic, base.switched(topic, 2, old.epoch, None), base)
        assert new.pointer(topic).ledger == 1 and new.pointer(topic).epoch == new.epoch
        new.guard.lease.check()  # type: ignore[union-attr]
    finally:
        old.close()
        new.close()
    assert s3_server.store(prefix).head(LEASE_KEY) is None  # the new holder released it; the old one left it


def test_failing_renewals_stop_switches_before_the_lease_could_expire(s3_server: S3Server, proxy: FaultProxy,
                                                                      leases: list[Lease]) -> None:
    clock = ManualClock()
    store = s3_server.store(endpoint=proxy.endpoint, read_budget=0.5, write_budget=0.5)
    lease = acquire(store, LEASE_S, clock=clock)
    leases.append(lease)
    proxy.fail(10**6)  # the store answers nothing but errors from now on
    with pytest.raises(StorageUnavailable):
        lease.renew()
    clock.now += LEASE_S * 0.6
    lease.check()  # still within two thirds of the lease since the last renewal
    clock.now += LEASE_S * 0.1
    with pytest.raises(StorageUnavailable, match="has not been renewed for 3.5 s"):
        lease.check()
    # A contender waits the whole lease from the moment it saw that renewal: this holder stopped before.
    assert clock.now - 1000.0 < LEASE_S
    assert not lease.lost


def test_a_lease_unrenewed_through_an_outage_longer_than_it_is_renewed_once_the_store_answers(
        s3_server: S3Server, proxy: FaultProxy, leases: list[Lease], caplog: pytest.LogCaptureFixture) -> None:
    # The store's own budgets (a write retried for 60 s): only the renewal's are cut to a third of the lease.
    store = s3_server.store(endpoint=proxy.endpoint)
    direct = s3_server.store(store.prefix)
    with caplog.at_level(logging.INFO, logger="compactord.ledger.lease"):
        lease = acquire(store, LEASE_S)
        leases.append(lease)
        before = direct.head(LEASE_KEY)
        assert lease.overdue() is None
        # Requests hang, and those sent during the partition are never answered, even once it ends.
        proxy.partition()
        wait_for(lambda: (lease.overdue() or 0.0) > LEASE_S, 6 * LEASE_S, "the lease to go unrenewed past its time")
        with pytest.raises(StorageUnavailable, match="has not been renewed for") as refused:
            lease.check()
        assert "failed" in str(refused.value), refused.value  # renewals gave up: none hangs on
        proxy.rejoin()
        wait_for(lambda: lease.overdue() is None, 6 * LEASE_S, "the lease to be renewed once the store answers")
    lease.check()
    assert not lease.lost
    after = direct.head(LEASE_KEY)
    assert after is not None and before is not None and after.version != before.version
    body = json.loads(direct.get(LEASE_KEY))
    assert body["holder"]["id"] == lease.holder.id and body["epoch"] == lease.epoch
    # One line when renewals start failing, one when one succeeds again; no traceback.
    lines = [r for r in caplog.records if r.name == "compactord.ledger.lease"]
    failed = [r for r in lines if "was not renewed" in r.getMessage()]
    renewed = [r for r in lines if "is renewed again" in r.getMessage()]
    assert len(failed) == 1 and failed[0].levelno == logging.WARNING and not failed[0].exc_info, lines
    assert len(renewed) == 1 and renewed[0].levelno == logging.INFO, lines


def test_release_lets_the_next_holder_acquire_at_once(s3_server: S3Server, leases: list[Lease]) -> None:
    store = s3_server.store()
    first = acquire(store, LEASE_S)
    first.release()
    assert store.head(LEASE_KEY) is None
    with pytest.raises(Fenced, match="released"):
        first.check()
    leases.append(acquire(store, LEASE_S, sleep=_no_wait))
    assert leases[0].epoch == first.epoch + 1


def test_a_lease_taken_by_a_start_that_fails_is_given_back(s3_server: S3Server) -> None:
    store = s3_server.store()
    store.put(EPOCH_KEY, b"not a number\n")
    with pytest.raises(LedgerCorrupt, match="expected an integer"):
        acquire(store, LEASE_S)
    assert store.head(LEASE_KEY) is None


def test_a_lease_left_released_is_taken_at_once(s3_server: S3Server, leases: list[Lease]) -> None:
    store = s3_server.store()
    store.put(LEASE_KEY, b'{"released": true}')  # a holder whose delete failed at its release
    leases.append(acquire(store, LEASE_S, sleep=_no_wait))
    assert json.loads(store.get(LEASE_KEY))["holder"]["id"] == leases[0].holder.id


def test_a_holder_on_this_host_that_no_longer_runs_is_taken_over_at_once(
        s3_server: S3Server, leases: list[Lease], caplog: pytest.LogCaptureFixture) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    store = s3_server.store()
    _write_lease(store, replace(Holder.this_process(), pid=int(gone.stdout)))
    with caplog.at_level(logging.WARNING, logger="compactord.ledger.lease"):
        leases.append(acquire(store, LEASE_S, sleep=_no_wait))
    assert f"at once: its holder (pid {int(gone.stdout)} on host {socket.gethostname()}) no longer runs" in caplog.text


def test_check_free(s3_server: S3Server, leases: list[Lease]) -> None:
    store = s3_server.store()
    check_free(store, LEASE_S)  # no lease
    leases.append(acquire(store, LEASE_S))
    with pytest.raises(LedgerRootLocked, match=f"pid {os.getpid()}"):
        check_free(s3_server.store(store.prefix), LEASE_S)
    leases.pop().release()
    check_free(store, LEASE_S)  # released
    stale = s3_server.store()
    _write_lease(stale, _elsewhere())
    check_free(stale, LEASE_S)  # not renewed while watched
    assert stale.head(LEASE_KEY) is not None  # check_free takes nothing
