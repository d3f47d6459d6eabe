"""The demo waits for the daemon to be able to compact, asking its readiness over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from compactord.client import DaemonClient
from compactord.demo import _wait_ready
from tests.support.json_server import JsonHandler, serving


class _Readiness(JsonHandler):
    """``/readyz`` as a daemon whose Spark session is still starting answers it, until ``answers`` runs out:
    then ready."""

    answers: list[dict[str, object]]

    def do_GET(self) -> None:  # http.server's name
        self.send_json(self.answers.pop(0) if self.path == "/readyz" and self.answers else {"compactions": True})


@pytest.fixture
def starting_daemon() -> Iterator[str]:
    with serving(_Readiness, answers=[{"compactions": False, "problems": ["Spark starts"]}]) as port:
        yield f"http://127.0.0.1:{port}"


def test_the_demo_waits_until_the_daemon_can_compact(starting_daemon: str) -> None:
    said: list[str] = []
    _wait_ready(DaemonClient(starting_daemon, timeout=10), said.append)
    assert len(said) == 1 and said[0].startswith("waiting for the daemon"), said
