"""The channel between a run's driver and its reading tasks (``engine.channel``), over real loopback TCP:
frames and their bound, the run's token, the bound on connections, the plan's wait, pushes read at a task's
checks, and a task that loses the driver."""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from compactord.engine.channel import ChannelLost, FrameError, RunChannel, TaskChannel, driver
from compactord.engine.channel.frames import MAX_FRAME_BYTES, decode, encode, split_frames
from tests.support.channel import LOOPBACK, run_channel
from tests.support.timeouts import STOP_TIMEOUT_S
from tests.support.waiting import wait_for


def raw_connection(endpoint: dict[str, Any]) -> socket.socket:
    sock = socket.create_connection((endpoint["host"], endpoint["port"]), 10)
    sock.settimeout(10)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


# -- frames --------------------------------------------------------------------------------------


def test_frames_round_trip_and_a_partial_frame_waits_for_its_rest() -> None:
    frames = encode({"t": "a", "n": 1}) + encode({"t": "b", "text": "é" * 10})
    buffer = bytearray(frames[:-3])
    assert split_frames(buffer) == [{"t": "a", "n": 1}]
    buffer += frames[-3:]
    assert split_frames(buffer) == [{"t": "b", "text": "é" * 10}]
    assert buffer == bytearray()


def test_a_frame_over_the_bound_is_refused_both_ways() -> None:
    with pytest.raises(FrameError, match="over the channel's"):
        encode({"t": "plan", "spec": "x" * MAX_FRAME_BYTES})
    with pytest.raises(FrameError, match="announced, over the"):
        split_frames(bytearray((MAX_FRAME_BYTES + 1).to_bytes(4, "big") + b"{"))


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'{"no": "kind"}', b'{"t": 3}'])
def test_a_frame_that_is_not_an_object_with_a_kind_is_refused(body: bytes) -> None:
    with pytest.raises(FrameError):
        decode(body)


# -- authentication and bounds ----------------------------------------------------------------------


def test_a_task_with_a_wrong_token_gets_nothing() -> None:
    with run_channel({"sasl_plain_password": "s3cret-pw"}) as channel:
        endpoint = channel.endpoint(LOOPBACK)
        sock = raw_connection(endpoint)
        sock.sendall(encode({"t": "hello", "token": endpoint["token"][:-1] + "x", "secrets": True}))
        assert read_all(sock) == b""  # closed without a byte
        sock.close()
        with pytest.raises(ChannelLost, match="token was refused"):
            TaskChannel({**endpoint, "token": "not-the-token"})
        assert TaskChannel(endpoint).secrets == {"sasl_plain_password": "s3cret-pw"}  # the right one does


def test_a_closed_run_admits_no_one() -> None:
    with run_channel() as channel:
        endpoint = channel.endpoint(LOOPBACK)
    with pytest.raises(ChannelLost):
        TaskChannel(endpoint)


def test_the_secrets_come_only_to_a_task_that_asks() -> None:
    with run_channel({"ssl_password": "key-pw"}) as channel:
        endpoint = channel.endpoint(LOOPBACK)
        assert endpoint["secrets"] is True
        assert TaskChannel({**endpoint, "secrets": False}).secrets == {}


def test_a_connection_that_never_says_hello_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "HELLO_TIMEOUT_S", 0.2)
    with run_channel() as channel:
        endpoint = channel.endpoint(LOOPBACK)
        task = TaskChannel(endpoint)
        sock = raw_connection(endpoint)
        assert read_all(sock) == b""  # closed at the deadline, unanswered
        sock.close()
        task.report("0-0", {"partition": 0, "records": 1, "done": True})  # the task's connection stays
        assert channel.progress().records == 1


def test_a_stranger_announcing_more_than_a_hello_is_closed_without_waiting_for_its_body(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "HELLO_TIMEOUT_S", 3600.0)  # only the hello's bound can close it
    with run_channel() as channel:
        sock = raw_connection(channel.endpoint(LOOPBACK))
        sock.sendall((64 << 10).to_bytes(4, "big") + b"{" * 100)
        sock.settimeout(STOP_TIMEOUT_S)
        assert read_all(sock) == b""
        sock.close()


@contextlib.contextmanager
def strangers(endpoint: dict[str, Any], idle: int) -> Iterator[list[socket.socket]]:
    """``idle`` connections that say nothing, then some that send what is not a hello (closed at once), all
    closed at the end."""
    garbage = [b"GET / HTTP/1.1\r\nHost: driver\r\n\r\n",  # an announced length of 1.2 GB
               (64 << 10).to_bytes(4, "big") + b"x" * 1000,  # over a hello's bound
               encode({"t": "progress", "key": "0-0", "report": {"partition": 0, "records": 10**6}}),
               encode({"t": "hello", "token": "guessed", "secrets": True}),
               b"\x00\x00\x00\x05hello"]  # a frame that is not JSON
    opened: list[socket.socket] = []
    try:
        for _ in range(idle):
            opened.append(raw_connection(endpoint))
        for data in garbage:
            opened.append(raw_connection(endpoint))
            opened[-1].sendall(data)
        yield opened
    finally:
        for sock in opened:
            sock.close()


