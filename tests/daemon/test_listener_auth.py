"""The Kafka listener's authentication and TLS against the real daemon, read by librdkafka (confluent-kafka): one
daemon with httpAuthToken and httpReadToken set and two listeners, SASL_PLAINTEXT and SASL_SSL (a self-signed
certificate the client verifies as its CA). SASL/PLAIN with either token as the password (any user name) reads a
compacted topic's view; a wrong password is an authentication error and reads nothing; a client without SASL is
refused; a connection that does not authenticate (within 10 s, or the idle limit if shorter), or sends nothing for
kafkaConnectionsMaxIdleMs once it did, is closed; the tokens appear in neither the log nor /v1/info.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from compactord.embedded import free_port
from compactord.listener.server import AUTHENTICATION_S
from tests.support.certs import self_signed
from tests.support.daemon import DaemonProcess, compact, metric
from tests.support.listener import Record, compacted_view, poll
from tests.support.timeouts import TASK_TIMEOUT_S
from tests.support.waiting import wait_for

from .conftest import Launcher

PREFIX = "lsa"
PATTERN = f"{PREFIX}-[0-9]+-[0-9a-f]{{6}}"
TOKEN = "listener-admin-t0ken-8f2c"
READ_TOKEN = "listener-read-t0ken-41ad"
IDLE_MS = 4000


@dataclass(frozen=True)
class Secured:
    daemon: DaemonProcess
    plain: str  # SASL_PLAINTEXT's bootstrap address
    tls: str  # SASL_SSL's
    ca: Path  # the listener's certificate, the CA a client verifies


@pytest.fixture(scope="module")
def secured(launch: Launcher, tmp_path_factory: pytest.TempPathFactory) -> Secured:
    folder = tmp_path_factory.mktemp("listener-tls")
    cert, key = self_signed(folder)
    read_token = folder / "read-token"
    read_token.write_text(READ_TOKEN + "\n")
    plain, tls = free_port(), free_port()
    daemon = launch("listener-auth", token=TOKEN, compactionTopicsPattern=PATTERN, httpReadToken=f"file:{read_token}",
                    kafkaListeners=f"SASL_PLAINTEXT://127.0.0.1:{plain},SASL_SSL://127.0.0.1:{tls}",
                    kafkaTlsCertFile=f"file:{cert}", kafkaTlsKeyFile=key, kafkaConnectionsMaxIdleMs=str(IDLE_MS))
    return Secured(daemon, f"127.0.0.1:{plain}", f"127.0.0.1:{tls}", cert)


def _config(bootstrap: str, password: str | None, ca: Path | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "group.id": "listener-auth-unused",
                              "enable.auto.commit": False, "enable.partition.eof": True,
                              "auto.offset.reset": "error"}
    if password is not None:
        config.update({"security.protocol": "SASL_SSL" if ca else "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                       "sasl.username": "any", "sasl.password": password})
    if ca is not None:
        config["ssl.ca.location"] = str(ca)  # the test's certificate is the one CA trusted: verified, not skipped
    return config


@pytest.fixture
def consumers() -> Iterator[list[Consumer]]:
    made: list[Consumer] = []
    try:
        yield made
    finally:
        for consumer in made:
            consumer.close()


def _read(consumer: Consumer, topic: str) -> list[Record]:
    """Partition 0 from offset 0 to its end."""
    consumer.assign([TopicPartition(topic, 0, 0)])
    return poll(consumer)


def test_either_token_reads_the_compacted_view_over_sasl_plaintext_and_sasl_ssl(
        secured: Secured, kafka: Any, consumers: list[Consumer]) -> None:
    topic = kafka.topic(prefix=PREFIX)
    kafka.produce(topic, [(f"k{i % 3}", f"v{i}") for i in range(12)])
    compact(secured.daemon, topic)
    view = compacted_view(secured.daemon, topic)
    assert view and len(view) == 3

    for bootstrap, password, ca in ((secured.plain, f"token:{TOKEN}", None),
                                    (secured.tls, f"token:{READ_TOKEN}", secured.ca),
                                    (secured.tls, f"token:{TOKEN}", secured.ca)):
        consumers.append(Consumer(_config(bootstrap, password, ca)))
        assert _read(consumers[-1], topic) == view, (bootstrap, password)


def test_a_wrong_password_is_an_authentication_error_and_reads_nothing(
        secured: Secured, kafka: Any, consumers: list[Consumer]) -> None:
    topic = kafka.topic(prefix=PREFIX)
    kafka.produce(topic, [("a", "1")])
    compact(secured.daemon, topic)
    failed = {"api": "SaslAuthenticate", "error": "SASL_AUTHENTICATION_FAILED"}
    before = metric(secured.daemon, "compactord_listener_requests_total", **failed) or 0.0
    errors: list[KafkaError] = []
    config = _config(secured.tls, f"token:{TOKEN}-wrong", secured.ca) | {"error_cb": errors.append}
    consumers.append(Consumer(config))
    consumers[-1].assign([TopicPartition(topic, 0, 0)])

    def refused() -> bool:
        message = consumers[-1].poll(1.0)
        assert message is None or message.error() is not None, "a record read with a wrong password"
        if message is not None:
            errors.append(message.error())
        return any(e.code() == KafkaError._AUTHENTICATION for e in errors)

    wait_for(refused, TASK_TIMEOUT_S, "librdkafka's authentication error", secured.daemon)
    reason = next(e.str() for e in errors if e.code() == KafkaError._AUTHENTICATION)
    assert "Authentication failed" in reason, reason
    assert (metric(secured.daemon, "compactord_listener_requests_total", **failed) or 0.0) > before
    wait_for(lambda: "user 'any' gave a wrong password" in secured.daemon.log_text(), TASK_TIMEOUT_S,
             "the failed authentication's log line", secured.daemon)


def test_a_client_without_sasl_is_refused(secured: Secured, consumers: list[Consumer]) -> None:
    consumers.append(Consumer(_config(secured.plain, None)))
    with pytest.raises(KafkaException):
        consumers[-1].list_topics(timeout=10)

    # A Metadata request before authentication: the connection closes, with no answer.
    request = MetadataRequest(topics=None)
    request.API_VERSION = 1
    request.with_header(correlation_id=1, client_id="no-sasl")
    host, port = secured.plain.split(":")
    with socket.create_connection((host, int(port)), timeout=TASK_TIMEOUT_S) as sock:
        sock.sendall(bytes(request.encode(header=True, framed=True)))
        assert sock.recv(1024) == b""
    wait_for(lambda: "Metadata before authentication" in secured.daemon.log_text(), TASK_TIMEOUT_S,
             "the refused request's log line", secured.daemon)


def _frame(message: Any, version: int) -> bytes:
    message.API_VERSION = version
    message.with_header(correlation_id=1, client_id="silent")
    return bytes(message.encode(header=True, framed=True))


def _closed_after(sock: socket.socket) -> float:
    """Seconds until the listener closes ``sock`` (reading and dropping any answer before)."""
    started = time.monotonic()
    while sock.recv(4096):
        pass
    return time.monotonic() - started


def test_a_connection_that_does_not_authenticate_or_then_sends_nothing_is_closed(secured: Secured) -> None:
    host, port = secured.plain.split(":")
    with socket.create_connection((host, int(port)), timeout=TASK_TIMEOUT_S) as sock:
        # A slot of kafkaMaxConnections held for no one: closed after 10 s, or the idle limit if shorter.
        assert _closed_after(sock) >= min(AUTHENTICATION_S, IDLE_MS / 1000) - 1
    wait_for(lambda: f"not authenticated within {min(AUTHENTICATION_S, IDLE_MS / 1000):g} s"
             in secured.daemon.log_text(),
             TASK_TIMEOUT_S, "the closed connection's log line", secured.daemon)

    with socket.create_connection((host, int(port)), timeout=TASK_TIMEOUT_S) as sock:
        sock.sendall(_frame(SaslHandshakeRequest(mechanism="PLAIN"), 1))
        sock.sendall(_frame(SaslAuthenticateRequest(auth_bytes=b"\x00reader\x00token:" + READ_TOKEN.encode()), 0))
        # Authenticated: its answers come, then, once nothing more is sent, the close after the idle limit.
        assert _closed_after(sock) >= IDLE_MS / 1000 - 1
    wait_for(lambda: f"no request in {IDLE_MS / 1000:g} s (kafkaConnectionsMaxIdleMs)" in secured.daemon.log_text(),
             TASK_TIMEOUT_S, "the idle connection's log line", secured.daemon)


def test_the_tokens_appear_in_neither_the_log_nor_info(secured: Secured) -> None:
    info = secured.daemon.http.get("/v1/info")
    assert info.status_code == 200, info.text
    assert secured.plain in info.text  # the listeners are shown, their passwords not
    log = secured.daemon.log_text()
    assert "SASL_SSL://127.0.0.1" in log
    for secret in (TOKEN, READ_TOKEN, "PRIVATE KEY"):
        assert secret not in info.text and secret not in log, secret
