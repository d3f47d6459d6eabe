"""Real daemons on one S3 root (the session's SeaweedFS) and its lease (storageLeaseSeconds=5): a second daemon
is refused while the first runs; a daemon killed and restarted takes its own stale lease over; a paused holder's
lease is taken over by another daemon, and once it runs again its switches are fenced while the new daemon's view
stays as it made it; a holder whose store stops answering for longer than the lease says compactions are not ready
and refuses triggers until its lease is renewed, then compacts again; a run whose lease lapses before its switch
fails naming it, in one line, and the previous ledger stays.

The module starts two daemons on one root, each through a fault-injecting proxy in front of the store (it relays
all until a test sets a fault): the first holds the lease, the second is refused, then takes the lease over from
the first when it is paused, and is the holder the outage and lapse tests fault. A task is held before its switch
by a gate file (``tests.support.probes.Gate``) only while the lapse test removes it."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compactord.ledger.lease import LEASE_KEY
from tests.support.daemon import DaemonProcess, compact, metric, status, wait_state
from tests.support.fault_proxy import FaultProxy
from tests.support.probes import GATE_ENV
from tests.support.s3_server import BUCKET
from tests.support.waiting import wait_for

from .conftest import PAUSING_FACTORY, assert_error

EXIT_CONFIG = 2
LEASE_S = 5
LEASE_NOT_HELD = "the ledger root's lease is not renewed yet (the store failed its renewals)"
# The holder's monitor compacts the "watched" topics past 10 records, every second (the outage test's).
WATCHED = "watched-[0-9]+-[0-9a-f]{6}"


def _root() -> str:
    return f"s3://{BUCKET}/lease-{uuid.uuid4().hex[:12]}"


class Pair:
    """The module's two daemons on one S3 root (through ``proxy``), and which of them holds its lease now."""

    def __init__(self, launch: Any, s3_server: Any, proxy: FaultProxy, gate: Path) -> None:
        self.root, self.proxy, self.gate = _root(), proxy, gate
        self.first = self._prepare(launch, s3_server, "lease-first")
        self.second = self._prepare(launch, s3_server, "lease-second")
        self.holder = self.first.start().wait_ready()

    def _prepare(self, launch: Any, s3_server: Any, name: str) -> DaemonProcess:
        # The store's default budgets: a write is retried for 60 s; only the lease's renewals give up sooner.
        conf = {**s3_server.daemon_conf(self.proxy.endpoint), "storageLeaseSeconds": str(LEASE_S),
                "compactionTopicsPattern": WATCHED, "compactionThresholdInMessages": 10,
                "brokerServiceCompactionMonitorIntervalInSeconds": 1,
                "compactionServiceFactoryClassName": PAUSING_FACTORY}
        daemon: DaemonProcess = launch.prepare(name, root=self.root, **conf)
        daemon.env[GATE_ENV] = f"written:{self.gate}"  # open unless a test removes the file
        return daemon