def answered(socks: list[socket.socket]) -> list[socket.socket]:
    """The connections the server wrote to or closed (it answers a stranger only by closing it)."""
    poller = select.poll()
    for sock in socks:
        poller.register(sock, select.POLLIN)
    ready = {fd for fd, _ in poller.poll(0)}
    return [sock for sock in socks if sock.fileno() in ready]


def test_strangers_holding_connections_open_do_not_keep_a_runs_tasks_out(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """100 idle connections (more than the budget of unauthenticated ones) and five that send garbage, from a
    process that does not know the token, held open as long as they like: the run's tasks still connect,
    report and are acknowledged; the strangers lose their places, oldest first."""
    monkeypatch.setattr(driver, "HELLO_TIMEOUT_S", 3600.0)  # the strangers' worst case: no deadline frees them
    caplog.set_level(logging.DEBUG, logger="compactord.engine.channel")
    idle = 100
    with run_channel({"sasl_plain_password": "s3cret-pw"}) as channel:
        endpoint = channel.endpoint(LOOPBACK)
        with strangers(endpoint, idle) as opened:
            # The server has taken them all in: the garbage closed, the idle ones over the budget closed too.
            wait_for(lambda: len(answered(opened)) >= idle - driver.MAX_PENDING + 5, STOP_TIMEOUT_S,
                     "the server to close the strangers over its budget")
            tasks = [TaskChannel(endpoint) for _ in range(4)]
            for i, task in enumerate(tasks):
                assert task.secrets == {"sasl_plain_password": "s3cret-pw"}
                task.report(f"{i}-0", {"partition": i, "records": 10, "bytes": 100, "done": True})
            assert channel.progress().records == 40  # the garbage's progress report was never taken
            still_open = [sock for sock in opened[:idle] if sock not in answered(opened)]
            assert len(still_open) <= driver.MAX_PENDING
            assert set(still_open) <= set(opened[idle - len(still_open):idle])  # the newest kept their places
    assert endpoint["token"] not in caplog.text


def test_a_full_budget_of_strangers_closes_the_oldest_telling_it_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "MAX_PENDING", 1)
    monkeypatch.setattr(driver, "HELLO_TIMEOUT_S", 3600.0)
    with run_channel() as channel:
        endpoint = channel.endpoint(LOOPBACK)
        stranger = raw_connection(endpoint)
        task = TaskChannel(endpoint)
        assert [frame["t"] for frame in split_frames(bytearray(read_all(stranger)))] == ["busy"]
        stranger.close()
        task.report("0-0", {"partition": 0, "records": 3, "done": True})
        assert channel.progress().records == 3


