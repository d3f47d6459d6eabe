"""A fault-injecting HTTP/1.1 proxy between a client and an S3 server, on 127.0.0.1, one thread a connection.

It relays each request (head and body, by Content-Length or chunked) to the upstream server and its answer back,
unless a fault is set, which then takes the next requests:

- ``fail(n, status)``: the next ``n`` requests are answered ``status`` (503 SlowDown, 500 InternalError) with
  S3's XML error body, the request never reaching the server;
- ``refuse(status, matching)``: every request (or every one whose request line contains ``matching``) is
  answered so, until ``heal()``;
- ``reset_uploads(n)``: the next ``n`` requests with a body are cut after part of it, the connection reset;
- ``lose_answers(n)``: the next ``n`` requests reach the server, and their answers are lost (the connection
  reset instead);
- ``hang()``: every request is read and never answered, until ``heal()``;
- ``partition()``: as ``hang()``, until ``rejoin()`` or ``heal()``, and the requests it took stay unanswered
  after it until their client gives up on them, as a network partition loses the connections open across it;
- ``ignore_conditions``: a put the server refused for its If-Match or If-None-Match (412) is answered 200
  with the ETag of its bytes, as a store that ignores conditional writes answers (the headers themselves
  cannot be removed: the request's signature covers them).

``requests`` counts the requests that reached the proxy, ``seen`` holds their request lines
(``GET /bucket/key``, the query cut off) in arrival order, ``faulted`` those a fault took.

``TcpProxy`` is a plain TCP relay whose ``partition()`` cuts a Kafka broker off from its clients.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Self

__all__ = ["FaultProxy", "TcpProxy"]

_CODES = {500: ("InternalError", "We encountered an internal error. Please try again."),
          503: ("SlowDown", "Please reduce your request rate.")}
_REASONS = {500: "Internal Server Error", 503: "Service Unavailable"}


class _Closed(Exception):
    pass


class _Reader:
    """Buffered reads of a socket: lines and exact byte counts."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer = sock, b""

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise _Closed()
        self.buffer += chunk

    def line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            self._fill()
        line, _, self.buffer = self.buffer.partition(b"\r\n")
        return line + b"\r\n"

    def exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            self._fill()
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def head(self) -> list[bytes]:
        lines = [self.line()]
        while lines[-1] != b"\r\n":
            lines.append(self.line())
        return lines


