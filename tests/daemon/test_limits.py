"""Bounded memory and connections (see #10), against a real daemon over HTTP: the byte bound of
a page of the compacted view, the bounds on requests (body size, time to send it, requests at once,
idle connections), each refusal in the API's JSON error shape; and no state kept for topics that do
not exist.

One daemon with small limits, started for this module.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, compact, metric_samples

from .conftest import Launcher, assert_error

pytestmark = pytest.mark.slow

READ_MAX_BYTES = 1000
MAX_REQUEST_BYTES = 2000
BODY_TIMEOUT_S = 2
MAX_IN_FLIGHT = 2
IDLE_TIMEOUT_S = 2
VALUE = b"v" * 300


@pytest.fixture(scope="module")
def daemon(launch: Launcher) -> DaemonProcess:
    return launch("limits", httpReadMaxBytes=READ_MAX_BYTES, httpMaxRequestBytes=MAX_REQUEST_BYTES,
                  httpRequestBodyTimeoutSeconds=BODY_TIMEOUT_S, httpMaxConnections=MAX_IN_FLIGHT,
                  httpIdleTimeoutSeconds=IDLE_TIMEOUT_S)


@pytest.fixture(scope="module")
def big_values(daemon: DaemonProcess, kafka: Any) -> str:
    """Partition 0: 10 keys of 4 bytes with values of 300 bytes (3 fit in 1000 bytes); partition 1: one
    entry of 5000 bytes, then a small one."""
    topic = kafka.topic(partitions=2, prefix="lim")
    kafka.produce(topic, [(f"k-{i:02d}", VALUE, 0) for i in range(10)]
                  + [("big", b"b" * 5000, 1), ("small", b"s", 1)])
    compact(daemon, topic)
    return topic


def pages(daemon: DaemonProcess, topic: str, partition: int, limit: int = 100) -> list[dict[str, Any]]:
    found, start = [], 0
    while start is not None:
        body = daemon.http.get(f"/v1/topics/{topic}/compacted",
                               params={"partition": partition, "start": start, "limit": limit}).json()
        found.append(body)
        start = body["next_start"]
        assert len(found) < 20, "next_start never became null"
    return found


# -- a page of the compacted view ----------------------------------------------------------------------

def test_a_page_stops_before_httpReadMaxBytes(daemon: DaemonProcess, big_values: str) -> None:
    read = pages(daemon, big_values, 0)
    assert [len(p["entries"]) for p in read] == [3, 3, 3, 1]  # 304 bytes an entry, 1000 a page
    assert [p["next_start"] for p in read] == [3, 6, 9, None]
    entries = [e for p in read for e in p["entries"]]
    assert [e["offset"] for e in entries] == list(range(10))
    assert {base64.b64decode(e["value"]) for e in entries} == {VALUE}
    # limit still bounds a page first
    two = daemon.http.get(f"/v1/topics/{big_values}/compacted", params={"partition": 0, "limit": 2}).json()
    assert len(two["entries"]) == 2 and two["next_start"] == 2


def test_an_entry_larger_than_the_bound_is_a_page_of_its_own(daemon: DaemonProcess, big_values: str) -> None:
    read = pages(daemon, big_values, 1)
    assert [[e["key"] for e in p["entries"]] for p in read] == [
        [base64.b64encode(b"big").decode()], [base64.b64encode(b"small").decode()]]
    assert [p["next_start"] for p in read] == [1, None]


# -- requests -----------------------------------------------------------------------------------------

@contextlib.contextmanager
def raw_connection(daemon: DaemonProcess) -> Iterator[socket.socket]:
    sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=60)
    try:
        yield sock
    finally:
        sock.close()


def read_answer(sock: socket.socket) -> tuple[int, bytes]:
    """The status and the body of the one answer on ``sock`` (the server closes the connection after it)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_a_body_over_httpMaxRequestBytes_is_413(daemon: DaemonProcess, kafka: Any) -> None:
    topic = kafka.topic(prefix="lim")
    big = {"strategy": "x" * MAX_REQUEST_BYTES}
    assert_error(daemon.http.put(f"/v1/topics/{topic}/policies", json=big), 413, "request_too_large")
    # without a Content-Length (chunked), the bound holds while the body arrives
    chunks = iter([b'{"strategy": "', b"x" * MAX_REQUEST_BYTES, b'"}'])
    response = daemon.http.put(f"/v1/topics/{topic}/policies", content=chunks,
                               headers={"Content-Type": "application/json"})
    assert_error(response, 413, "request_too_large")
    assert daemon.http.get(f"/v1/topics/{topic}/policies").json()["policies"]["strategy"] is None


