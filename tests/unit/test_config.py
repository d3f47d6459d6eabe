"""broker.conf -> ``Settings``: defaults, validation, environment overrides, secrets, aliases."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from compactord import config
from compactord.config import (
    DEFAULT_FACTORY,
    ENV_PREFIX,
    KEYS,
    PULSAR_DEFAULT_FACTORY,
    PULSAR_EVENT_TIME_FACTORY,
    Settings,
    load_settings,
    settings_from_properties,
)
from compactord.embedded import DEFAULT_PORT
from compactord.errors import ConfigError, ConfigFileError

EXAMPLE = Path(__file__).resolve().parents[2] / "broker.conf.example"


def settings(env: dict[str, str] | None = None, /, **props: str) -> Settings:
    return settings_from_properties(props, env={} if env is None else env)


# -- the keys (each a Settings field, so a key and its field cannot drift apart) ----------------------


def test_key_names_are_unique_and_not_spark_keys() -> None:
    names = [key.name for key in KEYS]
    assert len(names) == len(set(names))
    assert not [name for name in names if name.startswith("spark.")]


@pytest.mark.parametrize("key", KEYS, ids=lambda key: key.name)
def test_each_key_has_a_group_and_a_doc(key: config.Key) -> None:
    groups = ("broker", "storage", "compaction", "spark", "scheduler", "http", "listener", "cluster", "iceberg",
              "logging")
    assert key.group in groups
    assert key.doc.strip()


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().http_port = 1  # type: ignore[misc]


# -- bad values -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("httpPort", "abc", "whole number"),
        ("httpPort", "70000", "from 0 to 65535"),
        ("httpPort", "-1", "from 0 to 65535"),
        ("kafkaRequestTimeoutMs", "10", ">= 1000"),
        ("compactionMinDirtyRatio", "2", "from 0.0 to 1.0"),
        ("compactionMinDirtyRatio", "half", "a number"),
        ("logFormat", "xml", "text, json"),
        ("logLevel", "TRACE", "DEBUG, INFO, WARNING, ERROR"),
        ("kafkaSecurityProtocol", "TLS", "PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
        ("topicCompactionRetainNullKey", "yes", "true or false"),
        ("compactionTopicsPattern", "(", "regular expression"),
        ("kafkaBootstrapServers", "nohost", "host:port"),
        ("kafkaBootstrapServers", "a:1,b:99999", "host:port"),
        ("httpBindAddress", "example.com", "IP address"),
        ("storageSweepIntervalSeconds", "-1", "0 or a whole number from 1 to 86400 (60 or more recommended"),
        ("storageSweepMinAgeSeconds", "0", "a whole number from 1 to 604800 (60 or more recommended"),
        ("compactionEventTimeSource", "header:", "header:NAME"),
        ("compactionEventTimeSource", "offset", "header:NAME"),
    ],
)
def test_bad_value_names_key_value_and_what_is_allowed(key: str, value: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings(**{key: value})
    assert info.value.key == key
    assert info.value.value == value
    message = str(info.value)
    assert key in message
    assert repr(value) in message
    assert allowed in message


def test_a_sweep_interval_of_zero_turns_the_periodic_sweep_off() -> None:
    assert settings(storageSweepIntervalSeconds="0").storage_sweep_interval_seconds == 0
    assert settings(storageSweepIntervalSeconds="60").storage_sweep_interval_seconds == 60


@pytest.mark.parametrize("key", ["storageSweepIntervalSeconds", "storageSweepMinAgeSeconds"])
def test_a_sweep_timing_below_its_recommended_minimum_is_accepted_with_one_warning(key: str) -> None:
    """Tests run a daemon with a short sweep through the key an operator sets; production is told it is short."""
    attr = config.KEYS_BY_NAME[key].attr
    assert getattr(settings(**{key: "1"}), attr) == 1
    assert config.start_warnings(settings(**{key: "2"})) == [
        f"{key}=2 is below the recommended minimum 60: accepted, but meant for tests, not production"]
    assert config.start_warnings(settings(**{key: "60"})) == []
    assert config.start_warnings(Settings()) == []  # no default is below its own recommendation
    assert config.start_warnings(settings(storageSweepIntervalSeconds="0")) == []  # 0 = the start's sweep only


def test_run_with_a_sweep_timing_below_its_floor_exits_2_naming_key_value_and_range(tmp_path: Path) -> None:
    """The daemon refuses to start, before any broker or Spark, with the allowed range and the recommendation."""
    (tmp_path / "broker.conf").write_text("storageSweepMinAgeSeconds=0\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    done = subprocess.run([sys.executable, "-m", "compactord", "run", "--config", "broker.conf"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "compactord: cannot start: config key storageSweepMinAgeSeconds='0' is invalid: expected a whole number "
        "from 1 to 604800 (60 or more recommended; less is accepted with a warning)")


def test_no_key_exists_for_tests_only() -> None:
    """Tests hold tasks through a probe (``tests/support/probes.py``), not through a production key."""
    with pytest.raises(ConfigError, match="unknown key"):
        settings(compactionTestPausePoints="running:1")
    assert all("test" not in key.name.lower() for key in KEYS)


def test_unknown_key_is_named() -> None:
    with pytest.raises(ConfigError, match="compactionBogus") as info:
        settings(compactionBogus="1")
    assert info.value.key == "compactionBogus"
    assert "unknown key" in str(info.value)
    assert "did you mean" not in str(info.value)  # nothing close enough to suggest


@pytest.mark.parametrize(("typo", "meant"), [
    ("compactionMaxLagSecond", "compactionMaxLagSeconds"),
    ("httpPrt", "httpPort"),
    ("kafkabootstrapservers", "kafkaBootstrapServers"),
])
def test_unknown_key_suggests_the_nearest_known_one(typo: str, meant: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings(**{typo: "1"})
    assert f"unknown key {typo}; did you mean {meant}?" in str(info.value)


SECRET_VALUE = "hunter2-5b0f9e7a"
# A misspelled secret key, in the file or the environment, and the key meant.
MISSPELLED_SECRETS = [("httpAuthTokn", "httpAuthToken", False), ("s3SecretAccesKey", "s3SecretAccessKey", False),
                      ("kafkaSaslPasword", "kafkaSaslPassword", False), ("httpAuthTokn", "httpAuthToken", True)]


@pytest.mark.parametrize(("typo", "meant", "from_env"), MISSPELLED_SECRETS)
def test_an_unknown_key_s_value_is_never_shown(typo: str, meant: str, from_env: bool) -> None:
    with pytest.raises(ConfigError) as info:
        if from_env:
            settings({f"{ENV_PREFIX}{typo}": SECRET_VALUE})
        else:
            settings(**{typo: SECRET_VALUE})
    error = info.value
    assert f"unknown key {typo}; did you mean {meant}?" in str(error)
    assert error.key == (f"{ENV_PREFIX}{typo}" if from_env else typo)
    assert SECRET_VALUE not in f"{error} {error.value!r} {error.details!r}"
    assert "<not shown>" in str(error)


def test_a_spark_key_in_the_environment_shows_its_value_unless_its_name_looks_secret() -> None:
    with pytest.raises(ConfigError, match="spark.executor.memory='2g'"):
        settings({f"{ENV_PREFIX}spark.executor.memory": "2g"})
    with pytest.raises(ConfigError) as info:
        settings({f"{ENV_PREFIX}spark.hadoop.fs.s3a.secret.key": SECRET_VALUE})
    assert SECRET_VALUE not in str(info.value) and "config file only" in str(info.value)


@pytest.mark.parametrize(("typo", "meant", "from_env"), MISSPELLED_SECRETS)
def test_run_with_a_misspelled_secret_key_does_not_print_its_value(tmp_path: Path, typo: str, meant: str,
                                                                     from_env: bool) -> None:
    """The daemon refuses to start, before any broker or Spark, naming the key and the one meant, not the value."""
    (tmp_path / "broker.conf").write_text("" if from_env else f"{typo}={SECRET_VALUE}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    if from_env:
        env[f"{ENV_PREFIX}{typo}"] = SECRET_VALUE
    done = subprocess.run([sys.executable, "-m", "compactord", "run", "--config", "broker.conf"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 2
    assert f"did you mean {meant}?" in done.stderr
    assert SECRET_VALUE not in done.stderr + done.stdout


@pytest.mark.parametrize("value", ["", "   "])
def test_empty_value_means_the_default(value: str) -> None:
    assert settings(**{key.name: value for key in KEYS}) == Settings()


def test_values_are_parsed() -> None:
    s = settings(
        httpPort=" 9000 ",
        topicCompactionRetainNullKey="TRUE",
        compactionMinDirtyRatio="0.5",
        kafkaBootstrapServers=" a:1 , b:2 ,",
        compactionEventTimeSource="header:et",
    )
    assert s.http_port == 9000
    assert s.topic_compaction_retain_null_key is True
    assert s.min_dirty_ratio == 0.5
    assert s.kafka_bootstrap_servers == "a:1,b:2"
    assert s.compaction_event_time_source == "header:et"


# -- sparkMaster: Spark's own forms, checked when the config loads --------------------------------------

SPARK_MASTER_FORMS = ("local, local[N], local[*], local[N,F] or local[*,F] (N threads, F attempts of a task), "
                      "spark://HOST:PORT[,HOST:PORT...], yarn, or k8s://API-SERVER")


@pytest.mark.parametrize(("value", "parsed"), [
    ("local", "local"),
    ("local[2]", "local[2]"),
    ("local[*]", "local[*]"),
    ("local[4,3]", "local[4,3]"),
    ("local[*,2]", "local[*,2]"),
    (" local[2] ", "local[2]"),
    ("spark://spark-master.example.internal:7077", "spark://spark-master.example.internal:7077"),
    ("spark://10.0.0.5:7077,10.0.0.6:7077", "spark://10.0.0.5:7077,10.0.0.6:7077"),
    ("spark://[::1]:7077", "spark://[::1]:7077"),
    ("yarn", "yarn"),
    ("k8s://https://kubernetes.default.svc:443", "k8s://https://kubernetes.default.svc:443"),
])
def test_spark_master_accepts_each_form_spark_does(value: str, parsed: str) -> None:
    assert settings(sparkMaster=value).spark_master == parsed


@pytest.mark.parametrize("value", [
    "lcoal[2]", "Local[2]", "local[0]", "local[2", "local(2)", "local[two]", "local 2", "local[2,0]",
    "local-cluster[2,1,1024]", "spark://master", "spark://master:0", "spark://master:99999", "spark://",
    "spark:/master:7077", "YARN", "k8s://", "mesos://zk:2181", "127.0.0.1:7077",
])
def test_a_spark_master_typo_is_refused_naming_the_allowed_forms(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings(sparkMaster=value)
    assert info.value.key == "sparkMaster"
    assert info.value.value == value
    message = str(info.value)
    assert message.startswith(f"config key sparkMaster={value!r} is invalid: "), message
    assert message.endswith(f"expected {SPARK_MASTER_FORMS}"), message


def test_the_spark_master_from_the_environment_is_checked_too() -> None:
    with pytest.raises(ConfigError, match=re.escape(f"{ENV_PREFIX}sparkMaster='lcoal[*]' is invalid")):
        settings({f"{ENV_PREFIX}sparkMaster": "lcoal[*]"}, sparkMaster="local[2]")


# -- spark.* keys and the environment ---------------------------------------------------------------


def test_spark_keys_go_to_spark_conf() -> None:
    s = settings(**{"spark.driver.memory": "1g", "spark.executorEnv.PYSPARK_PYTHON": "/opt/py"})
    assert s.spark_conf == {"spark.driver.memory": "1g", "spark.executorEnv.PYSPARK_PYTHON": "/opt/py"}
    assert Settings().spark_conf == {}


def test_environment_overrides_the_file() -> None:
    s = settings({f"{ENV_PREFIX}httpPort": "9999", "UNRELATED": "x"}, httpPort="1234")
    assert s.http_port == 9999


def test_environment_alone_sets_a_key() -> None:
    assert settings({f"{ENV_PREFIX}logLevel": "DEBUG"}).log_level == "DEBUG"


def test_bad_environment_value_names_the_key() -> None:
    with pytest.raises(ConfigError, match="httpPort"):
        settings({f"{ENV_PREFIX}httpPort": "abc"})


def test_environment_spark_key_is_rejected() -> None:
    with pytest.raises(ConfigError, match=re.escape(f"{ENV_PREFIX}spark.x")) as info:
        settings({f"{ENV_PREFIX}spark.x": "1"})
    assert "config file only" in str(info.value)


def test_environment_unknown_key_is_rejected() -> None:
    with pytest.raises(ConfigError, match=f"{ENV_PREFIX}bogusKey") as info:
        settings({f"{ENV_PREFIX}bogusKey": "1"})
    assert "unknown key" in str(info.value)


def test_environment_unknown_key_suggests_the_nearest_known_one() -> None:
    with pytest.raises(ConfigError, match=f"{ENV_PREFIX}httpPrt") as info:
        settings({f"{ENV_PREFIX}httpPrt": "1"})
    assert "did you mean httpPort?" in str(info.value)


def test_process_environment_is_used_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(f"{ENV_PREFIX}httpPort", "7777")
    assert settings_from_properties({}).http_port == 7777


# -- secrets ----------------------------------------------------------------------------------------


def test_secret_is_read_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("s3cret\n", encoding="utf-8")
    assert settings(httpAuthToken=f"file:{secret}").http_auth_token == "s3cret"
    assert settings({f"{ENV_PREFIX}kafkaSaslPassword": f"file:{secret}"}).kafka_sasl_password == "s3cret"


def test_secret_may_be_written_in_place() -> None:
    assert settings(httpAuthToken="plain").http_auth_token == "plain"


def test_missing_secret_file_names_the_key(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match="httpAuthToken") as info:
        settings(httpAuthToken=f"file:{missing}")
    assert info.value.key == "httpAuthToken"
    assert "cannot be read" in str(info.value)


@pytest.mark.parametrize("key", ["httpAuthToken", "httpReadToken", "kafkaSaslPassword", "kafkaSslPassword"])
@pytest.mark.parametrize("content", ["", "\n", "  \r\n", "\t \n"])
def test_an_empty_secret_file_refuses_naming_the_key(key: str, content: str, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(content, encoding="utf-8")
    extra = {"httpAuthToken": "admin"} if key == "httpReadToken" else {}
    with pytest.raises(ConfigError) as info:
        settings(**extra, **{key: f"file:{secret}"})
    assert info.value.key == key and info.value.value == f"file:{secret}"
    assert "empty" in str(info.value)


# -- the HTTP keys: no API open by accident --------------------------------------------------------


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "10.1.2.3"])
def test_a_non_loopback_address_without_a_token_refuses(address: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings(httpBindAddress=address)
    assert info.value.key == "httpBindAddress" and info.value.value == address
    assert "httpAuthToken" in str(info.value) and "httpAllowUnauthenticated=true" in str(info.value)


def test_a_non_loopback_address_is_fine_with_a_token_or_said_open_on_purpose() -> None:
    assert settings(httpBindAddress="0.0.0.0", httpAuthToken="t").http_auth_token == "t"
    assert settings(httpBindAddress="0.0.0.0", httpAllowUnauthenticated="true").http_allow_unauthenticated
    assert settings(httpBindAddress="::1").http_auth_token == ""  # loopback
    assert settings(httpBindAddress="localhost").http_auth_token == ""


def test_a_read_token_needs_a_different_admin_token() -> None:
    with pytest.raises(ConfigError) as info:
        settings(httpReadToken="r")
    assert info.value.key == "httpAuthToken" and "httpReadToken" in str(info.value)
    with pytest.raises(ConfigError) as info:
        settings(httpReadToken="same", httpAuthToken="same")
    assert info.value.key == "httpReadToken" and "same" not in str(info.value)  # no secret in the message
    assert settings(httpReadToken="r", httpAuthToken="a").http_read_token == "r"


def test_allowed_hosts_are_a_list_of_names() -> None:
    assert settings(httpAllowedHosts=" A.example , 10.0.0.5:8642,[::1]").allowed_hosts == (
        "a.example", "10.0.0.5:8642", "[::1]")
    assert settings().allowed_hosts == ()
    with pytest.raises(ConfigError) as info:
        settings(httpAllowedHosts="good.example,http://bad/")
    assert info.value.key == "httpAllowedHosts" and "http://bad/" in str(info.value)


def test_strategy_plugins_are_a_list_of_references() -> None:
    assert settings(compactionStrategyPlugins="a.b:C, d.E").strategy_plugins == ("a.b:C", "d.E")
    assert settings().strategy_plugins == ()
    with pytest.raises(ConfigError) as info:
        settings(compactionStrategyPlugins="a.b:C,event-time")
    assert info.value.key == "compactionStrategyPlugins" and "'event-time'" in str(info.value)


def test_file_prefix_is_literal_for_a_key_that_is_not_a_secret() -> None:
    assert settings(kafkaSaslUsername="file:/etc/user").kafka_sasl_username == "file:/etc/user"


# -- Pulsar's factory names -------------------------------------------------------------------------


def test_pulsar_default_factory_is_an_alias_of_the_default() -> None:
    s = settings(compactionServiceFactoryClassName=PULSAR_DEFAULT_FACTORY)
    assert s.compaction_service_factory_class_name == DEFAULT_FACTORY
    assert s.compaction_strategy == "publishing-order"


def test_pulsar_event_time_factory_selects_the_event_time_strategy() -> None:
    s = settings(compactionServiceFactoryClassName=PULSAR_EVENT_TIME_FACTORY)
    assert s.compaction_service_factory_class_name == DEFAULT_FACTORY
    assert s.compaction_strategy == "event-time"


def test_pulsar_event_time_factory_with_event_time_strategy_is_fine() -> None:
    s = settings(compactionServiceFactoryClassName=PULSAR_EVENT_TIME_FACTORY, compactionStrategy="event-time")
    assert s.compaction_strategy == "event-time"


def test_pulsar_event_time_factory_with_another_strategy_names_both_keys() -> None:
    with pytest.raises(ConfigError) as info:
        settings(
            compactionServiceFactoryClassName=PULSAR_EVENT_TIME_FACTORY, compactionStrategy="first-value"
        )
    message = str(info.value)
    assert "compactionStrategy" in message
    assert "compactionServiceFactoryClassName" in message
    assert "first-value" in message


def test_own_factory_reference_is_kept() -> None:
    s = settings(compactionServiceFactoryClassName="my.module:Factory")
    assert s.compaction_service_factory_class_name == "my.module:Factory"


# -- kafka-python arguments -------------------------------------------------------------------------

_SECURITY = dict(
    kafkaSaslUsername="user",
    kafkaSaslPassword="pw",
    kafkaSaslMechanism="SCRAM-SHA-512",
    kafkaSslCafile="/ca.pem",
    kafkaSslCertfile="/cert.pem",
    kafkaSslKeyfile="/key.pem",
    kafkaSslPassword="keypw",
    kafkaSslCheckHostname="false",
)
_SASL_ARGS = {"sasl_mechanism", "sasl_plain_username", "sasl_plain_password"}
_SSL_ARGS = {"ssl_check_hostname", "ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password"}


@pytest.mark.parametrize(
    ("protocol", "sasl", "ssl"),
    [
        ("PLAINTEXT", False, False),
        ("SSL", False, True),
        ("SASL_PLAINTEXT", True, False),
        ("SASL_SSL", True, True),
    ],
)
def test_kafka_client_config_has_security_settings_only_when_the_protocol_uses_them(
    protocol: str, sasl: bool, ssl: bool
) -> None:
    cfg = settings(kafkaSecurityProtocol=protocol, **_SECURITY).kafka_client_config()
    assert cfg["security_protocol"] == protocol
    assert (cfg.keys() >= _SASL_ARGS) is sasl
    assert not (_SASL_ARGS & cfg.keys()) or sasl
    assert (cfg.keys() >= _SSL_ARGS) is ssl
    assert not (_SSL_ARGS & cfg.keys()) or ssl
    if sasl:
        assert (cfg["sasl_mechanism"], cfg["sasl_plain_username"], cfg["sasl_plain_password"]) == (
            "SCRAM-SHA-512", "user", "pw")
    if ssl:
        assert cfg["ssl_check_hostname"] is False
        assert (cfg["ssl_cafile"], cfg["ssl_certfile"], cfg["ssl_keyfile"], cfg["ssl_password"]) == (
            "/ca.pem", "/cert.pem", "/key.pem", "keypw")


def test_kafka_client_config_common_arguments() -> None:
    cfg = settings(kafkaBootstrapServers="a:1,b:2", kafkaClientId="me", kafkaRequestTimeoutMs="5000")
    assert cfg.kafka_client_config() == {
        "bootstrap_servers": ["a:1", "b:2"],
        "client_id": "me",
        "request_timeout_ms": 5000,
        "security_protocol": "PLAINTEXT",
    }


def test_ssl_files_that_are_not_set_are_left_out() -> None:
    cfg = settings(kafkaSecurityProtocol="SSL").kafka_client_config()
    assert cfg["ssl_check_hostname"] is True
    assert not {"ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password"} & cfg.keys()


# -- load_settings ----------------------------------------------------------------------------------


def test_load_settings_reads_a_file(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_bytes(
        b"# a comment\nhttpPort = 9001\ncompactionTopicsPattern=^orders\\\\..*$\n"
        b"kafkaClientId=caf\xe9\nspark.executor.memory=2g\n"
    )
    s = load_settings(conf, env={})
    assert s.http_port == 9001
    assert s.topics_pattern == r"^orders\..*$"
    assert s.kafka_client_id == "café"  # ISO 8859-1, as Properties.load(InputStream)
    assert s.spark_conf == {"spark.executor.memory": "2g"}


def test_load_settings_without_a_file_uses_defaults_and_environment() -> None:
    assert load_settings(None, env={}) == Settings()
    assert load_settings(None, env={f"{ENV_PREFIX}httpPort": "1"}).http_port == 1


def test_load_settings_of_a_missing_file_says_the_file_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "missing.conf"
    with pytest.raises(ConfigFileError) as info:
        load_settings(missing, env={})
    assert str(info.value) == f"config file {missing} does not exist"  # a file, not a key
    assert isinstance(info.value, ConfigError) and info.value.key == "--config"


def test_load_settings_of_a_folder_says_the_file_cannot_be_read(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match=re.escape(f"config file {tmp_path} cannot be read")):
        load_settings(tmp_path, env={})


def test_run_with_a_missing_config_file_says_so_and_exits_2(tmp_path: Path) -> None:
    """The daemon refuses to start, before any broker or Spark, naming the file as a file."""
    done = subprocess.run([sys.executable, "-m", "compactord", "run", "--config", "brokr.conf"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.strip() == "compactord: cannot start: config file brokr.conf does not exist"


def test_load_settings_of_a_malformed_file_fails_with_config_error(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("httpAuthToken=\\u12\n", encoding="latin-1")
    with pytest.raises(ConfigFileError, match=re.escape(f"config file {conf} is not valid properties text")):
        load_settings(conf, env={})


# -- broker.conf.example ----------------------------------------------------------------------------


def test_example_shows_spark_keys_commented_out() -> None:
    lines = EXAMPLE.read_text(encoding="latin-1").splitlines()
    for line in ("#spark.driver.memory=1g", "#spark.executor.memory=2g",
                 "#spark.executorEnv.PYSPARK_PYTHON=/opt/compactord/bin/python"):
        assert line in lines


@pytest.mark.parametrize("key", KEYS, ids=lambda key: key.name)
def test_example_documents_each_key(key: config.Key) -> None:
    """Each key is set (to its default, as ``test_ready_config_file_loads`` checks) under a comment that
    marks Pulsar's keys."""
    lines = EXAMPLE.read_text(encoding="latin-1").splitlines()
    index = next((i for i, line in enumerate(lines) if line.startswith(f"{key.name}=")), None)
    assert index is not None, f"{key.name}= is missing"
    comment: list[str] = []
    for line in reversed(lines[:index]):
        if not line.startswith("# "):
            break
        comment.insert(0, line[2:])
    assert comment, f"{key.name} has no comment above it"
    assert ("[Pulsar]" in " ".join(comment)) is key.pulsar


