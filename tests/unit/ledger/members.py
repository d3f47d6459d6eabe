"""A cluster member's ledger store (``OwnershipGuard``) in a process of its own, driven over a pipe by a test: two
members are two processes sharing one root, as two daemons on one host (a local root) or two hosts (S3) are.

The test sends ``(operation, args)`` and gets ``("ok", result)`` or ``("error", code, class name, message)`` for a
``CompactordError``; ``Member`` turns the latter into ``Refused``. A task of a topic is two operations, ``begin``
(its ledger id, a finalized ledger, and the pointer it switches against, read as a task reads it when it starts) and
``commit`` (the switch), so that a test takes the topic over in between.
"""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from compactord.errors import CompactordError
from compactord.ledger.layout import POLICIES, ledger_prefix
from compactord.ledger.ownership import OwnershipGuard
from compactord.ledger.pointer import Pointer
from compactord.ledger.store import LedgerStore
from compactord.storage import ObjectStore, open_described
from tests.support.timeouts import STOP_TIMEOUT_S, TASK_TIMEOUT_S

__all__ = ["Member", "Refused"]


class Refused(Exception):
    """A member's operation failed with a ``CompactordError`` (its ``code`` and class name)."""

    def __init__(self, code: str, name: str, message: str) -> None:
        super().__init__(f"{name} ({code}): {message}")
        self.code, self.name = code, name


class Member:
    """A member process on the root ``objects`` names, of ``cluster``; stopped by ``stop`` (the test's fixture)."""

    def __init__(self, objects: ObjectStore, cluster: str, lease_seconds: float) -> None:
        context = multiprocessing.get_context("spawn")  # the test process runs threads: no fork
        self._conn, child = context.Pipe()
        self.process = context.Process(target=serve, args=(child, objects.descriptor(), objects.credentials(),
                                                          cluster, lease_seconds), daemon=True)
        self.process.start()
        child.close()

    def __call__(self, operation: str, *args: Any) -> Any:
        self.send(operation, *args)
        return self.answer(operation)

    def send(self, operation: str, *args: Any) -> None:
        self._conn.send((operation, args))

    def answer(self, operation: str) -> Any:
        if not self._conn.poll(TASK_TIMEOUT_S):
            raise AssertionError(f"the member did not answer {operation!r} within {TASK_TIMEOUT_S:g} s")
        answer = self._conn.recv()
        if answer[0] == "error":
            raise Refused(*answer[1:])
        return answer[1]

    def stop(self) -> None:
        try:
            if self.process.is_alive():
                with contextlib.suppress(OSError, AssertionError, Refused):
                    self("stop")
            self.process.join(STOP_TIMEOUT_S)
        finally:
            if self.process.is_alive():
                self.process.kill()
                self.process.join(STOP_TIMEOUT_S)
            self._conn.close()


def serve(conn: Connection, descriptor: dict[str, Any], credentials: dict[str, str], cluster: str,
          lease_seconds: float) -> None:
    objects = open_described(descriptor, credentials)
    root = str(descriptor["root"])
    membership = {"current": True}
    guard = OwnershipGuard(objects, root, cluster, lambda: membership["current"], lease_seconds=lease_seconds)
    store = LedgerStore(root, objects, lease_seconds=lease_seconds, recovery_per_second=0, guard=guard)
    tasks: dict[str, tuple[int, Pointer]] = {}

    def ledger(topic: str, finalized: bool) -> int:
        ledger_id, _ = store.allocate_ledger(topic)
        prefix = ledger_prefix(topic, ledger_id)
        objects.put(f"{prefix}part-00000.parquet", b"a part of ledger %d" % ledger_id)
        if finalized:  # a switch asks only that the manifest exists
            objects.put(f"{prefix}manifest.json", b"{}")
        return ledger_id

    def begin(topic: str) -> int:
        ledger_id = ledger(topic, True)
        tasks[topic] = (ledger_id, store.switch_base(topic))
        return ledger_id

    def commit(topic: str) -> int | None:
        ledger_id, base = tasks.pop(topic)
        return store.switch(topic, ledger_id, base).ledger

    def delete(topic: str) -> None:
        store.mark_deleting(topic)
        store.delete_topic(topic)

    def set_membership(current: bool) -> None:
        membership["current"] = current

    operations: dict[str, Callable[..., Any]] = {
        "open": lambda: bool(store.open()),
        "take": store.take,
        "release": store.release_topic,
        "epoch": guard.fence,
        "current": store.current_ledger_id,
        "sole_writer": guard.sole_writer,
        "allocate": lambda topic, n=1: [store.allocate_ledger(topic)[0] for _ in range(n)],
        "orphan": lambda topic: ledger(topic, False),
        "begin": begin,
        "commit": commit,
        "delete": delete,
        "put_policies": lambda topic: bool(store.put_topic_object(topic, POLICIES, b'{"thresholdBytes": 1}')),
        "membership": set_membership,
    }
    try:
        while True:
            operation, args = conn.recv()
            if operation == "stop":
                store.close()
                conn.send(("ok", None))
                return
            try:
                result = operations[operation](*args)
            except CompactordError as exc:
                conn.send(("error", exc.code, type(exc).__name__, str(exc)))
            else:
                conn.send(("ok", result))
    finally:
        store.close()
        conn.close()
