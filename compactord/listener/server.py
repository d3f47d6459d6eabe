"""The listener's TCP servers: one asyncio event loop in a thread of its own, a server per address of
``kafkaListeners`` (TLS on SSL and SASL_SSL ones), each connection's requests answered in order (as a broker
answers them), on SASL listeners only once it authenticated (``auth``). Bounds: at most
``kafkaMaxConnections`` connections (one more is closed at once), a request frame of at most
``MAX_REQUEST_BYTES``; a frame that is larger, or that does not decode, closes its own connection only, with
one log line.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import struct
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from kafka.protocol.api_key import ApiKey

from compactord.config_values import listener_addresses, tls_context
from compactord.errors import ConfigError
from compactord.listener.auth import Authentication, Passwords
from compactord.listener.handlers import Handlers, Session
from compactord.listener.protocol import (
    REFUSED,
    SASL,
    SERVED,
    MalformedFrame,
    Request,
    api_versions,
    decode_request,
    refusal,
    refusal_error,
    unsupported,
)
from compactord.listener.relay import BrokerRelay
from compactord.listener.view import ListenerHost, TopicView
from compactord.listener.warm import Warmer

__all__ = ["MAX_REQUEST_BYTES", "KafkaListener"]

log = logging.getLogger(__name__)

# The largest request frame read: a Fetch of thousands of partitions is far below it; a produce the listener
# refuses anyway may be above it, and closes its connection.
MAX_REQUEST_BYTES = 8 * 1024 * 1024
_SIZE = struct.Struct(">i")
_START_TIMEOUT_S = 30.0
# How long a connection to a SASL listener has to authenticate.
AUTHENTICATION_S = 10.0


class _Failed(Exception):
    """A request whose handler failed: the connection it came on is closed."""


class KafkaListener:
    """Serves the compacted view over Kafka's protocol while started; ``start`` binds every address (a bind that
    fails raises, naming the address), ``stop`` closes the servers and their connections."""

    def __init__(self, host: ListenerHost) -> None:
        settings = host.settings
        self._binds = listener_addresses(settings.kafka_listeners)
        advertised = listener_addresses(settings.kafka_advertised_listeners) \
            if settings.kafka_advertised_listeners else self._binds
        if len(advertised) != len(self._binds):
            raise ConfigError("kafkaAdvertisedListeners", settings.kafka_advertised_listeners,
                              f"one address for each of kafkaListeners ({len(self._binds)})")
        self._advertised = advertised
        # The rules between the keys (config_load) hold: a token makes every listener SASL_*, and SSL ones have
        # their files, which load.
        self._passwords = Passwords((settings.http_auth_token, settings.http_read_token))
        self._tls = tls_context(settings.kafka_tls_cert_file, settings.kafka_tls_key_file) \
            if any(scheme.endswith("SSL") for scheme, _, _ in self._binds) else None
        self._max_connections = settings.kafka_max_connections
        self._idle_s = settings.kafka_connections_max_idle_ms / 1000
        self._connections = 0
        self._refusing = False
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kafka-listener")
        self._relay = BrokerRelay(settings.kafka_bootstrap_servers, settings.kafka_client_id,
                                  settings.kafka_request_timeout_ms / 1000)
        self._metrics = host.metrics
        view = TopicView(host)
        self._handlers = Handlers(view, self._relay, self._executor, host.metrics)
        self._warmer = Warmer(view, host.store)
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._servers: list[asyncio.Server] = []
        self._writers: set[asyncio.StreamWriter] = set()
        self.ports: list[int] = []

    def start(self) -> KafkaListener:
        """:raises ConfigError: an address of kafkaListeners cannot be bound (in use, not this host's)."""
        started: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, args=(started,), name="kafka-listener", daemon=True)
        self._thread.start()
        try:
            started.result(_START_TIMEOUT_S)
        except OSError as exc:
            self.stop()
            raise ConfigError("kafkaListeners", ",".join(f"{s}://{h}:{p}" for s, h, p in self._binds),
                              f"addresses this host can listen on ({exc.strerror or exc})") from exc
        self._warmer.start()
        for (scheme, host, port), (_, bind, _), bound in zip(self._advertised, self._binds, self.ports, strict=True):
            log.info("Kafka listener on %s://%s:%d (read-only; advertised as %s:%d)", scheme, bind or "0.0.0.0",
                     bound, host, port or bound)
        return self

    def _run(self, started: Future[None]) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._bind())
        except OSError as exc:
            started.set_exception(exc)
            return
        started.set_result(None)
        self._loop.run_forever()

    async def _bind(self) -> None:
        for index, (scheme, host, port) in enumerate(self._binds):
            server = await asyncio.start_server(functools.partial(self._connection, index=index), host or None,
                                                port, reuse_address=True,
                                                ssl=self._tls if scheme.endswith("SSL") else None)
            self._servers.append(server)
            self.ports.append(server.sockets[0].getsockname()[1])

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(_START_TIMEOUT_S)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_START_TIMEOUT_S)
        self._thread = None
        if not self._loop.is_running():
            self._loop.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._warmer.stop()

    async def _close(self) -> None:
        for server in self._servers:
            server.close()
        for writer in list(self._writers):
            writer.close()
        self._relay.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- one connection ---------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        peer = writer.get_extra_info("peername")
        if self._connections >= self._max_connections:
            if not self._refusing:  # once until the count falls below the bound again
                log.warning("Kafka listener: kafkaMaxConnections=%d connections are open; refusing more",
                            self._max_connections)
                self._refusing = True
            writer.close()
            return
        self._connections += 1
        self._metrics.listener_connections.inc()
        self._writers.add(writer)
        _, host, port = self._advertised[index]
        session = Session(host or "127.0.0.1", port or self.ports[index])
        auth = Authentication(self._passwords if self._binds[index][0].startswith("SASL_") else None)
        try:
            while True:
                # A silent connection holds a slot of kafkaMaxConnections: one that does not authenticate, or
                # that sends nothing for kafkaConnectionsMaxIdleMs, is closed.
                waited = self._idle_s if auth.authenticated else min(self._idle_s, AUTHENTICATION_S)
                try:
                    frame = await asyncio.wait_for(self._frame(reader, peer), waited)
                except TimeoutError:
                    log.info("Kafka listener: connection from %s closed: %s", peer,
                             f"no request in {waited:g} s (kafkaConnectionsMaxIdleMs)" if auth.authenticated
                             else f"not authenticated within {waited:g} s")
                    return
                if frame is None:
                    return
                answer, closes = await self._exchange(frame, auth, session)
                writer.write(answer)
                await writer.drain()
                if closes is not None:
                    log.warning("Kafka listener: connection from %s closed: %s", peer, closes)
                    return
        except MalformedFrame as exc:
            log.warning("Kafka listener: connection from %s closed: %s", peer, exc)
        except _Failed:
            pass  # logged with its traceback
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        finally:
            self._connections -= 1
            self._metrics.listener_connections.dec()
            if self._connections < self._max_connections:
                self._refusing = False
            self._writers.discard(writer)
            session.close()
            writer.close()

    @staticmethod
    async def _frame(reader: asyncio.StreamReader, peer: Any) -> bytes | None:
        """The next request frame; None at the end of the stream.

        :raises MalformedFrame: its size is not positive or above ``MAX_REQUEST_BYTES``."""
        head = await reader.read(_SIZE.size)
        if not head:
            return None
        if len(head) < _SIZE.size:
            head += await reader.readexactly(_SIZE.size - len(head))
        (size,) = _SIZE.unpack(head)
        if not 0 < size <= MAX_REQUEST_BYTES:
            raise MalformedFrame(f"a frame of {size} bytes (at most {MAX_REQUEST_BYTES})")
        return await reader.readexactly(size)

    async def _exchange(self, frame: bytes, auth: Authentication, session: Session) -> tuple[bytes, str | None]:
        """The answer to a frame, and why the connection closes after it (None: it stays open)."""
        if auth.expects_token:
            outcome = auth.token(frame)
            self._count("SaslAuthenticate", outcome.error)
            return outcome.answer, outcome.closes
        request = decode_request(frame)
        refused = auth.refusal(request)
        if refused is not None:
            self._count(request.api_name, "ILLEGAL_SASL_STATE")
            return b"", refused
        if request.api_key in SASL and request.body is not None:
            outcome = auth.answer(request)
            self._count(request.api_name, outcome.error)
            return outcome.answer, outcome.closes
        return await self._answer(request, session), None

    def _count(self, api: str, error: str) -> None:
        self._metrics.listener_requests.labels(api=api, error=error).inc()

    async def _answer(self, request: Request, session: Session) -> bytes:
        key = request.api_key
        error = "NONE"
        try:
            if key == ApiKey.ApiVersions:
                return api_versions(request)
            if request.body is None:  # an API or a version the listener does not serve
                error = "UNSUPPORTED_VERSION"
                return unsupported(request)
            if key in REFUSED:
                error = refusal_error(request)
                return refusal(request)
            assert key in SERVED
            try:
                return await self._handlers.answer(request, session)
            except Exception as exc:  # a defect: its traceback, and the connection closed (the client reconnects)
                error = "UNKNOWN_SERVER_ERROR"
                log.exception("Kafka listener: %s v%d failed", request.api_name, request.version)
                raise _Failed from exc
        finally:
            self._count(request.api_name, error)
