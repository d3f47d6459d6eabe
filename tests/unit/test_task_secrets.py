"""No secret in what the driver ships to Spark's tasks: the Kafka client's passwords reach a task over the
run's channel, to a task that presents the run's token, and are in no spec, option or pickled closure."""

from __future__ import annotations

import functools
import json

from pyspark import cloudpickle

from compactord.config import KAFKA_SECRET_ARGS, Settings, settings_from_properties
from compactord.engine import kafka_source
from compactord.engine.channel import TaskChannel, client_config
from compactord.engine.early_start import EarlyStart
from compactord.engine.job import JobWidths, _reader_spec, job_spec, writing_tasks_spec
from compactord.engine.kafka_source import KafkaRangeReader, OffsetRange
from compactord.engine.strategies import ResolvedStrategy
from tests.support.channel import LOOPBACK, run_channel

SASL_PASSWORD = "sasl-pw-4f1c9e"
TLS_KEY_PASSWORD = "tls-key-pw-82b7d0"


def secured(tmp_path) -> Settings:
    """SASL over TLS, the SASL password given inline and the key's password as ``file:``."""
    key_password = tmp_path / "key-password"
    key_password.write_text(TLS_KEY_PASSWORD + "\n")
    return settings_from_properties({
        "kafkaBootstrapServers": "b1:9093", "kafkaSecurityProtocol": "SASL_SSL", "kafkaSaslMechanism": "PLAIN",
        "kafkaSaslUsername": "compactord", "kafkaSaslPassword": SASL_PASSWORD, "kafkaSslCafile": "/ca.pem",
        "kafkaSslCertfile": "/cert.pem", "kafkaSslKeyfile": "/key.pem",
        "kafkaSslPassword": f"file:{key_password}"}, env={})


def shipped(settings: Settings, endpoint: dict[str, object], tmp_path) -> dict[str, bytes]:
    """What a run of ``settings`` ships to its tasks, as PySpark serializes it."""
    strategy = ResolvedStrategy.resolve("publishing-order", "timestamp", False)
    spec = job_spec(settings, strategy, topic="t", ranges=[OffsetRange(0, 0, 10), OffsetRange(1, 0, 10)],
                    ledger_files=[], output_path=str(tmp_path / "out"), log_start={0: 0, 1: 0},
                    widths=JobWidths(0, 0), channel=endpoint)
    options = _reader_spec(spec)  # the data source's option; its reader is pickled to the executors
    tasks = writing_tasks_spec(spec, strategy.strategy)
    assert tasks is not None
    early = EarlyStart(None, "g", "d", None, {0: 0, 1: 0}, EarlyStart.stub(settings, "t", endpoint), 2)  # type: ignore[arg-type]
    return {
        "data source option": options.encode(),
        "data source reader": cloudpickle.dumps(KafkaRangeReader(json.loads(options))),
        "writing tasks' closure": cloudpickle.dumps(functools.partial(kafka_source._write_groups, tasks)),
        "early start's closure": cloudpickle.dumps(early._task),
    }


def test_no_password_is_in_what_the_driver_ships_and_the_tasks_get_them_over_the_channel(tmp_path) -> None:
    settings = secured(tmp_path)
    assert set(settings.kafka_client_secrets()) == KAFKA_SECRET_ARGS == {"sasl_plain_password", "ssl_password"}
    with run_channel(settings.kafka_client_secrets()) as channel:
        endpoint = channel.endpoint(LOOPBACK)
        payloads = shipped(settings, endpoint, tmp_path)
        for what, data in payloads.items():
            assert SASL_PASSWORD.encode() not in data, f"the SASL password is in the {what}"
            assert TLS_KEY_PASSWORD.encode() not in data, f"the TLS key's password is in the {what}"
            assert b"compactord" in data and b"/key.pem" in data, f"the {what} lacks the client's other settings"
        # A task of the run, with what it was shipped, makes the driver's own client configuration.
        stub = EarlyStart.stub(settings, "t", endpoint)
        task = TaskChannel(stub["channel"])
        assert client_config(stub, task) == settings.kafka_client_config()


def test_the_split_keeps_every_argument_once() -> None:
    settings = settings_from_properties({"kafkaSecurityProtocol": "SASL_PLAINTEXT", "kafkaSaslUsername": "u",
                                         "kafkaSaslPassword": "p"}, env={})
    public, secret = settings.kafka_client_config(secrets=False), settings.kafka_client_secrets()
    assert secret == {"sasl_plain_password": "p"}
    assert not set(public) & set(secret)
    assert {**public, **secret} == settings.kafka_client_config()
