"""No secret in what the driver ships to Spark's tasks: the Kafka client's passwords reach a task over the
run's channel, to a task that presents the run's token, and are in no spec, option or pickled closure."""

from __future__ import annotations

import functools
import json

from pyspark import cloudpickle

from compactord.config import KAFKA_SECRET_ARGS, Settings, settings_from_properties
from compactord.engine import job, kafka_source, ledger_io, worker_store
from compactord.engine.channel import TaskChannel, client_config
from compactord.engine.early_start import EarlyStart
from compactord.engine.job import JobWidths, _reader_spec, job_spec, writing_tasks_spec
from compactord.engine.kafka_source import KafkaRangeReader, OffsetRange
from compactord.engine.strategies import ResolvedStrategy
from compactord.storage import ObjectStore
from compactord.storage.s3 import S3Options, S3Store
from tests.support.channel import LOOPBACK, run_channel

SASL_PASSWORD = "sasl-pw-4f1c9e"
TLS_KEY_PASSWORD = "tls-key-pw-82b7d0"
S3_ACCESS_KEY = "AKIA3EXAMPLE71C0"
S3_SECRET_KEY = "s3-secret-6e0d2b91"


def secured(tmp_path) -> Settings:
    """SASL over TLS, the SASL password given inline and the key's password as ``file:``."""
    key_password = tmp_path / "key-password"
    key_password.write_text(TLS_KEY_PASSWORD + "\n")
    return settings_from_properties({
        "kafkaBootstrapServers": "b1:9093", "kafkaSecurityProtocol": "SASL_SSL", "kafkaSaslMechanism": "PLAIN",
        "kafkaSaslUsername": "compactord", "kafkaSaslPassword": SASL_PASSWORD, "kafkaSslCafile": "/ca.pem",
        "kafkaSslCertfile": "/cert.pem", "kafkaSslKeyfile": "/key.pem",
        "kafkaSslPassword": f"file:{key_password}"}, env={})


def shipped(settings: Settings, endpoint: dict[str, object], tmp_path, store: ObjectStore | None = None
            ) -> dict[str, bytes]:
    """What a run of ``settings`` ships to its tasks, as PySpark serializes it (``store``: its ledger root)."""
    strategy = ResolvedStrategy.resolve("publishing-order", "timestamp", False)
    spec = job_spec(settings, strategy, topic="t", ranges=[OffsetRange(0, 0, 10), OffsetRange(1, 0, 10)],
                    ledger_files=[], output_path=str(tmp_path / "out") if store is None else "t/ledger-1",
                    log_start={0: 0, 1: 0}, widths=JobWidths(0, 0), channel=endpoint, store=store)
    options = _reader_spec(spec)  # the data source's option; its reader is pickled to the executors
    tasks = writing_tasks_spec(spec, strategy.strategy)
    assert tasks is not None
    early = EarlyStart(None, "g", "d", None, {0: 0, 1: 0}, EarlyStart.stub(settings, "t", endpoint), 2)  # type: ignore[arg-type]
    access = job._task_access(spec)  # the grouping job's reading and writing tasks'
    return {
        "data source option": options.encode(),
        "data source reader": cloudpickle.dumps(KafkaRangeReader(json.loads(options))),
        "writing tasks' closure": cloudpickle.dumps(functools.partial(kafka_source._write_groups, tasks)),
        "early start's closure": cloudpickle.dumps(early._task),
        "grouping job's reading closure": cloudpickle.dumps(functools.partial(ledger_io._read_tasks, [], access)),
        "grouping job's writing closure": cloudpickle.dumps(
            functools.partial(ledger_io._write_partition, spec.output_path, access)),
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
            if "grouping" not in what:  # the grouping job's ledger tasks make no Kafka client
                assert b"compactord" in data and b"/key.pem" in data, f"the {what} lacks the client's other settings"
        # A task of the run, with what it was shipped, makes the driver's own client configuration.
        stub = EarlyStart.stub(settings, "t", endpoint)
        task = TaskChannel(stub["channel"])
        assert client_config(stub, task) == settings.kafka_client_config()


def test_the_job_spec_shows_neither_the_run_s_token_nor_a_password(tmp_path) -> None:
    """The token is shipped to the tasks (they present it to the channel), and nowhere else: a job's spec
    printed in a log line or an error holds neither it nor the Kafka client's secrets."""
    settings = secured(tmp_path)
    strategy = ResolvedStrategy.resolve("publishing-order", "timestamp", False)
    with run_channel(settings.kafka_client_secrets()) as channel:
        endpoint = channel.endpoint(LOOPBACK)
        spec = job_spec(settings, strategy, topic="t", ranges=[OffsetRange(0, 0, 10)], ledger_files=[],
                        output_path=str(tmp_path / "out"), log_start={0: 0}, widths=JobWidths(0, 0), channel=endpoint)
    shown = f"{spec!r} {spec}"
    assert "topic='t'" in shown
    for secret in (endpoint["token"], SASL_PASSWORD, TLS_KEY_PASSWORD):
        assert secret not in shown


def test_the_split_keeps_every_argument_once() -> None:
    settings = settings_from_properties({"kafkaSecurityProtocol": "SASL_PLAINTEXT", "kafkaSaslUsername": "u",
                                         "kafkaSaslPassword": "p"}, env={})
    public, secret = settings.kafka_client_config(secrets=False), settings.kafka_client_secrets()
    assert secret == {"sasl_plain_password": "p"}
    assert not set(public) & set(secret)
    assert {**public, **secret} == settings.kafka_client_config()


def test_the_s3_root_s_keys_are_in_nothing_shipped_and_reach_a_task_over_the_channel(tmp_path, monkeypatch) -> None:
    """An S3 root: its endpoint, region and encryption are in the spec, its access keys only in the channel's
    welcome; a task opens the same store with them."""
    settings = secured(tmp_path)
    options = S3Options(region="eu-west-3", endpoint="http://127.0.0.1:9", access_key_id=S3_ACCESS_KEY,
                        secret_access_key=S3_SECRET_KEY, server_side_encryption="AES256")
    store = S3Store("ledgers", "prod/compacted", options)
    with run_channel(settings.kafka_client_secrets(), worker_store.store_secrets(store)) as channel:
        endpoint = channel.endpoint(LOOPBACK)
        payloads = shipped(settings, endpoint, tmp_path, store)
        for what, data in payloads.items():
            assert S3_SECRET_KEY.encode() not in data, f"the S3 secret key is in the {what}"
            assert S3_ACCESS_KEY.encode() not in data, f"the S3 access key id is in the {what}"
            if "early" not in what:  # the early tasks get the root with their plan, over the channel
                assert b"s3://ledgers/prod/compacted" in data, f"the {what} does not name the root"
        spec = json.loads(payloads["data source option"])
        assert spec["store"]["s3"]["server_side_encryption"] == "AES256"
        monkeypatch.setattr(worker_store, "_opened", {})  # a worker's process: the driver's store is not in it
        opened = worker_store.spec_store(spec, TaskChannel(endpoint))
    assert isinstance(opened, S3Store) and opened is not store
    assert (opened.bucket, opened.prefix) == ("ledgers", "prod/compacted")
    assert opened.options == options
