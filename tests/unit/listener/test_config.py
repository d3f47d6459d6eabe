"""The listener's keys (kafkaListeners, kafkaAdvertisedListeners, kafkaMaxConnections): off by default, PLAINTEXT
only for now, and never open by accident: a non-loopback address without a token refuses the start (exit 2), as
the HTTP API's does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from compactord.config import ENV_PREFIX, Settings, settings_from_properties
from compactord.config_values import listener_addresses
from compactord.errors import ConfigError


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


@pytest.mark.parametrize(("props", "message"), [
    ({"kafkaListeners": "SASL_SSL://127.0.0.1:9093"}, "SASL_SSL is not supported yet"),
    ({"kafkaListeners": "127.0.0.1:9092"}, "is not SCHEME://host:port"),
    ({"kafkaListeners": "PLAINTEXT://127.0.0.1:70000"}, "is not SCHEME://host:port"),
    ({"kafkaListeners": "PLAINTEXT://0.0.0.0:9092"}, "a non-loopback address needs httpAuthToken"),
    ({"kafkaListeners": "PLAINTEXT://:9092"}, "a non-loopback address needs httpAuthToken"),
    ({"kafkaListeners": "PLAINTEXT://127.0.0.1:9092", "kafkaSecurityProtocol": "SSL"}, "over PLAINTEXT only"),
    ({"kafkaListeners": "PLAINTEXT://127.0.0.1:9092",
      "kafkaAdvertisedListeners": "PLAINTEXT://a:1,PLAINTEXT://b:2"}, "one address for each of kafkaListeners"),
])
def test_a_listener_that_cannot_be_served_safely_is_refused(props: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings(**props)


@pytest.mark.parametrize("props", [{"httpAuthToken": "s3cret"}, {"httpAllowUnauthenticated": "true"}])
def test_a_non_loopback_listener_is_served_with_a_token_or_on_purpose(props: dict[str, str]) -> None:
    assert settings(kafkaListeners="PLAINTEXT://0.0.0.0:9092", **props).kafka_listeners == "PLAINTEXT://0.0.0.0:9092"


def test_an_open_listener_refuses_the_start_with_exit_2_and_one_line(tmp_path: Path) -> None:
    (tmp_path / "broker.conf").write_text("kafkaListeners=PLAINTEXT://0.0.0.0:9092\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    done = subprocess.run([sys.executable, "-m", "compactord", "run", "--config", "broker.conf"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("compactord: cannot start: config key kafkaListeners="), done.stderr
    assert "a non-loopback address needs httpAuthToken" in done.stderr
