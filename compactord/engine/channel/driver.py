"""The driver's side of the channel: one server per process, a registration per run (``RunChannel``).

The server runs an asyncio loop on a thread of its own, started on first use, bound to the address the
executors reach the driver at (``driver_address``), on a port the OS chooses. Any process that reaches that
address may connect, so a connection is a stranger until it authenticates: its first frame must be a ``hello``
of at most ``MAX_HELLO_BYTES`` carrying the token of a run still registered (compared in constant time), within
``HELLO_TIMEOUT_S``; otherwise it is closed without an answer. Strangers have a budget of their own
(``MAX_PENDING``), never counted against a run's places (``MAX_CONNECTIONS_PER_RUN``, authenticated tasks
only). When the budget is full, a new connection closes the oldest stranger (told ``busy``), not itself: a
task says hello as soon as it connects, so an idle connection is the one least likely to be a task, and
strangers that hold their connections open cannot lock the runs out. A task told ``busy`` connects again
(``task.TaskChannel``).

Messages, task -> driver: ``hello`` (token; ``secrets``: whether the task needs the Kafka client's secrets),
``progress`` (a range's report; ``done`` ones are acknowledged, so that the driver holds every final report
before the task ends), ``plan`` (the early start's ask, answered once the driver hands the plan or declines,
or after the asked wait: see ``RunChannel.hand_plan``). Driver -> task: ``welcome`` (the run's state now:
cancelled, the rate, the secrets (Kafka's, the ledger root's) if asked), ``plan``, ``cancel``, ``rate``, ``ack``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hmac
import logging
import secrets
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from compactord.engine.channel.frames import HEADER_BYTES, MAX_FRAME_BYTES, FrameError, decode, encode, frame_length
from compactord.engine.channel.progress import TailRead, sum_reports
from compactord.errors import CompactionFailed

__all__ = ["HELLO_TIMEOUT_S", "MAX_CONNECTIONS_PER_RUN", "MAX_HELLO_BYTES", "MAX_PENDING", "ChannelServer",
           "DriverAddress", "RunChannel", "driver_address"]

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 5.0
# A hello is ~100 bytes; a stranger is not let announce a frame of ``MAX_FRAME_BYTES`` and hold that memory.
MAX_HELLO_BYTES = 1024
# Connections that have not said hello yet, over every run: a peer that connects and says nothing holds one
# until ``HELLO_TIMEOUT_S``, or until a newer connection needs its place.
MAX_PENDING = 64
# Strangers closed to make room are logged at most once per this many seconds (a flood is one line a minute).
EVICTION_LOG_EVERY_S = 60.0
# A run's tasks each hold one connection per Python worker; far more than any cluster's slots for one job.
MAX_CONNECTIONS_PER_RUN = 4096
# How long ``cancel``, ``set_rate`` and ``hand_plan`` wait for their message to reach the tasks' sockets.
PUSH_WAIT_S = 1.0

_UNSET: Any = object()
_BUSY = encode({"t": "busy"})


@dataclass(frozen=True, slots=True)
class DriverAddress:
    """Where the server listens (``bind``) and the host the tasks are told to connect to (``host``)."""

    bind: str
    host: str


def driver_address(spark: Any) -> DriverAddress:
    """The address of the driver that ``spark``'s executors reach: loopback under a local master (the tasks run
    on this machine), else ``spark.driver.host`` (set by Spark at start when not configured), listening on
    ``spark.driver.bindAddress`` when that is set."""
    context = spark.sparkContext
    found = _ADDRESSES.get(context)
    if found is not None:
        return found
    conf = context.getConf()  # a copy of the JVM's, through py4j: once per session
    if str(conf.get("spark.master", "local")).startswith("local"):
        found = DriverAddress("127.0.0.1", "127.0.0.1")
    else:
        host = conf.get("spark.driver.host")
        if not host:
            raise CompactionFailed("the Spark session names no spark.driver.host: the reading tasks could not "
                                   "reach the driver's channel")
        found = DriverAddress(conf.get("spark.driver.bindAddress") or host, host)
    _ADDRESSES[context] = found
    return found


_ADDRESSES: weakref.WeakKeyDictionary[Any, DriverAddress] = weakref.WeakKeyDictionary()


class RunChannel:
    """One run's registration: its token, its tasks' connections, what they reported, and what the driver
    pushes to them. Made before the server is needed; ``endpoint`` registers it (and starts the server).
    Every method may be called from any thread, and after ``close``."""

    def __init__(self, client_secrets: Mapping[str, Any] | None = None,
                 store_secrets: Mapping[str, Any] | None = None) -> None:
        self.token = secrets.token_urlsafe(32)
        self._secrets = dict(client_secrets or {})
        # The ledger root's credentials (an S3 root's keys: ``engine.worker_store``), welcomed as the Kafka secrets are.
        self._store_secrets = dict(store_secrets or {})
        self._lock = threading.Lock()
        self._server: ChannelServer | None = None
        self._connections: set[_Connection] = set()
        self._reports: dict[str, dict[str, Any]] = {}
        self._cancelled = False
        self._rate: float | None = None
        self._plan: Any = _UNSET  # the spec handed, None when declined
        self._plan_waiters: list[_Connection] = []
        self.closed = False

    # -- the driver's calls -----------------------------------------------------------------------

    def endpoint(self, address: DriverAddress) -> dict[str, Any]:
        """What the run's tasks get in their spec to reach it: host, port, token, and whether they must ask
        for the Kafka client's secrets. Registers the run with the process's server at ``address``."""
        server = ChannelServer.shared(address)
        with self._lock:
            if self._server is None and not self.closed:
                self._server = server
                server.register(self)
        return {"host": server.address.host, "port": server.port, "token": self.token,
                "secrets": bool(self._secrets or self._store_secrets)}

    def progress(self) -> TailRead:
        """The tasks' last reports, summed."""
        with self._lock:
            reports = list(self._reports.values())
        return sum_reports(reports)

    def cancel(self) -> None:
        """Stop the run's tasks at their next check (and tasks that connect later, at once)."""
        with self._lock:
            self._cancelled = True
            connections = list(self._connections)
        self._push(connections, {"t": "cancel"})

    def set_rate(self, rate: float) -> None:
        """Give each reading task ``rate`` bytes per second from its next check."""
        with self._lock:
            self._rate = float(rate)
            connections = list(self._connections)
        self._push(connections, {"t": "rate", "rate": float(rate)})

    def hand_plan(self, spec: dict[str, Any] | None) -> bool:
        """Hand the tasks waiting for their plan ``spec`` (None: they are not needed, and end without reading).
        False when a plan was decided already: by an earlier call, or by the tasks' wait running out (the
        first decision is the one every task follows)."""
        with self._lock:
            if self._plan is not _UNSET:
                return False
            self._plan = spec
            waiters, self._plan_waiters = self._plan_waiters, []
        if spec is not None:
            log.debug("the run's plan is handed to its early reading tasks (%d waiting)", len(waiters))
        self._push(waiters, {"t": "plan", "spec": spec})
        return True

    def close(self) -> None:
        """End the registration: the token no longer admits anyone, and the tasks still connected lose the
        channel (they stop reading and fail)."""
        with self._lock:
            self.closed = True
            server, self._server = self._server, None
            connections = list(self._connections)
            self._connections.clear()
        if server is not None:
            server.unregister(self, connections)

    # -- the server's calls (its loop's thread) ---------------------------------------------------

    def admit(self, connection: _Connection, wants_secrets: bool) -> bool:
        """Take ``connection`` in and welcome it with the run's state; False when the run is closed or full."""
        with self._lock:
            if self.closed or len(self._connections) >= MAX_CONNECTIONS_PER_RUN:
                return False
            self._connections.add(connection)
            welcome: dict[str, Any] = {"t": "welcome", "cancel": self._cancelled, "rate": self._rate}
            if wants_secrets:
                welcome["secrets"] = self._secrets
                welcome["store_secrets"] = self._store_secrets
        connection.send(encode(welcome))
        return True

    def drop(self, connection: _Connection) -> None:
        with self._lock:
            self._connections.discard(connection)
            if connection in self._plan_waiters:
                self._plan_waiters.remove(connection)

    def received(self, connection: _Connection, message: dict[str, Any]) -> None:
        """A task's message.

        :raises FrameError: one the channel does not know, or malformed.
        """
        kind = message["t"]
        if kind == "progress":
            key, report = message.get("key"), message.get("report")
            if not isinstance(key, str) or not isinstance(report, dict):
                raise FrameError("a progress message without its key and report")
            with self._lock:
                before = self._reports.get(key)
                self._reports[key] = report
            if before is not None and report.get("rate") != before.get("rate"):
                log.debug("the reading task of range %s reads at %s bytes per second from now", key,
                          report.get("rate"))
            if report.get("done"):
                connection.send(encode({"t": "ack"}))
        elif kind == "plan":
            limit = message.get("limit_s")
            if not isinstance(limit, (int, float)) or not 0 <= limit <= 3600:
                raise FrameError("a plan request without its wait (limit_s, 0 to 3600 seconds)")
            with self._lock:
                plan = self._plan
                if plan is _UNSET:
                    self._plan_waiters.append(connection)
            if plan is _UNSET:
                asyncio.get_running_loop().call_later(float(limit), self._plan_wait_ended)
            else:
                connection.send(encode({"t": "plan", "spec": plan}))
        else:
            raise FrameError(f"a message of an unknown kind {kind!r}")

    def _plan_wait_ended(self) -> None:
        """A task's wait for its plan ran out: unless the driver decided meanwhile, every task ends unread."""
        if self.hand_plan(None):
            log.debug("the early reading tasks stopped waiting for their plan")

    def _push(self, connections: list[_Connection], message: dict[str, Any]) -> None:
        """Send ``message`` to ``connections``; from another thread than the server's, return once it is in
        their sockets (at most ``PUSH_WAIT_S``), so that a task's next check after a ``cancel`` or a
        ``set_rate`` sees it."""
        if not connections:
            return
        frame = encode(message)
        loop = connections[0].loop
        with contextlib.suppress(RuntimeError):
            if asyncio.get_running_loop() is loop:  # the server's own thread: it must not wait for itself
                for connection in connections:
                    connection.send(frame)
                return

        async def send_all() -> None:
            for connection in connections:
                connection.send(frame)
            await asyncio.gather(*(connection.drain() for connection in connections), return_exceptions=True)

        with contextlib.suppress(RuntimeError, concurrent.futures.TimeoutError):  # a stopped loop; a slow reader
            asyncio.run_coroutine_threadsafe(send_all(), loop).result(PUSH_WAIT_S)