@pytest.fixture(scope="module")
def pair(launch: Any, s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    gate = tmp_path_factory.mktemp("lease-gate") / "open"
    gate.touch()
    with FaultProxy(int(s3_server.endpoint.rsplit(":", 1)[1])) as proxy:
        made = Pair(launch, s3_server, proxy, gate)
        try:
            yield made
        finally:
            for daemon in (made.first, made.second):  # while the proxy still relays their last requests
                daemon.stop()


@pytest.fixture(autouse=True)
def healed(pair: Pair) -> Iterator[None]:
    yield
    pair.proxy.heal()  # a failed test leaves no fault to the next
    pair.gate.touch()


def _view(daemon: DaemonProcess, topic: str) -> dict[bytes, bytes]:
    page = daemon.http.get(f"/v1/topics/{topic}/compacted", params={"partition": 0, "limit": 1000})
    assert page.status_code == 200, page.text
    return {base64.b64decode(e["key"]): base64.b64decode(e["value"]) for e in page.json()["entries"]}


@contextlib.contextmanager
def _paused(daemon: DaemonProcess) -> Iterator[None]:
    """SIGSTOP the daemon's process (not its JVM) and SIGCONT it at the end, also when the test fails."""
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(daemon.pid, signal.SIGCONT)


def test_a_second_daemon_exits_2_naming_the_holder_and_a_killed_one_restarted_takes_its_lease_over(
        pair: Pair, s3_server: Any) -> None:
    first, second, root = pair.holder, pair.second, pair.root
    assert first is pair.first, "the first daemon holds the lease until the next test pauses it"
    second.start()
    assert second.wait_exit(120) == EXIT_CONFIG, second.log_tail()
    refusals = [line for line in second.log_text().splitlines() if line.startswith("compactord: cannot start:")]
    assert len(refusals) == 1, second.log_tail()
    assert f"is held by another compactord (pid {first.pid} on host {socket.gethostname()}" in refusals[0]
    assert root in refusals[0]
    assert first.http.get("/readyz").json()["compactions"] is True  # the holder goes on

    # SIGKILLed, the holder leaves its lease; restarted (as systemd does), it takes it over at once.
    killed = first.pid
    first.kill_group()
    assert first.process is not None and first.process.wait(30) == -signal.SIGKILL
    lease = json.loads(s3_server.store(root.split("/", 3)[3]).get(LEASE_KEY))
    assert lease["holder"]["pid"] == killed
    first.start().wait_ready()
    assert f"at once: its holder (pid {killed} on host {socket.gethostname()}) no longer runs" in first.log_text()


def test_a_paused_holder_is_taken_over_and_then_fenced(pair: Pair, kafka: Any) -> None:
    old, new = pair.first, pair.second
    assert pair.holder is old and (new.process is None or new.process.poll() is not None)
    topic = kafka.topic(prefix="lease")
    kafka.produce(topic, [(f"k{i % 10}", f"old{i}") for i in range(50)])
    compact(old, topic)
    mark = len(new.log_text())
    with _paused(old):
        new.start().wait_ready()  # waits the lease out, then takes it
        pair.holder = new
        assert "did not change in 5 s" in new.log_text()[mark:]
        kafka.produce(topic, [(f"k{i}", f"new{i}") for i in range(10)])
        compact(new, topic)
    expected = {f"k{i}".encode(): f"new{i}".encode() for i in range(10)}
    assert _view(new, topic) == expected

    # Running again, the old holder finds its lease taken: it says so, and its switch is refused.
    wait_for(lambda: "another daemon took the ledger root's lease over"
             in old.http.get("/readyz").json()["problems"], 30, "the old holder to see its lease taken", old)
    assert "its lease was taken over by pid" in old.log_text()
    kafka.produce(topic, [(f"k{i}", f"late{i}") for i in range(10)])
    started = old.http.put(f"/v1/topics/{topic}/compaction")
    assert started.status_code == 202, started.text
    final = wait_state(old, topic, "Succeed", "Failed", "Cancelled")
    assert final["status"] == "ERROR" and "taken over" in (final["last_error"] or ""), final
    assert _view(new, topic) == expected  # the new daemon's view is intact
    assert compact(new, topic)["status"] == "SUCCESS"  # and it goes on compacting
    assert _view(new, topic) == {f"k{i}".encode(): f"late{i}".encode() for i in range(10)}
    old.stop()  # fenced: it writes nothing to the root any more; the next tests fault the new holder's store


def _readyz(daemon: DaemonProcess) -> tuple[int, dict[str, Any]]:
    with daemon.client(token=None) as c:
        response = c.get("/readyz")
    return response.status_code, response.json()


def _refused_for(daemon: DaemonProcess, topic: str) -> float:
    """Trigger a compaction of ``topic``: it is refused 503 storage_unavailable naming the lease; return for how
    long the lease has gone unrenewed, as the refusal says."""
    body = assert_error(daemon.http.put(f"/v1/topics/{topic}/compaction"), 503, "storage_unavailable")
    found = re.search(r"the ledger root's lease has not been renewed for ([0-9.]+) s \(storageLeaseSeconds=5\)",
                      body["message"])
    assert found is not None, body
    return float(found.group(1))


@pytest.mark.slow
def test_after_an_outage_longer_than_the_lease_compactions_wait_until_the_lease_is_held_again(
        pair: Pair, kafka: Any, s3_server: Any) -> None:
    daemon, proxy = pair.holder, pair.proxy
    direct = s3_server.store(pair.root.split("/", 3)[3])  # the lease as the store has it, not through the proxy
    mark = len(daemon.log_text())
    watched = kafka.topic(prefix="watched")
    topic = kafka.topic(prefix="outage")
    kafka.produce(topic, [(f"k{i % 10}", f"old{i}") for i in range(50)])
    compact(daemon, topic)
    renewed = direct.head(LEASE_KEY)
    assert renewed is not None

    # The store stops answering: requests hang, and those sent meanwhile are never answered, even after.
    proxy.partition()
    wait_for(lambda: LEASE_NOT_HELD in _readyz(daemon)[1]["problems"], 60, "/readyz to name the lease", daemon)
    assert _readyz(daemon)[1]["compactions"] is False
    assert_error(daemon.http.put(f"/v1/topics/{topic}/compaction"), 503, "storage_unavailable")
    # A read finds the store down (if nothing of the daemon's had yet).
    page = daemon.http.get(f"/v1/topics/{topic}/compacted", params={"partition": 0})
    assert_error(page, 503, "storage_unavailable")

    # The store answers again, all but the lease's renewals: it serves reads, and compactions are not ready.
    proxy.refuse(500, matching="compactord/lease")
    proxy.rejoin()
    _code, ready = wait_for(lambda: (r := _readyz(daemon))[0] == 200 and r, 60, "/readyz to serve reads", daemon)
    assert "the ledger root's store answers again" in daemon.log_text()[mark:]
    assert ready["reads"] is True and ready["compactions"] is False and ready["status"] == "degraded", ready
    assert ready["problems"] == [LEASE_NOT_HELD], ready
    # Each trigger is refused at once, naming the lease, until it has gone unrenewed past its time.
    wait_for(lambda: _refused_for(daemon, topic) > LEASE_S, 60, "the lease to go unrenewed past its time", daemon)
    assert _readyz(daemon)[1]["problems"] == [LEASE_NOT_HELD]
    assert direct.head(LEASE_KEY) == renewed  # nothing renewed it
    # The monitor starts no run meanwhile: passes go by, the watched topic's backlog past its threshold.
    kafka.produce(watched, [(f"k{i % 10}", f"v{i}") for i in range(50)])
    passes = metric(daemon, "compactord_monitor_runs_total", result="ok") or 0.0
    wait_for(lambda: (metric(daemon, "compactord_monitor_runs_total", result="ok") or 0.0) >= passes + 2, 60,
             "two passes of the monitor", daemon)
    assert status(daemon, watched)["status"] == "NOT_RUN", status(daemon, watched)

    # Renewals pass again: compactions are ready only once the lease is renewed, and the next one succeeds.
    proxy.heal()
    wait_for(lambda: _readyz(daemon)[1]["compactions"], 60, "/readyz to say compactions are ready", daemon)
    now = direct.head(LEASE_KEY)
    assert now is not None and now.version != renewed.version, now
    assert wait_state(daemon, watched, "Succeed", "Failed", "Cancelled")["status"] == "SUCCESS"  # the monitor's
    kafka.produce(topic, [(f"k{i}", f"new{i}") for i in range(10)])
    compact(daemon, topic)
    assert _view(daemon, topic) == {f"k{i}".encode(): f"new{i}".encode() for i in range(10)}
    log = daemon.log_text()[mark:]  # this test's part of the holder's log
    assert "the lease of ledger root" in log and "is renewed again" in log
    assert log.count("was not renewed (tried again every 1 s)") == 1, daemon.log_tail()
    # The refused triggers are no failures of the store: it went down once (the read), and came back once.
    assert log.count("the ledger root's store does not answer (") == 1, daemon.log_tail()
    assert log.count("the ledger root's store answers again") == 1, daemon.log_tail()
    assert "/compaction failed" not in log, daemon.log_tail()
    assert "Traceback" not in log, daemon.log_tail()


@pytest.mark.slow
def test_a_run_whose_lease_lapses_before_its_switch_fails_naming_it_in_one_line(pair: Pair, kafka: Any) -> None:
    daemon, proxy = pair.holder, pair.proxy
    topic = kafka.topic(prefix="lapse")
    kafka.produce(topic, [(f"k{i % 10}", f"old{i}") for i in range(50)])
    compact(daemon, topic)
    view = _view(daemon, topic)
    kafka.produce(topic, [(f"k{i}", f"new{i}") for i in range(10)])
    mark = len(daemon.log_text())
    pair.gate.unlink()  # the next run is held once its ledger is written, before its switch
    started = daemon.http.put(f"/v1/topics/{topic}/compaction")
    assert started.status_code == 202, started.text
    wait_for(lambda: "held at test gate 'written'" in daemon.log_text()[mark:], 120,
             "the run to be held before its switch", daemon)
    proxy.refuse(500, matching="compactord/lease")  # the store answers all but the lease's renewals
    # The lease lapses (two thirds of LEASE_S after its last renewal): /readyz names it; then the run goes on.
    wait_for(lambda: LEASE_NOT_HELD in _readyz(daemon)[1]["problems"], 60, "the lease to lapse", daemon)
    pair.gate.touch()
    final = wait_state(daemon, topic, "Succeed", "Failed", "Cancelled")
    assert final["task_id"] == started.json()["task_id"]
    assert final["status"] == "ERROR" and "lease of ledger root" in (final["last_error"] or ""), final
    # Its ledger cannot be removed while the lease is not held: one line says so, no traceback.
    unused = "could not remove the unused ledger"
    wait_for(lambda: unused in daemon.log_text()[mark:], 60, "the unused ledger's line", daemon)
    lines = daemon.log_text()[mark:].splitlines()
    [at] = [i for i, line in enumerate(lines) if unused in line]
    assert final["task_id"] in lines[at] and "has not been renewed" in lines[at], lines[at]
    assert "Traceback" not in daemon.log_text()[mark:], lines[at:at + 5]
    # it did answer: only the lease failed
    assert "the ledger root's store does not answer" not in daemon.log_text()[mark:]

    proxy.heal()
    wait_for(lambda: _readyz(daemon)[1]["compactions"], 60, "/readyz to say compactions are ready", daemon)
    assert _view(daemon, topic) == view  # the previous ledger stayed
    compact(daemon, topic)
    assert _view(daemon, topic) == {f"k{i}".encode(): f"new{i}".encode() for i in range(10)}
