"""A daemon on an S3 root whose store misbehaves (the session's SeaweedFS behind a fault-injecting proxy): a
hung store makes the ledger reads answer 503 storage_unavailable, at once once it is known to be down, and
/readyz say ``"reads": false``, until a probe finds it answering again (no restart); throttling and a reset
upload are retried; a compaction whose writes cannot finish fails with storage_unavailable, and the previous
ledger is what is served once the store is back, the failed run's objects gone after the next start."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compactord.daemon.store_watch import PROBE_KEY
from tests.support.daemon import DaemonProcess, compact, metric, metric_samples, wait_state
from tests.support.fault_proxy import FaultProxy
from tests.support.waiting import wait_for

from .conftest import assert_error

pytestmark = pytest.mark.slow

DOWN = "the ledger root's store does not answer"


@pytest.fixture(scope="module")
def proxy(s3_proxy: FaultProxy) -> FaultProxy:
    return s3_proxy


@pytest.fixture(scope="module")
def gates(s3_gates: dict[str, Path]) -> dict[str, Path]:
    return s3_gates


@pytest.fixture(scope="module")
def daemon(s3_daemon: DaemonProcess) -> DaemonProcess:
    """The package's S3 daemon (storageWriteRetrySeconds=3), through ``proxy``, its runs passing ``gates``."""
    return s3_daemon


@pytest.fixture(autouse=True)
def healed(proxy: FaultProxy, gates: dict[str, Path]) -> Iterator[None]:
    yield
    proxy.heal()  # a failed test leaves no fault to the next
    for gate in gates.values():
        gate.touch()


def _view(daemon: DaemonProcess, topic: str) -> dict[bytes, bytes]:
    page = daemon.http.get(f"/v1/topics/{topic}/compacted", params={"partition": 0, "limit": 1000})
    assert page.status_code == 200, page.text
    return {base64.b64decode(e["key"]): base64.b64decode(e["value"]) for e in page.json()["entries"]}


def _readyz(daemon: DaemonProcess) -> tuple[int, dict[str, Any]]:
    with daemon.client(token=None) as c:
        response = c.get("/readyz")
    return response.status_code, response.json()


def _holds(daemon: DaemonProcess, point: str) -> int:
    """How many times tasks have been held at ``point``'s gate (counted over the daemon's log)."""
    return daemon.log_text().count(f"held at test gate {point!r}")


def _held_at(daemon: DaemonProcess, point: str, times: int) -> None:
    """Wait until tasks have been held at ``point`` ``times`` times in all."""
    wait_for(lambda: _holds(daemon, point) >= times, 120, f"a task to be held at {point!r} ({times} in all)", daemon)


def _requests(daemon: DaemonProcess) -> float:
    return sum(value for name, _, value in metric_samples(daemon) if name == "compactord_storage_requests_total")


def _compacted(daemon: DaemonProcess, kafka: Any, prefix: str, n: int = 200) -> str:
    topic = kafka.topic(prefix=prefix)
    kafka.produce(topic, [(f"k{i % 40}", f"v{i}") for i in range(n)])
    compact(daemon, topic)
    return topic


def test_a_hung_store_is_answered_at_once_while_down_and_served_again_once_back(
        daemon: DaemonProcess, kafka: Any, proxy: FaultProxy) -> None:
    topic = _compacted(daemon, kafka, "hung")
    view = _view(daemon, topic)
    ledger_id = daemon.http.get(f"/v1/topics/{topic}/horizon").json()["ledger_id"]
    page = f"/v1/topics/{topic}/compacted"
    proxy.hang()
    # The first read waits out the read budget, fails, and marks the store down.
    assert_error(daemon.http.get(page, params={"partition": 0}), 503, "storage_unavailable")
    code, ready = _readyz(daemon)
    assert code == 503 and ready["reads"] is False and ready["compactions"] is False, ready
    assert DOWN in ready["problems"] and ready["error"] == "not_ready", ready
    assert metric(daemon, "compactord_storage_up") == 0

    # While it is down, no read reaches the store: each is answered from what the watch knows.
    seen = len(proxy.seen)
    for path, params in ((page, {"partition": 0}), (f"{page}/last", {"partition": 0}),
                         (page, {"partition": 0, "ledger_id": ledger_id}), (f"/v1/topics/{topic}/horizon", {}),
                         (f"/v1/topics/{topic}/history", {})):
        body = assert_error(daemon.http.get(path, params=params), 503, "storage_unavailable")
        assert "store does not answer" in body["message"], body
    assert_error(daemon.http.put(f"/v1/topics/{topic}/compaction"), 503, "storage_unavailable")
    # The policies are not unreadable (nothing to replace or remove): the store is down, answered at once.
    for method, body in (("GET", None), ("PUT", {"thresholdMessages": 5}), ("DELETE", None)):
        response = daemon.http.request(method, f"/v1/topics/{topic}/policies", json=body)
        assert "PUT" not in assert_error(response, 503, "storage_unavailable")["message"], method
    during = proxy.seen[seen:]
    assert not [line for line in during if f"/{topic}/" in line], during
    # ... and the watch probes it meanwhile.
    probe = PROBE_KEY.rpartition("/")[2]  # the key's last name: the proxy sees it URL-encoded
    wait_for(lambda: any(line.startswith("HEAD ") and line.endswith(probe) for line in proxy.seen[seen:]), 30,
             "a probe of the store")
    assert "the ledger root's store does not answer" in daemon.log_text()

    proxy.heal()
    wait_for(lambda: (r := _readyz(daemon))[0] == 200 and r[1]["reads"] and r[1]["compactions"], 60,
             "/readyz to serve reads and compactions again", daemon)
    assert metric(daemon, "compactord_storage_up") == 1
    assert _view(daemon, topic) == view
    assert daemon.log_text().count("the ledger root's store answers again") >= 1


