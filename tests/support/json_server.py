"""A stand-in HTTP server answering JSON, for the client's and the CLI's tests of what a daemon answers (a
401, a slow route, a daemon still starting): a handler class subclasses ``JsonHandler`` and ``serving`` runs it
on a free loopback port until the test ends."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["JsonHandler", "serving"]


class JsonHandler(http.server.BaseHTTPRequestHandler):
    def send_json(self, body: object, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving(handler: type[JsonHandler], **attributes: Any) -> Iterator[int]:
    """Serve ``handler`` (a subclass with ``attributes`` set on it) on 127.0.0.1; yields its port, and stops
    the server and its thread on exit."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type(handler.__name__, (handler,), attributes))
    thread = threading.Thread(target=server.serve_forever, name="json-server", daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
