"""The reader's settings: compactionReaderClient (kept for older config files), and the broker's security
settings mapped from kafka-python's names to librdkafka's (checked by librdkafka itself: a consumer is built
from them)."""

from __future__ import annotations

import logging
import shutil
import subprocess
from operator import attrgetter
from pathlib import Path

import pyarrow as pa
import pytest

from compactord.config import Settings, settings_from_properties
from compactord.engine.kafka_fetch.base import Polled, RecordFields
from compactord.engine.kafka_fetch.librdkafka import librdkafka_config, range_consumer
from compactord.engine.merge import columns_to_batch
from compactord.errors import ConfigError


def settings(**props: str) -> Settings:
    return settings_from_properties(props, env={})


def _start_warnings(caplog: pytest.LogCaptureFixture, **props: str) -> list[str]:
    from compactord.server import _warnings

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="compactord"):
        _warnings(settings(**props))
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_reader_client_key_still_loads_and_refuses_what_it_never_accepted() -> None:
    assert settings().compaction_reader_client == "auto"
    for value in ("auto", "librdkafka", "kafka-python"):
        assert settings(compactionReaderClient=value).compaction_reader_client == value
    with pytest.raises(ConfigError, match="compactionReaderClient.*auto, librdkafka, kafka-python"):
        settings(compactionReaderClient="java")


def test_kafka_python_as_the_reader_client_is_one_warning_at_start(caplog: pytest.LogCaptureFixture) -> None:
    (warning,) = _start_warnings(caplog, compactionReaderClient="kafka-python")
    assert "compactionReaderClient=kafka-python is no longer available" in warning
    assert "librdkafka" in warning
    assert _start_warnings(caplog, compactionReaderClient="auto") == []
    assert _start_warnings(caplog, compactionReaderClient="librdkafka") == []


def test_the_reading_tasks_are_shipped_no_reader_choice() -> None:
    from compactord.engine.job import JobWidths, _reader_spec, job_spec
    from compactord.engine.strategies import ResolvedStrategy

    strategy = ResolvedStrategy.resolve("publishing-order", "timestamp", False)
    for value in ("auto", "kafka-python", "librdkafka"):
        spec = job_spec(settings(compactionReaderClient=value), strategy, topic="t", ranges=[], ledger_files=[],
                        output_path="/x", log_start={}, widths=JobWidths(0, 0))
        assert "reader_client" not in _reader_spec(spec)


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


# -- the columns of a poll ---------------------------------------------------------------------------


def _polled(offsets: list[int], counted: list[int]) -> Polled:
    """Record objects with attribute fields (kafka-python's), whose offset getter counts its calls."""
    from kafka.consumer.fetcher import ConsumerRecord

    def offset_of(record: ConsumerRecord) -> int:
        counted.append(record.offset)
        return record.offset

    records = [ConsumerRecord("t", 0, -1, o, 1_700_000_000_000 + o, 0, b"k%d" % o, b"v", [], None, 2, 1, 0)
               for o in offsets]
    fields = RecordFields(offset_of, *(attrgetter(f) for f in ("timestamp", "key", "value", "headers")))
    return Polled(records, fields)


def test_consecutive_offsets_are_counted_out_without_reading_each_record() -> None:
    counted: list[int] = []
    column = _polled(list(range(1_000, 1_500)), counted).offset_column()
    assert column.type == pa.int64()
    assert column.to_pylist() == list(range(1_000, 1_500))
    assert sorted(counted) == [1_000, 1_499]  # the first and the last record only
    assert _polled([], counted).offset_column().to_pylist() == []


@pytest.mark.parametrize("offsets", [[5, 6, 8, 9], [0, 2], [7], [3, 4, 5, 6, 7, 8, 9, 11]])
def test_offsets_with_a_gap_are_read_from_every_record(offsets: list[int]) -> None:
    counted: list[int] = []
    polled = _polled(offsets, counted)
    assert polled.offset_column().to_pylist() == offsets
    assert polled.offset_column().to_pylist() == polled.offsets


def test_a_batch_from_an_offset_column_equals_one_from_a_list_with_and_without_markers() -> None:
    offsets = [10, 11, 12, 13]
    columns = ([1, 2, 3, 4], [b"a", b"b", b"c", b"d"], [b"1", None, b"3", b"4"], [None, [(b"h", b"v")], None, None],
               [1, 2, 3, 4])
    for markers in (None, {11: 99}):
        from_list = columns_to_batch(3, offsets, *columns, markers=markers)
        from_arrow = columns_to_batch(3, pa.array(offsets, pa.int64()), *columns, markers=markers)
        assert from_arrow.equals(from_list)
        assert from_list.column("marker").to_pylist() == [False, markers is not None, False, False]
    plain = columns_to_batch(0, pa.array(offsets, pa.int64()), *columns[:3], [None] * 4, columns[4])
    assert plain.column("headers").to_pylist() == [[], [], [], []]
    assert plain.column("marker").to_pylist() == [False] * 4
    assert plain.column("marker_at").null_count == 4