def test_throttling_shorter_than_the_budgets_is_retried(daemon: DaemonProcess, kafka: Any,
                                                       proxy: FaultProxy, gates: dict[str, Path]) -> None:
    topic = kafka.topic(prefix="throttled")
    kafka.produce(topic, [(f"k{i % 40}", f"v{i}") for i in range(200)])
    holds = _holds(daemon, "written")
    gates["written"].unlink()
    assert daemon.http.put(f"/v1/topics/{topic}/compaction").status_code == 202
    _held_at(daemon, "written", holds + 1)
    # From here on, the driver alone asks the store (the new ledger's switch): each of its requests is
    # counted by the proxy and by the daemon's metric, the 503'd one and its retry included.
    faulted, seen, counted = len(proxy.faulted), len(proxy.seen), _requests(daemon)
    proxy.fail(1, 503)
    gates["written"].touch()
    final = wait_state(daemon, topic, "Succeed", "Failed", "Cancelled")
    assert final["status"] == "SUCCESS", f"{final}\n{daemon.log_tail()}"
    [throttled] = proxy.faulted[faulted:]
    assert proxy.seen[seen:].count(throttled) >= 2, proxy.seen[seen:]  # the request, then its retry
    asked = len(proxy.seen) - seen
    wait_for(lambda: _requests(daemon) - counted >= asked, 30,
             f"the metric to count the {asked} requests the proxy saw, the retry among them", daemon)
    assert _view(daemon, topic) == {f"k{k}".encode(): f"v{160 + k}".encode() for k in range(40)}


def test_a_reset_upload_is_retried_and_the_compaction_succeeds(daemon: DaemonProcess, kafka: Any,
                                                             proxy: FaultProxy, gates: dict[str, Path]) -> None:
    topic = kafka.topic(prefix="reset")
    kafka.produce(topic, [(f"k{i % 40}", f"v{i}") for i in range(200)])
    holds = _holds(daemon, "running")
    gates["running"].unlink()
    assert daemon.http.put(f"/v1/topics/{topic}/compaction").status_code == 202
    _held_at(daemon, "running", holds + 1)
    faulted, seen = len(proxy.faulted), len(proxy.seen)
    proxy.reset_uploads(1)  # the next request with a body (a part of the new ledger) is cut after 1 KiB
    gates["running"].touch()
    final = wait_state(daemon, topic, "Succeed", "Failed", "Cancelled")
    assert final["status"] == "SUCCESS", f"{final}\n{daemon.log_tail()}"
    [cut] = proxy.faulted[faulted:]
    assert cut.startswith("PUT ") and proxy.seen[seen:].count(cut) >= 2, proxy.seen[seen:]
    assert _view(daemon, topic) == {f"k{k}".encode(): f"v{160 + k}".encode() for k in range(40)}


def test_a_compaction_whose_writes_cannot_finish_fails_and_the_previous_ledger_stays_served(
        daemon: DaemonProcess, kafka: Any, proxy: FaultProxy, s3_server: Any, gates: dict[str, Path]) -> None:
    topic = _compacted(daemon, kafka, "down")
    view = _view(daemon, topic)
    horizon = daemon.http.get(f"/v1/topics/{topic}/horizon").json()
    kafka.produce(topic, [(f"k{i}", f"new{i}") for i in range(40)])
    holds = _holds(daemon, "running")
    gates["running"].unlink()
    assert daemon.http.put(f"/v1/topics/{topic}/compaction").status_code == 202
    _held_at(daemon, "running", holds + 1)
    proxy.refuse(500)  # longer than storageWriteRetrySeconds: every write of the run gives up
    gates["running"].touch()
    final = wait_state(daemon, topic, "Succeed", "Failed", "Cancelled")
    assert final["status"] == "ERROR" and "InternalError" in final["last_error"], final
    code, ready = _readyz(daemon)
    assert code == 503 and ready["reads"] is False and DOWN in ready["problems"], ready

    proxy.heal()
    wait_for(lambda: _readyz(daemon)[0] == 200, 60, "/readyz to serve reads again", daemon)
    assert daemon.http.get(f"/v1/topics/{topic}/horizon").json() == horizon
    assert _view(daemon, topic) == view
    # The run enters the history once the store answers.
    runs = wait_for(lambda: len(r := daemon.http.get(f"/v1/topics/{topic}/history").json()["runs"]) == 2 and r,
                    30, "the failed run in the history", daemon)
    [failed, succeeded] = runs
    assert failed["task_id"] == final["task_id"] and failed["error_type"] == "storage_unavailable", failed
    assert succeeded["state"] == "Succeed" and succeeded["ledger_after"] == horizon["ledger_id"], succeeded

    # The failed run's objects are gone after the next start: only the served ledger is under the topic.
    daemon.stop()
    restarted = daemon.start().wait_ready()
    assert _view(restarted, topic) == view
    prefix = str(daemon.root).split("/", 3)[3]
    ledgers = {key.split("/")[1] for key in (i.key for i in s3_server.store(prefix).list(f"{topic}/"))
               if key.split("/")[1].startswith("ledger-")}
    assert ledgers == {f"ledger-{horizon['ledger_id']}"}, ledgers
