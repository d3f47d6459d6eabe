"""The listener's keys (kafkaListeners, kafkaAdvertisedListeners, kafkaTlsCertFile, kafkaTlsKeyFile,
kafkaMaxConnections): off by default, and failing closed as the HTTP API does: with a token every listener takes
SASL/PLAIN, without one none can and a non-loopback one refuses the start (exit 2) unless on purpose; SSL
listeners have a certificate and key that load."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from compactord.config import ENV_PREFIX, Settings, settings_from_properties
from compactord.config_values import listener_addresses
from compactord.errors import ConfigError
from tests.support.certs import self_signed


def settings(**props: str) -> Settings:
    return settings_from_properties(props, env={})


def test_the_listener_is_off_by_default() -> None:
    got = settings()
    assert (got.kafka_listeners, got.kafka_advertised_listeners, got.kafka_max_connections) == ("", "", 1000)


def test_loopback_plaintext_addresses_are_taken_as_written() -> None:
    got = settings(kafkaListeners="PLAINTEXT://127.0.0.1:9092, PLAINTEXT://[::1]:0",
                   kafkaAdvertisedListeners="PLAINTEXT://localhost:9092,PLAINTEXT://localhost:9093")
    assert got.kafka_listeners == "PLAINTEXT://127.0.0.1:9092,PLAINTEXT://[::1]:0"
    assert listener_addresses(got.kafka_listeners) == [("PLAINTEXT", "127.0.0.1", 9092), ("PLAINTEXT", "::1", 0)]


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The TLS keys of a certificate and key that load."""
    cert, key = self_signed(tmp_path_factory.mktemp("pem"))
    return {"kafkaTlsCertFile": str(cert), "kafkaTlsKeyFile": f"file:{key}"}


def test_every_scheme_is_taken_with_what_it_needs(pem: dict[str, str]) -> None:
    listeners = "SASL_PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9093"
    got = settings(kafkaListeners=listeners, httpAuthToken="s3cret", **pem,
                   kafkaAdvertisedListeners="SASL_PLAINTEXT://localhost:9092,SASL_SSL://kafka.example:9093")
    assert listener_addresses(got.kafka_listeners) == [("SASL_PLAINTEXT", "127.0.0.1", 9092),
                                                       ("SASL_SSL", "0.0.0.0", 9093)]
    assert got.kafka_tls_key_file == pem["kafkaTlsKeyFile"].removeprefix("file:")  # a path, never its contents
    open_ones = settings(kafkaListeners="PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9093", **pem)
    assert [s for s, _, _ in listener_addresses(open_ones.kafka_listeners)] == ["PLAINTEXT", "SSL"]


