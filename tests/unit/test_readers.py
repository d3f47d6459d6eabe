"""The reader backends' settings: compactionReaderClient, and the broker's security settings mapped from
kafka-python's names to librdkafka's (checked by librdkafka itself: a consumer is built from them)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from compactord.config import Settings, settings_from_properties
from compactord.engine.readers import CLIENTS, resolve_client
from compactord.engine.readers.librdkafka import librdkafka_config, range_consumer
from compactord.errors import ConfigError


def settings(**props: str) -> Settings:
    return settings_from_properties(props, env={})


def test_the_reader_client_key_defaults_to_auto_and_refuses_other_values() -> None:
    assert settings().compaction_reader_client == "auto"
    assert settings(compactionReaderClient="kafka-python").compaction_reader_client == "kafka-python"
    with pytest.raises(ConfigError, match="compactionReaderClient.*auto, librdkafka, kafka-python"):
        settings(compactionReaderClient="java")


def test_auto_is_librdkafka_when_confluent_kafka_imports() -> None:
    # confluent-kafka is a dependency: installed, ``auto`` must pick it.
    assert resolve_client("auto") == "librdkafka"
    assert [resolve_client(c) for c in CLIENTS[1:]] == ["librdkafka", "kafka-python"]
    with pytest.raises(ValueError, match="one of auto, librdkafka, kafka-python"):
        resolve_client("rdkafka")


def test_the_job_spec_carries_the_resolved_client() -> None:
    from compactord.engine.job import JobWidths, _reader_spec, job_spec
    from compactord.engine.strategies import ResolvedStrategy

    strategy = ResolvedStrategy.resolve("publishing-order", "timestamp", False)
    for value, want in (("auto", "librdkafka"), ("kafka-python", "kafka-python"), ("librdkafka", "librdkafka")):
        spec = job_spec(settings(compactionReaderClient=value), strategy, topic="t", ranges=[], ledger_files=[],
                        output_path="/x", log_start={}, progress_dir="/p", widths=JobWidths(0, 0))
        assert spec.reader_client == want
        assert f'"reader_client": "{want}"' in _reader_spec(spec)


_SECURITY = dict(kafkaBootstrapServers="b1:9093,b2:9093", kafkaClientId="me", kafkaRequestTimeoutMs="5000",
                 kafkaSaslMechanism="SCRAM-SHA-512", kafkaSaslUsername="user", kafkaSaslPassword="pw",
                 kafkaSslCafile="/ca.pem", kafkaSslCertfile="/cert.pem", kafkaSslKeyfile="/key.pem",
                 kafkaSslPassword="keypw", kafkaSslCheckHostname="false")


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"])
def test_security_settings_map_to_librdkafka_names(protocol: str) -> None:
    cfg = librdkafka_config(settings(kafkaSecurityProtocol=protocol, **_SECURITY).kafka_client_config())
    want = {"bootstrap.servers": "b1:9093,b2:9093", "client.id": "me", "socket.timeout.ms": 5000,
            "security.protocol": protocol}
    if protocol.startswith("SASL"):
        want.update({"sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "user", "sasl.password": "pw"})
    if protocol.endswith("SSL"):
        want.update({"ssl.ca.location": "/ca.pem", "ssl.certificate.location": "/cert.pem",
                     "ssl.key.location": "/key.pem", "ssl.key.password": "keypw",
                     "ssl.endpoint.identification.algorithm": "none"})
    assert cfg == want


def test_hostname_checking_maps_to_https_identification() -> None:
    cfg = librdkafka_config(settings(kafkaSecurityProtocol="SSL").kafka_client_config())
    assert cfg["ssl.endpoint.identification.algorithm"] == "https"
    assert not {"ssl.ca.location", "ssl.certificate.location", "ssl.key.location"} & cfg.keys()


def test_a_setting_without_a_mapping_is_refused_not_dropped() -> None:
    with pytest.raises(ValueError, match="'sasl_oauth_token_provider' has no librdkafka equivalent"):
        librdkafka_config({"bootstrap_servers": ["b:1"], "sasl_oauth_token_provider": object()})


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a key pair")
def test_librdkafka_accepts_the_mapped_sasl_ssl_settings(tmp_path: Path) -> None:
    """librdkafka checks every property name and loads the CA, certificate and encrypted key when the
    consumer is made: a wrong name or a key password that does not reach it fails here."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=compactord-test", "-passout", "pass:keypw"],
                   check=True, capture_output=True)
    props = dict(_SECURITY, kafkaSecurityProtocol="SASL_SSL", kafkaSslCafile=str(cert),
                 kafkaSslCertfile=str(cert), kafkaSslKeyfile=str(key), kafkaBootstrapServers="127.0.0.1:1")
    consumer = range_consumer(settings(**props).kafka_client_config())
    consumer.close()
    props["kafkaSslPassword"] = "wrong"
    with pytest.raises(Exception, match="(?i)ssl|key"):
        range_consumer(settings(**props).kafka_client_config()).close()
