"""The demo waits for the daemon to be able to compact, asking its readiness over HTTP."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from compactord.client import DaemonClient
from compactord.demo import _wait_ready


class _Readiness(http.server.BaseHTTPRequestHandler):
    """``/readyz`` as a daemon whose Spark session is still starting answers it, until ``answers`` runs out:
    then ready."""

    answers: list[dict[str, object]]

    def do_GET(self) -> None:  # http.server's name
        body = self.answers.pop(0) if self.path == "/readyz" and self.answers else {"compactions": True}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def starting_daemon() -> Iterator[str]:
    handler = type("Handler", (_Readiness,), {"answers": [{"compactions": False, "problems": ["Spark starts"]}]})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_the_demo_waits_until_the_daemon_can_compact(starting_daemon: str) -> None:
    said: list[str] = []
    _wait_ready(DaemonClient(starting_daemon, timeout=10), said.append)
    assert len(said) == 1 and said[0].startswith("waiting for the daemon"), said