@pytest.mark.parametrize(("props", "message"), [
    ({"kafkaListeners": "SASL_GSSAPI://127.0.0.1:9093"},
     "SASL_GSSAPI is not one of PLAINTEXT, SASL_PLAINTEXT, SSL, SASL_SSL"),
    ({"kafkaListeners": "127.0.0.1:9092"}, "is not SCHEME://host:port"),
    ({"kafkaListeners": "PLAINTEXT://127.0.0.1:70000"}, "is not SCHEME://host:port"),
    ({"kafkaListeners": "PLAINTEXT://0.0.0.0:9092"},
     "PLAINTEXT://0.0.0.0:9092: a non-loopback address needs httpAuthToken"),
    ({"kafkaListeners": "PLAINTEXT://:9092"}, "a non-loopback address needs httpAuthToken"),
    ({"kafkaListeners": "PLAINTEXT://127.0.0.1:9092", "kafkaSecurityProtocol": "SSL"}, "over PLAINTEXT only"),
    ({"kafkaListeners": "PLAINTEXT://127.0.0.1:9092",
      "kafkaAdvertisedListeners": "PLAINTEXT://a:1,PLAINTEXT://b:2"}, "one address for each of kafkaListeners"),
    # A token: every listener takes it.
    ({"kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:9092,PLAINTEXT://127.0.0.1:9093", "httpAuthToken": "t"},
     ("PLAINTEXT://127.0.0.1:9093 takes no password while httpAuthToken is set: use SASL_PLAINTEXT:// or "
     "SASL_SSL://")),
    ({"kafkaListeners": "SSL://127.0.0.1:9093", "httpAuthToken": "t"},
     "SSL://127.0.0.1:9093 takes no password while httpAuthToken is set"),
    # No token: no password to check.
    ({"kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:9092"}, "SASL_PLAINTEXT://127.0.0.1:9092 needs httpAuthToken"),
    ({"kafkaListeners": "SASL_SSL://127.0.0.1:9092", "httpAllowUnauthenticated": "true"},
     "SASL_SSL://127.0.0.1:9092 needs httpAuthToken"),
    # Advertised in the listeners' order, with their schemes.
    ({"kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:9092", "httpAuthToken": "t",
      "kafkaAdvertisedListeners": "PLAINTEXT://kafka.example:9092"},
     ("kafkaAdvertisedListeners='PLAINTEXT://kafka.example:9092' is invalid: the scheme of each of kafkaListeners "
     "in order: PLAINTEXT:// is advertised for SASL_PLAINTEXT://127.0.0.1:9092")),
    # TLS without its files.
    ({"kafkaListeners": "SSL://127.0.0.1:9093"}, ("kafkaTlsCertFile='' is invalid: required by an SSL:// or "
                                                 "SASL_SSL:// listener")),
    ({"kafkaListeners": "SASL_SSL://127.0.0.1:9093", "httpAuthToken": "t", "kafkaTlsCertFile": "/no/such.pem",
      "kafkaTlsKeyFile": "/no/key.pem"}, "kafkaTlsCertFile='/no/such.pem' is invalid: a readable PEM file"),
])
def test_a_listener_that_cannot_be_served_safely_is_refused(props: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        settings(**props)


def test_a_certificate_that_does_not_load_with_its_key_is_refused(pem: dict[str, str], tmp_path: Path) -> None:
    listener = {"kafkaListeners": "SSL://127.0.0.1:9093"}
    with pytest.raises(ConfigError, match="a PEM certificate whose private key is kafkaTlsKeyFile") as refused:
        settings(**listener, **{**pem, "kafkaTlsKeyFile": pem["kafkaTlsCertFile"]})
    assert "PRIVATE KEY" not in str(refused.value)
    cert, key = self_signed(tmp_path, encrypted=True)  # refused, never a prompt for its password
    with pytest.raises(ConfigError, match="not encrypted"):
        settings(**listener, kafkaTlsCertFile=str(cert), kafkaTlsKeyFile=str(key))


@pytest.mark.parametrize(("listener", "props"), [
    ("SASL_PLAINTEXT://0.0.0.0:9092", {"httpAuthToken": "s3cret"}),
    ("PLAINTEXT://0.0.0.0:9092", {"httpAllowUnauthenticated": "true"}),
])
def test_a_non_loopback_listener_is_served_with_a_token_or_on_purpose(listener: str, props: dict[str, str]) -> None:
    assert settings(kafkaListeners=listener, **props).kafka_listeners == listener


def refused_start(folder: Path, config: str) -> str:
    """``compactord run`` on ``config`` (broker.conf's text) in ``folder``: its stderr, once it is seen to refuse the
    start with exit 2 and one line naming the key kafkaListeners."""
    (folder / "broker.conf").write_text(config)
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    done = subprocess.run([sys.executable, "-m", "compactord", "run", "--config", "broker.conf"], cwd=folder,
                          capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("compactord: cannot start: config key kafkaListeners="), done.stderr
    return done.stderr


def test_an_open_listener_refuses_the_start_with_exit_2_and_one_line(tmp_path: Path) -> None:
    stderr = refused_start(tmp_path, "kafkaListeners=PLAINTEXT://0.0.0.0:9092\n")
    assert "a non-loopback address needs httpAuthToken" in stderr


def test_a_plaintext_listener_with_a_token_refuses_the_start_with_exit_2_and_one_line(tmp_path: Path) -> None:
    stderr = refused_start(tmp_path, "httpAuthToken=s3cret\nkafkaListeners=PLAINTEXT://127.0.0.1:9092\n")
    assert "takes no password while httpAuthToken is set: use SASL_PLAINTEXT:// or SASL_SSL://" in stderr
    assert "s3cret" not in stderr