@pytest.mark.parametrize("root", ["hdfs://nn/ledgers", "s3a://bucket/x", "file:///tmp/x", "gs:bucket"])
def test_ledger_root_must_be_a_file_system_path(root):
    with pytest.raises(ConfigError) as info:
        settings_from_properties({"compactedLedgerRoot": root}, env={})
    assert "compactedLedgerRoot" in str(info.value) and "shared mount" in str(info.value)


# -- the ready files under config/ (and broker.conf.example) load, with the values they promise -----

CONFIG_DIR = EXAMPLE.parent / "config"


def _check_example(s: Settings) -> None:
    assert s == Settings()


def _check_embedded(s: Settings) -> None:
    assert s.http_bind_address == "127.0.0.1" and not s.http_auth_token
    assert s.spark_master.startswith("local[")
    assert s.threshold_bytes < Settings().threshold_bytes


def _check_production(s: Settings) -> None:
    assert len(s.kafka_bootstrap_servers.split(",")) == 3
    assert "127.0.0.1" not in s.kafka_bootstrap_servers
    assert s.compacted_ledger_root.startswith("/var/lib/compactord/")
    assert s.http_bind_address == "0.0.0.0" and s.http_auth_token == "from /etc/compactord/token"
    assert s.spark_master.startswith("local[")
    assert s.log_format == "json"


