"""Run the daemon: its HTTP API served by uvicorn in the foreground, SIGTERM handling, exit codes."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from compactord.api.app import create_app
from compactord.api.limits import ABORT_KEY, PROBE_PATHS
from compactord.api.views import error_response
from compactord.config import Settings, start_warnings
from compactord.daemon.core import Daemon
from compactord.daemon.logs import configure_logging
from compactord.embedded import EmbeddedBroker, free_port, port_is_free
from compactord.errors import (
    CompactordError,
    ConfigError,
    InsufficientDiskSpace,
    LedgerRootUnwritable,
    MalformedRequest,
    ServerBusy,
)
from compactord.listener import KafkaListener

__all__ = ["EXIT_CONFIG", "EXIT_IOERR", "EXIT_SPARK_DIED", "ThreadedServer", "refuse_start", "serve"]

log = logging.getLogger("compactord")
#: A bad config value: the same start would fail again, so the systemd unit does not restart (its
#: ``RestartPreventExitStatus``).
EXIT_CONFIG = 2
#: The Kafka listener of ``run --embedded-broker`` (on loopback), when the port is free.
EMBEDDED_LISTENER_PORT = 9094
#: ``EX_IOERR``: the ledger root cannot be written at start; a disk not mounted yet may come back, so the
#: unit restarts a few times (``StartLimitBurst``) before it gives up.
EXIT_IOERR = 74
#: The Spark JVM died or hung (the daemon's watchdog): the supervisor restarts the daemon.
EXIT_SPARK_DIED = 70


def refuse_start(exc: CompactordError) -> int:
    """The one way the daemon refuses to start: one line on stderr, and the exit status for ``exc``."""
    message = " ".join(str(exc).split())  # one line, whatever the message holds
    print(f"compactord: cannot start: {message}", file=sys.stderr, flush=True)
    return EXIT_IOERR if isinstance(exc, (LedgerRootUnwritable, InsufficientDiskSpace)) else EXIT_CONFIG


# In-flight requests get the time to finish after SIGTERM, well within systemd's TimeoutStopSec=120
# (deploy/systemd/compactord.service), which must also cover the cancel of tasks and Spark's stop.
GRACEFUL_SHUTDOWN_S = 10
# How long a thread holds the GIL while others wait for it (Python's default: 5 ms). The event loop that
# answers the probes waits behind every busy thread (ledger reads, the driver's), once per event: 1 ms
# keeps /healthz fast under load, for little switching cost.
GIL_SWITCH_INTERVAL_S = 0.001
# Connections beyond twice httpMaxConnections: room for probes, scrapers and idle kept-alive clients.
SPARE_CONNECTIONS = 50


class _H11Protocol(H11Protocol):
    """uvicorn's h11 protocol, closing also a connection whose next request's headers do not arrive within
    httpIdleTimeoutSeconds of its start or of the last response: uvicorn's keep-alive timer starts only
    after a first response and stops at the first byte of the next request, so a connection that never
    sends a request, or sends headers that never end, would be held forever."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # uvicorn answers past its limit_concurrency in plain text: the same bound, with the API's JSON error.
        limit, self.limit_concurrency = self.limit_concurrency, None
        app = self.app

        async def bounded(scope: Any, receive: Any, send: Any) -> None:
            # The API may cut off a client that takes nothing of its answer (``api/limits.py``).
            scope[ABORT_KEY] = self.transport.abort
            # This request's own task is counted already, hence ">" where uvicorn has ">=". A probe or a
            # scrape always answers: a flood of idle connections must not make a healthy daemon look dead.
            if limit is None or scope.get("path") in PROBE_PATHS:
                await app(scope, receive, send)
            elif len(self.connections) > limit or len(self.tasks) > limit:
                await _too_many_connections(scope, receive, send, limit)
            else:
                await app(scope, receive, send)

        self.app = bounded

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers a request its parser refuses in plain text: the API's JSON error instead.
        body = json.dumps({"error": MalformedRequest.code, "message": (
            "the request is not well-formed HTTP/1.1 (a request target must be ASCII: percent-encode other "
            "characters)")}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers), h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._headers_deadline(None)

    def on_response_complete(self) -> None:
        done = self.cycle  # before a pipelined request's cycle replaces it
        super().on_response_complete()
        self._headers_deadline(done)

    def _headers_deadline(self, last: object) -> None:
        self.loop.call_later(self.timeout_keep_alive, self._no_request, last)

    def _no_request(self, last: object) -> None:
        if self.cycle is last:  # no request began since the deadline was set
            self.timeout_keep_alive_handler()


async def _too_many_connections(scope: Any, receive: Any, send: Any, limit: int) -> None:
    response = error_response(ServerBusy(
        f"the server holds {limit} connections already (2 x httpMaxConnections + {SPARE_CONNECTIONS}); retry later"))
    response.headers["Connection"] = "close"
    response.headers["Retry-After"] = "1"
    await response(scope, receive, send)