@pytest.mark.parametrize("closing", ["busy", "reset"])
def test_a_task_the_driver_was_too_busy_for_connects_again(closing: str) -> None:
    """A driver that closes the task's first connection to make room (telling it ``busy``, or resetting it with
    its hello unread), and welcomes the second: the task is welcomed."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    connections: list[socket.socket] = []

    def serve() -> None:
        first, _ = listener.accept()
        connections.append(first)
        if closing == "busy":
            first.recv(65536)
            first.sendall(encode({"t": "busy"}))
        else:
            wait_for(lambda: answered_by_peer(first), STOP_TIMEOUT_S, "the task's hello")
            first.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        first.close()
        second, _ = listener.accept()
        connections.append(second)
        second.recv(65536)
        second.sendall(encode({"t": "welcome", "cancel": False, "rate": 5.0}))

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        task = TaskChannel({"host": "127.0.0.1", "port": port, "token": "t"})
        assert task.rate == 5.0
        server.join()
        assert len(connections) == 2
        task.close()
    finally:
        listener.close()
        for sock in connections:
            sock.close()


def answered_by_peer(sock: socket.socket) -> bool:
    """Whether ``sock`` has bytes to read (left unread)."""
    return bool(select.select([sock], [], [], 0)[0])


def test_a_frame_over_the_bound_from_a_task_closes_its_connection() -> None:
    with run_channel() as channel:
        endpoint = channel.endpoint(LOOPBACK)
        sock = raw_connection(endpoint)
        sock.sendall(encode({"t": "hello", "token": endpoint["token"]}))
        sock.sendall((MAX_FRAME_BYTES + 1).to_bytes(4, "big") + b"{}")
        welcome = read_all(sock)  # the welcome, then the close
        assert split_frames(bytearray(welcome))[0]["t"] == "welcome"
        sock.close()


def test_a_run_admits_a_bounded_number_of_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "MAX_CONNECTIONS_PER_RUN", 2)
    with run_channel() as channel:
        endpoint = channel.endpoint(LOOPBACK)
        admitted = [TaskChannel(endpoint), TaskChannel(endpoint)]
        with pytest.raises(ChannelLost):
            TaskChannel(endpoint)
        admitted[0].close()
        channel.cancel()  # a round trip through the server's loop: the closed connection is dropped by then
        wait_until_dropped(channel, 1)
        assert TaskChannel(endpoint).cancelled


def wait_until_dropped(channel: RunChannel, left: int) -> None:
    """Until the run holds ``left`` connections (the server drops a closed one when it reads its end)."""
    done = threading.Event()
    for _ in range(1000):
        with channel._lock:
            if len(channel._connections) <= left:
                return
        done.wait(0.01)
    raise AssertionError(f"the run still holds {len(channel._connections)} connections")


# -- what travels ------------------------------------------------------------------------------------


def test_reports_are_summed_and_a_final_one_is_held_when_the_task_goes_on() -> None:
    with run_channel() as channel:
        task = TaskChannel(channel.endpoint(LOOPBACK))
        task.report("0-0", {"partition": 0, "records": 5, "bytes": 50, "done": False, "started_at": 10.0})
        task.report("0-0", {"partition": 0, "records": 8, "bytes": 80, "done": True, "started_at": 10.0,
                            "read_ended_at": 12.0, "last": [7, 100, 42], "cpu_seconds": 0.5, "wall_seconds": 1.0})
        task.report("1-0", {"partition": 1, "records": 2, "bytes": 20, "done": True, "started_at": 11.0,
                            "read_ended_at": 11.5, "last": "malformed"})  # skipped, not trusted
        tail = channel.progress()
    assert (tail.records, tail.bytes, tail.ended, tail.started_at, tail.ended_at) == (8, 80, 1, 10.0, 12.0)
    assert tail.last[0].offset == 7 and tail.cpu_ratio == 0.5


def test_cancel_and_rate_are_read_at_a_check_and_given_to_a_task_that_connects_later() -> None:
    with run_channel() as channel:
        endpoint = channel.endpoint(LOOPBACK)
        task = TaskChannel(endpoint)
        assert not task.cancelled and task.rate is None
        channel.set_rate(1000.0)
        channel.cancel()
        task.report("0-0", {"partition": 0, "done": True})  # its ack comes after both pushes
        assert task.cancelled and (task.rate, task.rate_version) == (1000.0, 1)
        later = TaskChannel(endpoint)
        assert later.cancelled and later.rate == 1000.0


def test_a_task_blocks_for_its_plan_until_the_driver_hands_it() -> None:
    with run_channel() as channel:
        task = TaskChannel(channel.endpoint(LOOPBACK))
        asked = threading.Timer(0.05, lambda: handed.append(channel.hand_plan({"ranges": [[0, 1, 2]]})))
        handed: list[bool] = []
        asked.start()
        assert task.wait_plan(30.0) == {"ranges": [[0, 1, 2]]}
        asked.join()
        assert handed == [True]
        assert not channel.hand_plan(None)  # the first decision stands
        assert TaskChannel(channel.endpoint(LOOPBACK)).wait_plan(30.0) == {"ranges": [[0, 1, 2]]}


def test_a_wait_for_the_plan_that_runs_out_declines_for_every_task() -> None:
    with run_channel() as channel:
        endpoint = channel.endpoint(LOOPBACK)
        first, second = TaskChannel(endpoint), TaskChannel(endpoint)
        assert first.wait_plan(0.05) is None
        assert not channel.hand_plan({"ranges": []})  # too late: the tasks ended unread
        assert second.wait_plan(30.0) is None


def test_a_cancel_ends_a_task_waiting_for_its_plan() -> None:
    with run_channel() as channel:
        task = TaskChannel(channel.endpoint(LOOPBACK))
        threading.Timer(0.05, channel.cancel).start()
        with pytest.raises(RuntimeError, match="cancelled before"):
            task.wait_plan(30.0)


# -- losing the driver ----------------------------------------------------------------------------


def test_a_task_that_loses_the_driver_fails_at_its_next_check_and_a_new_one_connects_again() -> None:
    with run_channel() as channel:
        endpoint = channel.endpoint(LOOPBACK)
        spec = {"channel": endpoint}
        task = TaskChannel.for_spec(spec)
        assert task is not None and TaskChannel.for_spec(spec) is task  # one connection per worker and run
        channel.close()
        with pytest.raises(ChannelLost, match="lost its channel"):
            task.wait_plan(30.0)
        with pytest.raises(ChannelLost):
            TaskChannel.for_spec(spec)  # a retried attempt connects again, and is refused: the run ended


def test_a_driver_that_stops_answering_fails_the_task_at_its_next_wait() -> None:
    """A peer that accepts and then breaks the format (as a driver process that died and whose port was
    taken): the task does not trust it and fails."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"\xff\xff\xff\xff")  # a frame of 4 GiB announced
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    with pytest.raises(ChannelLost, match="over the"):
        TaskChannel({"host": "127.0.0.1", "port": port, "token": "t"})
    listener.close()

