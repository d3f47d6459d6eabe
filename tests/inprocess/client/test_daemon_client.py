"""DaemonClient at a URL that is not the daemon's API: a TCP server that accepts and never answers,
and the real test broker (it speaks Kafka, not HTTP), each named as such within seconds; and a route
that is slow by design, whose answer is still awaited once ``/healthz`` shows the API is there.

No test times anything: the server that holds its answer releases it when the probe has come.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from compactord import client
from compactord.cli import main
from compactord.client import DaemonClient
from compactord.embedded import EmbeddedBroker
from compactord.errors import DaemonUnreachable, NotCompactordApi
from tests.support.json_server import JsonHandler, serving

NOT_THE_API = "answers, but it is not compactord's API: is it the broker's address?"


@pytest.fixture
def silent() -> Iterator[str]:
    """A TCP server that accepts every connection and never writes a byte."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()
        for conn in held:
            conn.close()


def test_a_server_that_never_answers_is_not_the_api(silent: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", silent, "topics"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert f"compactord: {silent} {NOT_THE_API}" in err


def test_a_silent_server_is_named_within_answer_start(silent: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The answer's wait and the probe's overlap: the verdict needs no more waiting than ``ANSWER_START``
    in all (the waits asked of ``select`` are summed, not timed)."""
    monkeypatch.setattr(client, "ANSWER_START", 0.5)
    waits: list[float] = []
    real_select = client.select.select

    def select(r: list[Any], w: list[Any], x: list[Any], timeout: float) -> Any:
        waits.append(timeout)
        return real_select(r, w, x, timeout)

    monkeypatch.setattr(client.select, "select", select)
    with pytest.raises(NotCompactordApi):
        DaemonClient(silent).topics()
    assert len(waits) == 2 and sum(waits) == pytest.approx(0.5), waits


def test_a_silent_server_fails_a_long_bound_too(silent: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exact preview's bound is a day: the probe still tells it is no daemon."""
    monkeypatch.setattr(client, "ANSWER_START", 0.2)  # the probe comes sooner; nothing else changes
    with pytest.raises(NotCompactordApi) as raised:
        DaemonClient(silent, timeout=24 * 3600.0).preview("t", exact=True)
    assert isinstance(raised.value, DaemonUnreachable) and raised.value.status == 502


def test_the_broker_s_address_is_named_as_not_the_api(broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(client, "ANSWER_START", 0.2)
    assert main(["--url", f"http://{broker.bootstrap}", "topics"]) == 1
    assert f"compactord: {broker.bootstrap} {NOT_THE_API}" in capsys.readouterr().err
    with pytest.raises(NotCompactordApi):
        DaemonClient(broker.bootstrap).info()  # what demo --url asks first


class _SlowRoute(JsonHandler):
    """``/v1/info`` answers only once ``/healthz`` has been asked, as a route slow by design would
    answer after the client's probe; ``/healthz`` answers at once."""

    probed: threading.Event

    def do_GET(self) -> None:  # http.server's name
        if self.path == "/healthz":
            self.probed.set()
            self.send_json({"status": "ok"})
        elif self.probed.wait(60):
            self.send_json({"version": "slow"})


@pytest.fixture
def slow_route(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, threading.Event]]:
    monkeypatch.setattr(client, "ANSWER_START", 0.2)  # the probe comes sooner; nothing else changes
    probed = threading.Event()
    with serving(_SlowRoute, probed=probed) as port:
        yield f"127.0.0.1:{port}", probed


def test_a_slow_answer_of_the_api_is_awaited_after_the_probe(slow_route: tuple[str, threading.Event]) -> None:
    url, probed = slow_route
    assert DaemonClient(url).info() == {"version": "slow"}
    assert probed.is_set()