class _Connection:
    """A task's connection, written to only on the server's loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, writer: asyncio.StreamWriter) -> None:
        self.loop = loop
        self._writer = writer

    def send(self, frame: bytes) -> None:
        if not self._writer.is_closing():
            self._writer.write(frame)

    async def drain(self) -> None:
        if not self._writer.is_closing():
            await self._writer.drain()

    def close(self) -> None:
        self._writer.close()

    def refuse_busy(self) -> None:
        """Close a connection that has not authenticated, to make room (``busy``: a task connects again)."""
        self.send(_BUSY)
        self._writer.close()

    def close_threadsafe(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.close)


class ChannelServer:
    """The process's server (``shared``): a thread running an asyncio loop."""

    _shared: ClassVar[dict[DriverAddress, ChannelServer]] = {}
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls, address: DriverAddress) -> ChannelServer:
        """The server at ``address``, started on first use.

        :raises CompactionFailed: it cannot listen there.
        """
        with cls._shared_lock:
            server = cls._shared.get(address)
            if server is None:
                server = cls._shared[address] = cls(address)
            return server

    def __init__(self, address: DriverAddress) -> None:
        self.address = address
        self._runs: list[RunChannel] = []
        self._runs_lock = threading.Lock()
        # Connections waiting for their hello, oldest first (a dict keeps the order they were accepted in).
        self._pending: dict[_Connection, None] = {}
        self._evicted = 0  # strangers closed to make room since the last log line about them
        self._evictions_logged_at: float | None = None
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        failed: list[BaseException] = []
        self._thread = threading.Thread(target=self._serve, args=(started, failed), name="compactord-channel",
                                        daemon=True)
        self._thread.start()
        started.wait()
        if failed:
            raise CompactionFailed(f"the driver's channel to its reading tasks cannot listen on {address.bind}: "
                                   f"{failed[0]}") from failed[0]

    def _serve(self, started: threading.Event, failed: list[BaseException]) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            server = self._loop.run_until_complete(asyncio.start_server(self._connected, self.address.bind, 0))
            self.port: int = server.sockets[0].getsockname()[1]
        except OSError as exc:
            failed.append(exc)
            started.set()
            return
        log.debug("the driver's channel listens on %s:%d", self.address.bind, self.port)
        started.set()
        self._loop.run_forever()

    def register(self, run: RunChannel) -> None:
        with self._runs_lock:
            self._runs.append(run)

    def unregister(self, run: RunChannel, connections: list[_Connection]) -> None:
        with self._runs_lock:
            if run in self._runs:
                self._runs.remove(run)
        for connection in connections:
            connection.close_threadsafe()

    def _run_of(self, token: Any) -> RunChannel | None:
        if not isinstance(token, str):
            return None
        with self._runs_lock:
            runs = list(self._runs)
        found = None
        for run in runs:  # compared in constant time, every one: the token is the run's only credential
            if hmac.compare_digest(run.token.encode(), token.encode()):
                found = run
        return found

    def _make_room(self) -> None:
        """Close the oldest connections that have not authenticated until one more fits in ``MAX_PENDING``."""
        while len(self._pending) >= MAX_PENDING:
            oldest = next(iter(self._pending))
            del self._pending[oldest]
            oldest.refuse_busy()
            self._evicted += 1
        now = time.monotonic()
        if self._evicted and (self._evictions_logged_at is None
                              or now - self._evictions_logged_at >= EVICTION_LOG_EVERY_S):
            log.warning("the driver's channel on %s:%d closed %d connection(s) that had not presented a run's "
                        "token (at most %d may wait for theirs at once): another process connects to it",
                        self.address.bind, self.port, self._evicted, MAX_PENDING)
            self._evicted, self._evictions_logged_at = 0, now

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(self._loop, writer)
        self._make_room()
        self._pending[connection] = None
        hello: dict[str, Any] = {}
        try:
            hello = await asyncio.wait_for(_read_frame(reader, MAX_HELLO_BYTES), HELLO_TIMEOUT_S)
            run = self._run_of(hello.get("token")) if hello["t"] == "hello" else None
        except (OSError, EOFError, FrameError, asyncio.IncompleteReadError, TimeoutError):
            run = None
        finally:
            self._pending.pop(connection, None)
        if run is None or not run.admit(connection, bool(hello.get("secrets"))):
            writer.close()
            return
        try:
            while True:
                run.received(connection, await _read_frame(reader))
        except (OSError, EOFError, asyncio.IncompleteReadError) as exc:
            log.debug("a reading task's channel closed: %s", exc or type(exc).__name__)
        except FrameError as exc:
            log.warning("a reading task broke the channel's format, its connection is closed: %s", exc)
        finally:
            run.drop(connection)
            writer.close()


async def _read_frame(reader: asyncio.StreamReader, bound: int = MAX_FRAME_BYTES) -> dict[str, Any]:
    """The next frame's message.

    :raises FrameError: it breaks the format, or announces more than ``bound`` bytes.
    """
    length = frame_length(await reader.readexactly(HEADER_BYTES))
    if length > bound:
        raise FrameError(f"a frame of {length} bytes announced, over the {bound}-byte bound of a hello")
    return decode(await reader.readexactly(length))