def test_malformed_requests_answer_the_documented_json_error(daemon: DaemonProcess, kafka: Any) -> None:
    topic = kafka.topic(prefix="lim")
    nested = b"[" * 100_000 + b"]" * 100_000
    for body in (nested[:MAX_REQUEST_BYTES // 2] + nested[-MAX_REQUEST_BYTES // 2:], b'{"strategy": "\xff\xfe"}'):
        response = daemon.http.put(f"/v1/topics/{topic}/policies", content=body,
                                   headers={"Content-Type": "application/json"})
        assert_error(response, 400, "malformed_request")
    with raw_connection(daemon) as sock:  # a raw non-ASCII request target: refused by the HTTP parser
        sock.sendall("GET /v1/topics?q=\u00e9t\u00e9 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        status_code, body = read_answer(sock)
        assert status_code == 400 and json.loads(body)["error"] == "malformed_request", body
    assert_error(daemon.http.get("/v1/no-such-route"), 404, "not_found")
    assert_error(daemon.http.post("/healthz", json={}), 405, "method_not_allowed")


def test_slow_bodies_get_408_and_requests_past_the_bound_get_503(daemon: DaemonProcess) -> None:
    with raw_connection(daemon) as first, raw_connection(daemon) as second:
        for sock in (first, second):  # each holds a request in flight: its body never comes
            sock.sendall(b"PUT /v1/topics/some-topic/policies HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 10\r\n\r\n{")
        # Both are in flight once the server has taken their headers: until then a third may pass.
        with daemon.client() as c:
            for _ in range(200):
                response = c.get("/v1/tasks")
                if response.status_code == 503:
                    break
            busy = assert_error(response, 503, "server_busy")
            assert "httpMaxConnections=2" in busy["message"] and response.headers["Retry-After"] == "1"
            assert c.get("/healthz").status_code == 200  # probes are not counted
            assert c.get("/readyz").status_code == 200
        for sock in (first, second):
            status_code, body = read_answer(sock)
            assert status_code == 408, body
            assert b'"error":"request_timeout"' in body and b"httpRequestBodyTimeoutSeconds" in body
    assert daemon.http.get("/v1/tasks").status_code == 200  # both slots are free again


def test_past_the_connection_bound_the_answer_is_the_json_error(daemon: DaemonProcess) -> None:
    """uvicorn's own bound on connections (2 x httpMaxConnections + 50; idle ones count) answers the API's
    JSON error, not uvicorn's plain text."""
    bound = 2 * MAX_IN_FLIGHT + 50
    with contextlib.ExitStack() as stack:
        idle = [stack.enter_context(raw_connection(daemon)) for _ in range(bound)]
        extra = stack.enter_context(raw_connection(daemon))
        extra.sendall(b"GET /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        status_code, body = read_answer(extra)
        assert status_code == 503, body
        assert b'"error":"server_busy"' in body and b"connections" in body
        assert len(idle) == bound
    assert daemon.http.get("/v1/tasks").status_code == 200


def test_probes_answer_when_idle_connections_fill_the_connection_bound(daemon: DaemonProcess) -> None:
    bound = 2 * MAX_IN_FLIGHT + 50
    with contextlib.ExitStack() as stack:
        idle = [stack.enter_context(raw_connection(daemon)) for _ in range(bound + 20)]
        for path in ("/healthz", "/readyz", "/metrics"):
            probe = stack.enter_context(raw_connection(daemon))
            probe.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            status_code, body = read_answer(probe)
            assert status_code == 200, (path, body)
        api = stack.enter_context(raw_connection(daemon))  # the API itself is still bounded
        api.sendall(b"GET /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert read_answer(api)[0] == 503
        assert len(idle) == bound + 20


def test_a_connection_that_sends_no_request_is_closed(daemon: DaemonProcess) -> None:
    with raw_connection(daemon) as silent, raw_connection(daemon) as partial:
        partial.sendall(b"GET /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never end
        assert silent.recv(1) == b""  # closed by the server (the socket's own timeout is 60 s)
        assert partial.recv(1) == b""


def test_a_second_request_whose_headers_never_end_is_closed(daemon: DaemonProcess) -> None:
    """The idle timeout also bounds the headers of a kept-alive connection's next request (uvicorn's own
    keep-alive timer stops at its first byte)."""
    with raw_connection(daemon) as sock:
        sock.sendall(b"GET /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        while len(body) < length:
            body += sock.recv(65536)
        assert head.startswith(b"HTTP/1.1 200") and b"connection: close" not in head.lower()
        sock.sendall(b"GET /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the next one's headers never end
        assert sock.recv(1) == b""  # closed by the server (the socket's own timeout is 60 s)


# -- no state for topics that do not exist -------------------------------------------------------------

def topic_series(daemon: DaemonProcess) -> set[str]:
    return {labels["topic"] for _, labels, _ in metric_samples(daemon) if "topic" in labels}


def test_reads_of_unknown_topics_leave_nothing_behind(daemon: DaemonProcess) -> None:
    folders = set(daemon.root.iterdir())
    names = [f"nope-{uuid.uuid4().hex}" for _ in range(50)]
    for name in names:
        for path, params in [(f"/v1/topics/{name}/horizon", {}),
                             (f"/v1/topics/{name}/compacted", {"partition": 0}),
                             (f"/v1/topics/{name}/compacted/last", {"partition": 0})]:
            assert_error(daemon.http.get(path, params=params), 404, "topic_not_found")
        assert_error(daemon.http.get(f"/v1/topics/{name}/compaction"), 404, "topic_not_found")
        assert_error(daemon.http.get(f"/v1/topics/{name}/policies"), 404, "topic_not_found")
    assert set(daemon.root.iterdir()) == folders
    assert not topic_series(daemon) & set(names)
    listed = {t["topic"] for t in daemon.http.get("/v1/topics").json()["topics"]}
    assert not listed & set(names)


def test_policies_and_unload_of_a_topic_the_broker_lacks_are_404(daemon: DaemonProcess) -> None:
    folders = set(daemon.root.iterdir())
    name = f"nope-{uuid.uuid4().hex}"
    assert_error(daemon.http.put(f"/v1/topics/{name}/policies", json={"thresholdBytes": 1}), 404,
                 "topic_not_found")
    assert_error(daemon.http.post(f"/v1/topics/{name}/unload"), 404, "topic_not_found")
    assert set(daemon.root.iterdir()) == folders
    # the broker's hook for a deleted topic: nothing to remove here either, 404
    assert_error(daemon.http.delete(f"/v1/topics/{name}"), 404, "topic_not_found")
    assert set(daemon.root.iterdir()) == folders
