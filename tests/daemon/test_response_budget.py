"""Clients that never read their answers hold a bounded amount of the daemon's memory (see #38): large
answers count against httpResponseBufferBytes until their client has taken them, one past it is 503
server_busy at once (its rendered page dropped), and a client that takes nothing for the send timeout
(httpRequestBodyTimeoutSeconds) is cut off, which gives its bytes back.

The package's open daemon, whose buffer holds two pages of the compacted view; clients with a 4 KiB receive
window that ask for a page and read nothing.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, compact, metric
from tests.support.waiting import wait_for

from .conftest import OPEN_BUFFER_BYTES, OPEN_READ_MAX_BYTES

pytestmark = pytest.mark.slow

VALUE_BYTES = 512 * 1024
ENTRIES = 8
PAGE_RAW = VALUE_BYTES * ENTRIES  # 4 MiB of values: a page of ~5.6 MB of JSON (base64)
BUFFER_BYTES = OPEN_BUFFER_BYTES  # two such pages, not three
NON_READERS = 6


@pytest.fixture(scope="module")
def daemon(open_daemon: DaemonProcess) -> DaemonProcess:
    """The package's open daemon: pages of up to PAGE_RAW + 4096 bytes, a buffer of BUFFER_BYTES, and a client
    cut off after taking none of an answer for 8 s."""
    assert PAGE_RAW + 4096 == OPEN_READ_MAX_BYTES
    return open_daemon


@pytest.fixture(scope="module")
def big_page(daemon: DaemonProcess, kafka: Any) -> str:
    topic = kafka.topic(prefix="budget")
    kafka.produce(topic, [(f"k-{i}", bytes([65 + i]) * VALUE_BYTES) for i in range(ENTRIES)])
    compact(daemon, topic)
    return topic


@contextlib.contextmanager
def non_reader(daemon: DaemonProcess, path: str) -> Iterator[socket.socket]:
    """A connection with a 4 KiB receive window that asks for ``path`` and reads nothing (until the test
    reads it at the end)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window stays small
    sock.settimeout(120)
    try:
        sock.connect(("127.0.0.1", daemon.port))
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        yield sock
    finally:
        sock.close()


def drain(sock: socket.socket) -> tuple[int, int, int]:
    """Read ``sock`` to its end: the answer's status, its Content-Length and the body bytes that came."""
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(1 << 20):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length"))
    return int(lines[0].split()[1]), length, len(body)


def test_clients_that_never_read_hold_at_most_the_buffer_and_are_cut_off(daemon: DaemonProcess,
                                                                        big_page: str) -> None:
    path = f"/v1/topics/{big_page}/compacted?partition=0"
    reader = daemon.http.get(path)  # a client that reads gets the whole page
    assert reader.status_code == 200 and len(reader.json()["entries"]) == ENTRIES
    page_bytes = len(reader.content)
    assert 2 * page_bytes <= BUFFER_BYTES < 3 * page_bytes

    with contextlib.ExitStack() as stack:
        stalled = [stack.enter_context(non_reader(daemon, path)) for _ in range(NON_READERS)]
        # The pages the non-readers have not taken fill the buffer: a reader is refused at once.
        busy = wait_for(lambda: (r := daemon.http.get(path)).status_code == 503 and r, 60,
                        "a page to be refused while non-readers hold the buffer", daemon)
        body = busy.json()
        assert body["error"] == "server_busy" and "httpResponseBufferBytes" in body["message"], body
        assert busy.headers["Retry-After"] == "1"
        # The non-readers are cut off after the send timeout, which gives their bytes back.
        wait_for(lambda: metric(daemon, "compactord_http_response_buffer_bytes") == 0, 120,
                 "the non-readers to be cut off", daemon)
        assert daemon.http.get(path).status_code == 200
        answers = [drain(sock) for sock in stalled]
    served = [a for a in answers if a[0] == 200]
    assert 1 <= len(served) <= 2, answers  # at most what the buffer holds
    assert all(got < length for _, length, got in served), answers  # cut off before the end
    refused = [a for a in answers if a[0] != 200]
    assert all(status == 503 for status, _, _ in refused), answers
    assert json.loads(daemon.http.get("/v1/tasks").text) is not None  # the daemon serves on