def _check_spark_standalone(s: Settings) -> None:
    assert s.spark_master.startswith("spark://")
    for key in ("spark.executor.memory", "spark.executor.cores", "spark.executorEnv.PYSPARK_PYTHON",
                "spark.driver.host"):
        assert s.spark_conf[key]
    assert not s.compacted_ledger_root.startswith("data/")  # a shared mount, not the working directory


def _check_sasl_tls(s: Settings) -> None:
    client = s.kafka_client_config()
    assert client["security_protocol"] == "SASL_SSL"
    assert client["sasl_mechanism"].startswith("SCRAM-")
    assert client["sasl_plain_password"] == "from /etc/compactord/kafka-password"
    assert client["ssl_cafile"] and client["ssl_check_hostname"] is True


def _check_s3(s: Settings) -> None:
    assert s.compacted_ledger_root.startswith("s3://") and s.s3_region
    assert s.s3_secret_access_key == "from /etc/compactord/s3-secret" and s.s3_access_key_id
    assert s.s3_path_style is False  # AWS: virtual-host addressing


def _check_s3_trial(s: Settings) -> None:
    identities = json.loads((CONFIG_DIR / "s3-trial-identities.json").read_text())["identities"]
    (pair,) = identities[0]["credentials"]
    assert (s.s3_access_key_id, s.s3_secret_access_key) == (pair["accessKey"], pair["secretKey"])
    assert s.compacted_ledger_root == "s3://ledgers/trial" and s.s3_endpoint.startswith("http://127.0.0.1:")
    assert s.s3_path_style is True and s.http_bind_address == "127.0.0.1"
    assert s.http_port != Settings().http_port  # beside a daemon of the first trial, on the default port


