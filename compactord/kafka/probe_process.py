"""The driver's librdkafka reads (``librdkafka.first_records``, ``read_ends``, ``read_ends_many``) run in processes
of their own, so that a crash of librdkafka never takes the daemon (or an application's ``CompactedReader``) down.

librdkafka has crashed its process on metadata it did not expect: a consumer assigned to a topic that is deleted
and created again under its name, whose Fetch by topic id is answered for a topic it cannot name, dies on its
thread ``rdk:main`` (a NULL name in its metadata cache; librdkafka issues 4778, 4964 and 5093 are of this kind).
Deleting and recreating a topic is an operator's everyday act, and the reads it races are the ones that notice
it (the log-identity probe). A read in flight when its process dies is asked once more of a new process; a
second death is ``BrokerUnavailable``, the answer of a broker that failed the read. A read that outlives its
own time limit by ``HUNG_MARGIN_S`` counts as hung: its process is killed, and the next read starts another.

Each process (``python -m compactord.kafka.probe_worker``, started on demand and kept for the next reads, up to
``WORKERS`` at once) answers one read at a time on its stdin and stdout. A new interpreter, not a fork (the
daemon's threads are never forked) nor ``multiprocessing``'s spawn (which runs the parent's main script again:
an application's unguarded script would start itself over).
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any, TypeVar, cast

from compactord.errors import BrokerUnavailable

__all__ = ["HUNG_MARGIN_S", "WORKERS", "ProbeProcesses", "probe_processes"]

log = logging.getLogger(__name__)

T = TypeVar("T")
WORKERS = 4  # reads at once: a run's planning, the monitor and the API's identity checks overlap
HUNG_MARGIN_S = 30.0  # past a read's own time limit, what a loaded machine may still add
FRAME = struct.Struct(">I")  # each request and answer: its length, then its pickle


class _Died(Exception):
    pass


class _Hung(Exception):
    pass


class _Worker:
    """One process and its pipes."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "compactord.kafka.probe_worker"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def ask(self, ref: str, args: tuple[Any, ...], deadline: float) -> tuple[str, Any]:
        """:raises _Died: the process ended. :raises _Hung: no answer by ``deadline`` (``time.monotonic``)."""
        data = pickle.dumps((ref, args))
        stdin = cast(IO[bytes], self.process.stdin)
        try:
            stdin.write(FRAME.pack(len(data)) + data)
            stdin.flush()
        except (BrokenPipeError, OSError):
            raise _Died from None
        (size,) = FRAME.unpack(self._read(FRAME.size, deadline))
        answer: tuple[str, Any] = pickle.loads(self._read(size, deadline))  # our own child's answer
        return answer

    def _read(self, size: int, deadline: float) -> bytes:
        fd = cast(IO[bytes], self.process.stdout).fileno()
        got = bytearray()
        while len(got) < size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Hung
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, size - len(got))
                if not chunk:
                    raise _Died
                got += chunk
        return bytes(got)

    def exit_code(self) -> int | None:
        return self.process.poll()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()
        self.process.wait(10)


class ProbeProcesses:
    """Processes for librdkafka's reads: a dead or hung one is dropped, another is started for the next read.
    Thread-safe."""

    def __init__(self, workers: int = WORKERS, hung_margin_s: float = HUNG_MARGIN_S) -> None:
        self._workers = workers
        self._hung_margin_s = hung_margin_s
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._made = 0  # processes reading or idle
        self._closed = False
        self.restarts = 0  # processes dropped after a death or a hang

    def warm(self) -> None:
        """Start a process now (it imports librdkafka while the caller goes on), so that the first read finds one."""
        with self._cond:
            if self._closed or self._idle or self._made >= self._workers:
                return
        self._give(self._take())

    def call(self, fn: Callable[..., T], *args: Any, timeout_s: float, what: str) -> T:
        """``fn(*args)`` (a module-level function; ``args`` picklable) in one of the processes; what ``fn`` raises
        is raised here. ``timeout_s``: ``fn``'s own time limit. ``what``: the read, for the error (e.g.
        "a read of orders").

        :raises BrokerUnavailable: the process died twice under the read, or the read hung.
        """
        ref = f"{fn.__module__}:{fn.__qualname__}"
        for attempt in (1, 2):
            worker = self._take()
            try:
                status, value = worker.ask(ref, args, time.monotonic() + timeout_s + self._hung_margin_s)
            except _Died:
                self._drop(worker, f"died (exit {worker.exit_code()}) in {what}")
                if attempt == 2:
                    raise BrokerUnavailable(f"the Kafka client (librdkafka) crashed twice in {what}") from None
                continue
            except _Hung:
                self._drop(worker, f"hung in {what}: killed")
                raise BrokerUnavailable(f"the Kafka client (librdkafka) hung in {what}") from None
            except BaseException:
                self._drop(worker, None)  # interrupted mid-read: its pipe holds an answer no one will read
                raise
            self._give(worker)
            if status == "error":
                raise value
            return cast(T, value)
        raise AssertionError("unreachable")

    def _take(self) -> _Worker:
        with self._cond:
            while not self._idle and self._made >= self._workers and not self._closed:
                self._cond.wait()
            if self._closed:
                raise BrokerUnavailable("the Kafka client's processes are stopped: the daemon is stopping")
            if self._idle:
                return self._idle.pop()
            self._made += 1
        try:
            return _Worker()
        except BaseException:
            with self._cond:
                self._made -= 1
                self._cond.notify()
            raise

    def _give(self, worker: _Worker) -> None:
        with self._cond:
            if not self._closed:
                self._idle.append(worker)
                self._cond.notify()
                return
            self._made -= 1
        worker.kill()

    def _drop(self, worker: _Worker, why: str | None) -> None:
        if why is not None:
            log.warning("a process of the Kafka client (librdkafka) %s; the next read starts another", why)
        worker.kill()
        with self._cond:
            self._made -= 1
            self.restarts += why is not None
            self._cond.notify()

    def close(self) -> None:
        """Stop the idle processes now, the reading ones as their reads end; later reads are refused."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._made -= len(idle)
            self._cond.notify_all()
        for worker in idle:
            worker.kill()


_shared: ProbeProcesses | None = None
_shared_lock = threading.Lock()


def probe_processes() -> ProbeProcesses:
    """This process's pool (one for every ``KafkaAdmin`` in it)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ProbeProcesses()
        return _shared
