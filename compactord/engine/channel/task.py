"""A reading task's side of the channel (``TaskChannel``), in Spark's Python workers.

A worker runs one task at a time, and a task may read several ranges: the worker keeps one connection per run
(``for_spec``), which each range's ``RangeReadTask`` shares. The connection is the calling thread's: a small
run's task read in the driver (``kafka_source.run_writing_tasks_in_driver``) runs on its run's own thread,
beside other runs. What the driver pushes (cancel, rate) is read
without blocking at the task's checks (every ``range_task.PROGRESS_EVERY_S``, between a throttle's sleeps):
one ``recv`` that finds nothing costs less than a record. A task blocks only where it waits: for its
welcome when it connects (connecting again when the driver closed it to make room: ``busy``), for its plan
(``wait_plan``), for the driver's acknowledgement of its last report.
A task that loses the channel (the driver is gone, the run ended, a broken frame) raises ``ChannelLost``:
it stops reading and its attempt fails.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from compactord.engine.channel.frames import FrameError, encode, split_frames

__all__ = ["ACK_TIMEOUT_S", "CONNECT_TIMEOUT_S", "ChannelLost", "TaskChannel", "client_config", "close_current"]

CONNECT_TIMEOUT_S = 30.0  # to connect and be welcomed
ACK_TIMEOUT_S = 30.0  # for the driver to take a task's last report
# A task the driver was too busy to welcome connects again after these pauses (doubling), for CONNECT_TIMEOUT_S.
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 1.0
# How much longer than its asked wait a task waits for its plan: the driver's answer, or its decline
# when the wait ran out, is then late only if the driver is gone.
PLAN_GRACE_S = 30.0

_local = threading.local()  # ``current``: this thread's connection, to the run of its last task


def _get_current() -> TaskChannel | None:
    return getattr(_local, "current", None)


def close_current() -> None:
    """Close this thread's connection, if any (a run's thread in the driver, done with its task)."""
    current = _get_current()
    _local.current = None
    if current is not None:
        current.close()


class ChannelLost(RuntimeError):
    """The task lost its channel to the driver: it stops reading, and its attempt fails."""


class _Busy(Exception):
    """The driver closed a connection that had not been welcomed, to make room for newer ones."""


class TaskChannel:
    """A connection to the driver's channel, for one run (``endpoint``: what the spec carries)."""

    def __init__(self, endpoint: Mapping[str, Any]) -> None:
        self.token = str(endpoint["token"])
        self.where = f"{endpoint['host']}:{endpoint['port']}"
        self._buffer = bytearray()
        self.cancelled = False
        self.rate: float | None = None
        self.rate_version = 0  # counts the rates received
        self.secrets: dict[str, Any] = {}
        self.store_secrets: dict[str, Any] = {}  # the ledger root's credentials (``engine.worker_store``)
        self._plan: list[Any] = []  # the plan once received (a list: None is a plan)
        self._acks = 0
        self._welcomed = False
        # A driver whose budget for unauthenticated connections is full (strangers connected) closes the oldest
        # one, telling it ``busy``, or resetting it when its hello was not read yet: that task connects again.
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        pause = RETRY_FIRST_S
        while True:
            try:
                self._connect(endpoint, deadline)
                return
            except _Busy:
                self._sock.close()
            if deadline - time.monotonic() <= pause:
                raise ChannelLost(f"a reading task could not connect to the driver's channel at {self.where}: it "
                                  f"was kept busy by connections without a run's token for {CONNECT_TIMEOUT_S:.0f}s")
            time.sleep(pause)
            pause = min(pause * 2, RETRY_MAX_S)

    def _connect(self, endpoint: Mapping[str, Any], deadline: float) -> None:
        """Connect, say hello, and wait for the welcome.

        :raises _Busy: the driver closed the connection to make room, before reading the hello.
        :raises ChannelLost: the driver cannot be reached, refused the token, or did not answer by ``deadline``.
        """
        self._buffer.clear()
        try:
            self._sock = socket.create_connection((endpoint["host"], int(endpoint["port"])),
                                                  max(deadline - time.monotonic(), 0.001))
        except OSError as exc:
            raise ChannelLost(f"a reading task could not reach the driver's channel at {self.where}: {exc}"
                              ) from None
        # Blocking, without a timeout: Python waits for a socket with a timeout before each call, which a
        # non-blocking read (``check``) must not do; the waits below wait with ``poll``.
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._poller = select.poll()
        self._poller.register(self._sock, select.POLLIN)
        self._send({"t": "hello", "token": self.token, "secrets": bool(endpoint.get("secrets"))})
        self._wait(lambda: self._welcomed, deadline - time.monotonic(), "its welcome")

    @classmethod
    def for_spec(cls, spec: Mapping[str, Any]) -> TaskChannel | None:
        """The worker's connection to the run of ``spec`` (None when the spec names no channel: a task that
        reports nothing, e.g. the warm-up's). A connection to an earlier run is closed."""
        endpoint = spec.get("channel")
        if not endpoint:
            return None
        current = _get_current()
        if current is not None and current.token == endpoint["token"] and not current.lost:
            return current
        if current is not None:
            current.close()
        _local.current = cls(endpoint)
        return _local.current

    @property
    def lost(self) -> bool:
        return self._sock.fileno() < 0

    # -- a reading task's calls ---------------------------------------------------------------------

    def check(self) -> None:
        """Take what the driver pushed, without blocking.

        :raises ChannelLost: the channel is gone.
        """
        while True:
            try:
                data = self._sock.recv(65536, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionResetError:
                if not self._welcomed:
                    raise _Busy from None
                self._lose("the driver reset it")
            except OSError as exc:
                self._lose(f"{exc}")
            if not data:
                self._lose("the driver closed it (the run ended, or the token was refused)")
            self._take(data)

    def report(self, key: str, report: dict[str, Any]) -> None:
        """Send a range's progress (``key``: its partition and start). A ``done`` report is waited for until
        the driver has it, so that the driver holds it once the task has ended.

        :raises ChannelLost: the channel is gone.
        """
        self._send({"t": "progress", "key": key, "report": report})
        if report.get("done"):
            acks = self._acks
            self._wait(lambda: self._acks > acks, ACK_TIMEOUT_S, "the driver to take its last report")

    def wait_plan(self, limit_s: float) -> Any:
        """The spec the driver hands (None: the tasks are not needed), blocking until it comes; after
        ``limit_s`` the driver declines for every task.

        :raises RuntimeError: the run was cancelled.
        :raises ChannelLost: the channel is gone.
        """
        self._send({"t": "plan", "limit_s": limit_s})
        self._wait(lambda: bool(self._plan) or self.cancelled, limit_s + PLAN_GRACE_S, "its plan")
        if self.cancelled:
            raise RuntimeError("compaction cancelled before its reading tasks were given their ranges")
        return self._plan[0]

    def close(self) -> None:
        self._sock.close()

    # -- the wire -------------------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self._sock.sendall(encode(message))
        except (ConnectionResetError, BrokenPipeError):
            if not self._welcomed:
                raise _Busy from None
            self._lose("the driver reset it")
        except OSError as exc:
            self._lose(f"{exc}")

    def _wait(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        self.check()
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                self._lose(f"no answer within {timeout:.0f}s while waiting for {what}")
            try:
                self._poller.poll(left * 1000)
            except OSError as exc:
                self._lose(f"{exc}")
            self.check()

    def _take(self, data: bytes) -> None:
        self._buffer += data
        try:
            messages = split_frames(self._buffer)
        except FrameError as exc:
            self._lose(f"{exc}")
        for message in messages:
            kind = message["t"]
            if kind == "busy" and not self._welcomed:
                raise _Busy
            if kind == "welcome":
                self._welcomed = True
                self.cancelled = self.cancelled or bool(message.get("cancel"))
                self.secrets = dict(message.get("secrets") or {})
                self.store_secrets = dict(message.get("store_secrets") or {})
                if message.get("rate") is not None:
                    self._new_rate(message["rate"])
            elif kind == "cancel":
                self.cancelled = True
            elif kind == "rate":
                self._new_rate(message.get("rate"))
            elif kind == "plan":
                self._plan = [message.get("spec")]
            elif kind == "ack":
                self._acks += 1

    def _new_rate(self, rate: Any) -> None:
        if isinstance(rate, (int, float)) and rate > 0:
            self.rate = float(rate)
            self.rate_version += 1

    def _lose(self, why: str) -> Any:
        self._sock.close()
        if _get_current() is self:
            _local.current = None  # a retried attempt in this worker connects again
        raise ChannelLost(f"a reading task lost its channel to the driver at {self.where}: {why}")


def client_config(spec: Mapping[str, Any], channel: TaskChannel | None) -> dict[str, Any]:
    """The Kafka client's configuration of a task: the spec's (no secret in it), with the secrets the driver
    served over the channel."""
    return {**spec["client"], **(channel.secrets if channel is not None else {})}