_CONFIG_CHECKS = {
    "broker.conf.example": _check_example,
    "embedded.conf": _check_embedded,
    "production.conf": _check_production,
    "spark-standalone.conf": _check_spark_standalone,
    "sasl-tls.conf": _check_sasl_tls,
    "s3.conf": _check_s3,
    "s3-trial.conf": _check_s3_trial,
}


@pytest.mark.parametrize("path", [EXAMPLE, *sorted(CONFIG_DIR.glob("*.conf"))], ids=lambda path: path.name)
def test_ready_config_file_loads(path: Path, tmp_path: Path) -> None:
    """Each file loads as the daemon loads it; its ``file:`` secrets come from stand-ins under tmp_path."""
    assert path.name in _CONFIG_CHECKS, f"add a check of {path.name} to _CONFIG_CHECKS"
    text = path.read_text(encoding="latin-1")
    for secret in sorted(set(re.findall(r"=file:(\S+)$", text, re.MULTILINE))):
        stand_in = tmp_path / Path(secret).name
        stand_in.write_text(f"from {secret}\n", encoding="utf-8")
        text = text.replace(f"=file:{secret}\n", f"=file:{stand_in}\n")
    copy = tmp_path / path.name
    copy.write_text(text, encoding="latin-1")
    _CONFIG_CHECKS[path.name](load_settings(copy, env={}))


def test_embedded_conf_says_where_the_embedded_broker_listens() -> None:
    """As ``EmbeddedBroker.on_default_port`` does: Kafka's usual port when it is free, else a free one."""
    comment = " ".join(line.lstrip("# ") for line in (CONFIG_DIR / "embedded.conf").read_text().splitlines()
                       if line.startswith("#"))
    assert f"127.0.0.1:{DEFAULT_PORT} when that port is free" in comment
    assert "otherwise on a free loopback port" in comment


def test_every_check_has_its_config_file() -> None:
    assert set(_CONFIG_CHECKS) == {EXAMPLE.name} | {p.name for p in CONFIG_DIR.glob("*.conf")}