def _header(lines: list[bytes], name: bytes) -> bytes | None:
    for line in lines[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            return value.strip()
    return None


def _body(reader: _Reader, lines: list[bytes], *, no_body: bool = False) -> bytes:
    """The body that follows ``lines`` as it came on the wire (chunked framing kept)."""
    if no_body:
        return b""
    if (_header(lines, b"transfer-encoding") or b"").lower() == b"chunked":
        raw = b""
        while True:
            size_line = reader.line()
            raw += size_line
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                trailer = reader.head()  # trailers, then the empty line
                return raw + b"".join(trailer)
            raw += reader.exactly(size + 2)
    return reader.exactly(int(_header(lines, b"content-length") or b"0"))


class FaultProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.requests = 0
        self.seen: list[str] = []
        self.faulted: list[str] = []
        self.ignore_conditions = False
        self._lock = threading.Lock()
        self._failures: list[int] = []  # statuses of the next requests to fail
        self._resets = 0
        self._lost = 0
        self._refusing: int | None = None  # the status of every request while refusing
        self._refusing_matching = ""  # ... of every request whose line contains this
        self._partitioned = False
        self._healed = threading.Event()
        self._healed.set()
        self._stopped = threading.Event()
        self._sockets: set[socket.socket] = set()
        threading.Thread(target=self._accept, name="fault-proxy", daemon=True).start()

    # -- faults -----------------------------------------------------------------------------------

    def fail(self, n: int, status: int = 503) -> None:
        with self._lock:
            self._failures += [status] * n

    def refuse(self, status: int = 500, matching: str = "") -> None:
        with self._lock:
            self._refusing, self._refusing_matching = status, matching

    def reset_uploads(self, n: int = 1) -> None:
        with self._lock:
            self._resets += n

    def lose_answers(self, n: int = 1) -> None:
        with self._lock:
            self._lost += n

    def hang(self) -> None:
        self._healed.clear()

    def partition(self) -> None:
        self._partitioned = True
        self._healed.clear()

    def rejoin(self) -> None:
        """End a partition (or a hang) only: the other faults stay."""
        self._partitioned = False
        self._healed.set()

    def heal(self) -> None:
        with self._lock:
            self._failures.clear()
            self._resets = 0
            self._refusing = None
        self._lost = 0
        self.rejoin()

    def stop(self) -> None:
        self._stopped.set()
        self._healed.set()
        with contextlib.suppress(OSError):
            self.listener.close()
        with self._lock:
            for sock in list(self._sockets):
                with contextlib.suppress(OSError):
                    sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- relaying ---------------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), name="fault-proxy-conn", daemon=True).start()

    @contextlib.contextmanager
    def _tracked(self, sock: socket.socket) -> Iterator[socket.socket]:
        with self._lock:
            self._sockets.add(sock)
        try:
            yield sock
        finally:
            with self._lock:
                self._sockets.discard(sock)
            with contextlib.suppress(OSError):
                sock.close()

    def _serve(self, client: socket.socket) -> None:
        with self._tracked(client), contextlib.suppress(_Closed, OSError):
            reader = _Reader(client)
            upstream: socket.socket | None = None
            try:
                while True:
                    head = reader.head()
                    with self._lock:
                        self.requests += 1
                        line = head[0].decode("latin-1").split("?")[0].split(" HTTP/")[0]
                        self.seen.append(line)
                        refusing = self._refusing if self._refusing_matching in line else None
                        status = self._failures.pop(0) if self._failures else refusing
                        has_body = int(_header(head, b"content-length") or b"0") > 0 \
                            or _header(head, b"transfer-encoding") is not None
                        reset = has_body and self._resets > 0
                        if reset:
                            self._resets -= 1
                        if reset or status is not None:
                            self.faulted.append(line)
                    if reset:  # take part of the body, then cut the connection hard (RST)
                        with contextlib.suppress(_Closed):
                            reader.exactly(min(1024, len(reader.buffer) + 1))
                        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        return
                    if (_header(head, b"expect") or b"").lower() == b"100-continue":
                        # Answered here, so that the body comes before the request goes on (Expect is not
                        # signed: it may be dropped).
                        client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                        head = [line for line in head if not line.lower().startswith(b"expect:")]
                    body = _body(reader, head)
                    if not self._healed.is_set():
                        partitioned = self._partitioned
                        self._healed.wait()
                        while partitioned and not self._stopped.is_set() and client.recv(65536):
                            pass  # never answered: until the client closes the connection (or the proxy stops)
                        return  # healed or stopped: the hung request is dropped with its connection
                    if status is not None:
                        client.sendall(_error_answer(status))
                        continue
                    if upstream is None:
                        upstream = socket.create_connection(self.upstream)
                    upstream.sendall(b"".join(head) + body)
                    answer = _Reader(upstream)
                    answer_head = answer.head()
                    code = int(answer_head[0].split()[1])
                    no_body = head[0].startswith(b"HEAD ") or code in (204, 304) or 100 <= code < 200
                    answer_body = _body(answer, answer_head, no_body=no_body)
                    with self._lock:
                        lost = self._lost > 0
                        self._lost -= lost
                    if lost:
                        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        return
                    if code == 412 and self.ignore_conditions and head[0].startswith(b"PUT "):
                        client.sendall(f'HTTP/1.1 200 OK\r\nETag: "{hashlib.md5(body).hexdigest()}"\r\n'
                                       "Content-Length: 0\r\n\r\n".encode())
                        continue
                    client.sendall(b"".join(answer_head) + answer_body)
            finally:
                if upstream is not None:
                    upstream.close()


def _error_answer(status: int) -> bytes:
    code, message = _CODES.get(status, ("InternalError", "An error."))
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            f"</Error>").encode()
    return (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/xml\r\n"
            f"Content-Length: {len(body)}\r\nx-amz-request-id: fault-proxy\r\n\r\n").encode() + body


class TcpProxy:
    """A plain TCP relay on 127.0.0.1 to ``upstream_port`` (a Kafka broker that advertises the relay's port, so
    that every connection of its clients passes here), one thread each way of a connection.

    ``partition()`` cuts the network: bytes stop flowing both ways, new connections are accepted and never
    relayed, and the connections stay open (as a partition leaves them) until ``rejoin()``, which closes them
    (their clients reconnect) and relays again.
    """

    def __init__(self, upstream_port: int, port: int = 0) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()
        self._stopped = threading.Event()
        self._sockets: set[socket.socket] = set()
        threading.Thread(target=self._accept, name="tcp-proxy", daemon=True).start()

    def partition(self) -> None:
        self._open.clear()

    def rejoin(self) -> None:
        self._close_all()
        self._open.set()

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self.listener.close()
        self._close_all()
        self._open.set()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _close_all(self) -> None:
        with self._lock:
            sockets, self._sockets = list(self._sockets), set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self._sockets.add(client)
            threading.Thread(target=self._connect, args=(client,), name="tcp-proxy-conn", daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self._open.wait()  # during a partition, a new connection waits (its client times out)
        if self._stopped.is_set():
            return
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            with contextlib.suppress(OSError):
                client.close()
            return
        with self._lock:
            self._sockets.add(upstream)
        threading.Thread(target=self._pump, args=(upstream, client), name="tcp-proxy-back", daemon=True).start()
        self._pump(client, upstream)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                self._open.wait()  # a partition holds what was read: nothing passes until rejoin() closes it
                if self._stopped.is_set():
                    return
                sink.sendall(data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