def uvicorn_config(daemon: Daemon, host: str, port: int) -> uvicorn.Config:
    """The one uvicorn configuration of the API (``serve`` and ``ThreadedServer``)."""
    settings = daemon.settings
    return uvicorn.Config(
        create_app(daemon), host=host, port=port, log_level="warning", access_log=False, lifespan="off",
        http=_H11Protocol,
        # The API queues, then answers 503 server_busy, past httpMaxConnections requests in flight; this bound
        # counts connections, idle ones and the probes' too, so it is set above it (answered in JSON too).
        limit_concurrency=2 * settings.http_max_connections + SPARE_CONNECTIONS,
        timeout_keep_alive=settings.http_idle_timeout_seconds,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        ssl_certfile=settings.http_tls_cert_file or None, ssl_keyfile=settings.http_tls_key_file or None,
    )


def _warnings(settings: Settings) -> None:
    # A non-loopback address without a token is refused by the config's rules (config_load._check_http).
    master = settings.spark_master
    if not master.startswith("local") and not settings.compacted_ledger_root.startswith("s3://"):
        log.warning("sparkMaster=%s runs executors on other machines: compactedLedgerRoot=%s must be a path every "
                    "executor and this daemon can reach (a shared mount at the same path)", master,
                    Path(settings.compacted_ledger_root).resolve())
    if settings.compaction_reader_client == "kafka-python":
        log.warning("compactionReaderClient=kafka-python is no longer available: the topic is read with librdkafka "
                    "(remove the key from the config)")
    for line in start_warnings(settings):
        log.warning("%s", line)


def serve(settings: Settings, embedded_broker: bool = False) -> int:
    configure_logging(settings.log_format, settings.log_level)
    broker = None
    try:
        if embedded_broker:
            broker = EmbeddedBroker.on_default_port()
            settings = settings.with_overrides(kafka_bootstrap_servers=broker.bootstrap)
            log.info("embedded broker at %s: produce there (bootstrap servers of any Kafka client); memory "
                     "storage: its topics vanish when it stops", broker.bootstrap)
            if not settings.kafka_listeners:  # the trial reads its view with any Kafka client too, on loopback
                port = EMBEDDED_LISTENER_PORT if port_is_free(EMBEDDED_LISTENER_PORT) else free_port()
                # With a token it takes the token as every listener must (SASL/PLAIN): fails closed as the API does.
                scheme = "SASL_PLAINTEXT" if settings.http_auth_token else "PLAINTEXT"
                settings = settings.with_overrides(kafka_listeners=f"{scheme}://127.0.0.1:{port}")
        _warnings(settings)
        try:
            daemon = Daemon(settings)
        except CompactordError as exc:
            return refuse_start(exc)
        daemon.embedded_broker = broker is not None
        server = uvicorn.Server(uvicorn_config(daemon, settings.http_bind_address, settings.http_port))
        daemon.watchdog.on_fatal = lambda: setattr(server, "should_exit", True)
        # uvicorn re-raises the signal it caught once it has stopped; this handler makes that a no-op so
        # that the orderly shutdown below runs and the exit code is 0.
        signal.signal(signal.SIGTERM, lambda *_: None)
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        # What start-up made (the modules, the app, then Spark's gateway) lives as long as the process:
        # frozen, it is left out of the cyclic collector's full passes, which would otherwise scan it all
        # during reads and make the read API's slow tail (docs/performance.md).
        gc.freeze()
        daemon.on_warm = gc.freeze
        try:  # the Kafka listener (kafkaListeners) serves reads from now on, as the API does
            listener = KafkaListener(daemon).start() if settings.kafka_listeners else None
        except CompactordError as exc:
            daemon.shutdown()
            return refuse_start(exc)
        daemon.start()
        scheme = "https" if settings.http_tls_cert_file else "http"
        log.info("compactord API on %s://%s:%d (ledgers in %s)", scheme, settings.http_bind_address,
                 settings.http_port, daemon.store.location)
        try:
            server.run()
        finally:
            if listener is not None:
                listener.stop()
            daemon.shutdown()
        watchdog = daemon.watchdog
        if isinstance(watchdog.fatal_cause, ConfigError):  # a spark.* value the JVM refused: it would again
            return refuse_start(watchdog.fatal_cause)
        return EXIT_SPARK_DIED if watchdog.fatal else 0
    finally:
        if broker is not None:
            broker.stop()


class ThreadedServer:
    """The HTTP API of an in-process daemon, served by uvicorn in a thread (the demo, tests)."""

    def __init__(self, daemon: Daemon, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://{host}:{self.port}"
        self._server = uvicorn.Server(uvicorn_config(daemon, host, self.port))
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 30.0) -> ThreadedServer:
        self._thread = threading.Thread(target=self._server.run, name="http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise CompactordError(f"the HTTP server did not start on {self.url}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(30)
