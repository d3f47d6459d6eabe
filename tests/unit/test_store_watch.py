"""The store watch on the session's SeaweedFS behind a fault-injecting proxy: a failure marks the store down and
starts the probes; a store that does not answer stays down (its probes time out); the first answered probe
brings it back and calls ``on_up``, whose failure is logged and leaves the store up."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from compactord.daemon.store_watch import PROBE_KEY, StoreWatch
from compactord.errors import StorageUnavailable
from tests.support.fault_proxy import FaultProxy
from tests.support.s3_server import S3Server
from tests.support.waiting import wait_for


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(int(s3_server.endpoint.rsplit(":", 1)[1])) as p:
        yield p


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def _watching(watch: StoreWatch, stop: threading.Event) -> None:
    threading.Thread(target=watch.run, args=(stop,), name="store-probe", daemon=True).start()


def test_a_failure_marks_the_store_down_until_a_probe_is_answered(s3_server: S3Server, proxy: FaultProxy,
                                                                 stop: threading.Event) -> None:
    store = s3_server.store(endpoint=proxy.endpoint, read_budget=0.5)
    caught_up: list[int] = []
    watch = StoreWatch(store, 1.5, on_up=lambda: caught_up.append(1))
    _watching(watch, stop)
    assert watch.problem() is None and proxy.requests == 0  # no probe while it answers
    proxy.hang()
    with pytest.raises(StorageUnavailable) as failed:
        store.get("absent")
    watch.failed(failed.value.message)
    assert watch.problem() == f"the ledger root's store does not answer: {failed.value.message}"
    # The probes run, and time out: still down.
    probe = PROBE_KEY.rpartition("/")[2]  # the key's last name: the proxy sees it URL-encoded
    wait_for(lambda: sum(line.startswith("HEAD ") and line.endswith(probe) for line in proxy.seen) >= 2, 30,
             "two probes of the hung store")
    assert watch.problem() is not None and not caught_up
    proxy.heal()
    wait_for(lambda: watch.problem() is None, 30, "a probe to be answered")
    wait_for(lambda: caught_up, 30, "on_up to be called")
    assert caught_up == [1] and watch.up


def test_a_catch_up_that_fails_leaves_the_store_up(s3_server: S3Server, stop: threading.Event,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    # A store that reads but refuses writes still serves the ledgers: what waited for it is logged.
    store = s3_server.store()
    attempts: list[int] = []

    def catch_up() -> None:
        attempts.append(1)
        raise StorageUnavailable("the run history cannot be written", store=store.describe())

    watch = StoreWatch(store, 3.0, on_up=catch_up)
    watch.failed("a ledger read failed")
    _watching(watch, stop)
    wait_for(lambda: watch.problem() is None, 30, "a probe to be answered")
    wait_for(lambda: "the run history cannot be written" in caplog.text, 30, "the catch-up's failure logged")
    assert attempts == [1] and watch.up
