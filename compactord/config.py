"""broker.conf (Java properties) -> one frozen, validated ``Settings``.

- The file is parsed as ``java.util.Properties.load`` does (``properties.py``).
- Pulsar's key names where they exist; an empty value means the default.
- ``COMPACTORD_CONF_<key>`` in the environment overrides a key (``spark.*`` keys: file only).
- Secrets may be written ``file:/path``: the value is the file's content, without a trailing newline.
- An unknown key or a bad value fails with the key, the value and what is allowed.

Each key is written once, as a ``Settings`` field (``_key``); ``KEYS`` is derived from the fields.
``broker.conf.example`` documents every key (a test checks).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from compactord.errors import ConfigError
from compactord.event_time import validate_event_time_source
from compactord.properties import load_properties

__all__ = ["ENV_PREFIX", "KEYS", "Key", "Settings", "load_settings", "settings_from_properties"]

ENV_PREFIX = "COMPACTORD_CONF_"
DEFAULT_FACTORY = "compactord.engine.factory:SparkCompactionServiceFactory"
PULSAR_DEFAULT_FACTORY = "org.apache.pulsar.compaction.PulsarCompactionServiceFactory"
PULSAR_EVENT_TIME_FACTORY = "org.apache.pulsar.compaction.EventTimeCompactionServiceFactory"


# -- value parsers: each takes (key, raw string) and returns the typed value or raises ConfigError --


def _str(key: str, raw: str) -> str:
    return raw


def _int_range(lo: int, hi: int | None = None) -> Callable[[str, str], int]:
    def parse(key: str, raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ConfigError(key, raw, "expected a whole number") from None
        if value < lo or (hi is not None and value > hi):
            bound = f"from {lo} to {hi}" if hi is not None else f">= {lo}"
            raise ConfigError(key, raw, f"expected a whole number {bound}")
        return value

    return parse


def _float_range(lo: float, hi: float) -> Callable[[str, str], float]:
    def parse(key: str, raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ConfigError(key, raw, "expected a number") from None
        if not lo <= value <= hi:
            raise ConfigError(key, raw, f"expected a number from {lo} to {hi}")
        return value

    return parse


def _bool(key: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise ConfigError(key, raw, "expected true or false")


def _choice(*allowed: str) -> Callable[[str, str], str]:
    def parse(key: str, raw: str) -> str:
        if raw.strip() not in allowed:
            raise ConfigError(key, raw, f"expected one of {', '.join(allowed)}")
        return raw.strip()

    return parse


def _ref(key: str, raw: str) -> str:
    return raw.strip()


def _ref_list(key: str, raw: str) -> str:
    refs = [r.strip() for r in raw.split(",") if r.strip()]
    for ref in refs:
        module_name, sep, qualname = ref.partition(":") if ":" in ref else ref.rpartition(".")
        if not sep or not module_name or not qualname:
            raise ConfigError(key, raw, f"{ref!r} is not a reference: expected module:Class[,module:Class...]")
    return ",".join(refs)


def _local_path(key: str, raw: str) -> str:
    value = raw.strip()
    if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*://", value) or re.match(r"(hdfs|s3a?|gs|abfss?|wasbs?):", value):
        raise ConfigError(key, raw, "expected a file-system path (on a cluster: a shared mount at the same path "
                                    "on every executor); URLs such as hdfs:// or s3a:// are not supported")
    return value


def _regex(key: str, raw: str) -> str:
    try:
        re.compile(raw)
    except re.error as exc:
        raise ConfigError(key, raw, f"expected a Python regular expression ({exc})") from None
    return raw


def _bind_address(key: str, raw: str) -> str:
    value = raw.strip()
    if value in ("localhost", "0.0.0.0", "::"):
        return value
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ConfigError(key, raw, "expected an IP address such as 127.0.0.1 or 0.0.0.0") from None
    return value


def is_loopback(address: str) -> bool:
    """``address`` (an ``httpBindAddress``) is reachable from this machine only."""
    return address == "localhost" or ipaddress.ip_address(address).is_loopback


def _host_list(key: str, raw: str) -> str:
    hosts = [h.strip().lower() for h in raw.split(",") if h.strip()]
    for host in hosts:
        if not re.fullmatch(r"[a-z0-9._-]+(:[0-9]{1,5})?|\[[0-9a-f:.]+\](:[0-9]{1,5})?", host):
            raise ConfigError(key, raw, f"{host!r} is not a host name: expected name[:port][,name[:port]...], "
                                        "e.g. compactord.example.com,10.0.0.5:8642")
    return ",".join(hosts)


def _bootstrap(key: str, raw: str) -> str:
    servers = [s.strip() for s in raw.split(",") if s.strip()]
    if not servers:
        raise ConfigError(key, raw, "expected host:port[,host:port...]")
    for server in servers:
        host, sep, port = server.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(key, raw, f"{server!r} is not host:port (port 1 to 65535)")
    return ",".join(servers)


def _event_time_source(key: str, raw: str) -> str:
    return validate_event_time_source(raw.strip(), key)



@dataclass(frozen=True, slots=True)
class Key:
    """One broker.conf key: the metadata of a ``Settings`` field (``KEYS`` is built from them)."""

    name: str  # as spelled in broker.conf
    attr: str  # Settings attribute
    parse: Callable[[str, str], Any]
    default: str  # as it would be written in the file ("" = none)
    group: str
    doc: str
    pulsar: bool = False  # the key is also in Pulsar's broker.conf
    secret: bool = False  # may be given as file:/path


def _key(name: str, parse: Callable[[str, str], Any], default: str, group: str, doc: str, *,
         pulsar: bool = False, secret: bool = False) -> Any:
    """A ``Settings`` field read from the key ``name``; its default is ``default`` as the loader parses it."""
    value = parse(name, default) if default != "" else default
    return field(default=value, metadata={"key": Key(name, "", parse, default, group, doc, pulsar, secret)})


@dataclass(frozen=True)
class Settings:
    """Every key of broker.conf, in the order of broker.conf.example; ``spark_conf``: the spark.* keys."""

    # Broker
    kafka_bootstrap_servers: str = _key("kafkaBootstrapServers", _bootstrap, "127.0.0.1:9092", "broker",
        "Kafka-protocol brokers to read from, host:port[,host:port...].")
    kafka_client_id: str = _key("kafkaClientId", _str, "compactord", "broker",
        "Client id sent to the broker.")
    kafka_request_timeout_ms: int = _key("kafkaRequestTimeoutMs", _int_range(1000), "30000", "broker",
        "Timeout of one broker request, in milliseconds.")
    kafka_security_protocol: str = _key("kafkaSecurityProtocol",
        _choice("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"), "PLAINTEXT", "broker",
        "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.")
    kafka_sasl_mechanism: str = _key("kafkaSaslMechanism",
        _choice("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER"), "PLAIN", "broker",
        "SASL mechanism when the protocol is SASL_*.")
    kafka_sasl_username: str = _key("kafkaSaslUsername", _str, "", "broker", "SASL user name.")
    kafka_sasl_password: str = _key("kafkaSaslPassword", _str, "", "broker",
        "SASL password (file:/path reads it from a file).", secret=True)
    kafka_ssl_cafile: str = _key("kafkaSslCafile", _str, "", "broker",
        "CA bundle to verify the broker (PEM).")
    kafka_ssl_certfile: str = _key("kafkaSslCertfile", _str, "", "broker",
        "Client certificate (PEM) for mutual TLS.")
    kafka_ssl_keyfile: str = _key("kafkaSslKeyfile", _str, "", "broker", "Client private key (PEM).")
    kafka_ssl_password: str = _key("kafkaSslPassword", _str, "", "broker",
        "Password of the client key (file:/path reads it from a file).", secret=True)
    kafka_ssl_check_hostname: bool = _key("kafkaSslCheckHostname", _bool, "true", "broker",
        "Check that the broker's certificate matches its host name.")
    # Storage
    compacted_ledger_root: str = _key("compactedLedgerRoot", _local_path, "data/ledgers", "storage",
        "Folder of the compacted ledgers (one writer daemon at a time; shared by every executor on a "
        "cluster).")
    # Compaction
    compaction_service_factory_class_name: str = _key("compactionServiceFactoryClassName", _ref,
        DEFAULT_FACTORY, "compaction", "CompactionServiceFactory implementation, module:Class (Pulsar's "
        "class names are accepted as aliases).", pulsar=True)
    compaction_strategy: str = _key("compactionStrategy", _ref, "publishing-order", "compaction",
        "Which record of a key survives: publishing-order, event-time, first-value, or module:Class.")
    compaction_strategy_plugins: str = _key("compactionStrategyPlugins", _ref_list, "", "compaction",
        "Strategy plug-ins (module:Class[,module:Class...]) that a topic's policies may choose over HTTP, "
        "by the exact reference; loaded and checked at start-up. HTTP may choose the built-in strategies, "
        "compactionStrategy and these, nothing else: a request never makes the daemon import code.")
    compaction_event_time_source: str = _key("compactionEventTimeSource", _event_time_source, "timestamp",
        "compaction", "Event time of a record: timestamp, or header:NAME.")
    compaction_tombstone_retention_ms: int = _key("compactionTombstoneRetentionMs", _int_range(0), "86400000",
        "compaction", "How long an event-time deletion marker stays in the ledger (Kafka's "
        "delete.retention.ms).")
    topic_compaction_retain_null_key: bool = _key("topicCompactionRetainNullKey", _bool, "false",
        "compaction", "Keep records without a key in place (otherwise they are dropped).", pulsar=True)
    compaction_empty_value_is_tombstone: bool = _key("compactionEmptyValueIsTombstone", _bool, "false",
        "compaction", "Pulsar's rule: an empty value deletes its key like a null one. Off: Kafka's rule (only a "
        "null value deletes; an empty value is kept). A change rebuilds each ledger in full.")
    compaction_retired_ledger_grace_seconds: int = _key("compactionRetiredLedgerGraceSeconds", _int_range(0, 86400),
        "300", "compaction", "How long a ledger replaced by a switch stays readable by id (?ledger_id=), so that "
        "a reader pinned to it finishes; then reads of it answer 410 ledger_retired.")
    compaction_read_ranges_per_core: int = _key("compactionReadRangesPerCore", _int_range(1, 64), "2",
        "compaction", "Offset ranges per Spark core that the topic is split into for reading.")
    compaction_reader_batch_records: int = _key("compactionReaderBatchRecords", _int_range(100, 1_000_000),
        "10000", "compaction", "Records per Arrow batch read from Kafka inside Spark.")
    # Spark
    spark_master: str = _key("sparkMaster", _str, "local[*]", "spark",
        "Spark master: local[*], spark://HOST:PORT, yarn, k8s://... (spark.* keys are passed to Spark).")
    # Scheduler
    monitor_interval_seconds: int = _key("brokerServiceCompactionMonitorIntervalInSeconds", _int_range(1),
        "60", "scheduler", "How often the backlog monitor looks at every topic.", pulsar=True)
    threshold_bytes: int = _key("brokerServiceCompactionThresholdInBytes", _int_range(0), "104857600",
        "scheduler", "Compact a topic whose backlog is larger than this many bytes (0 = off).", pulsar=True)
    threshold_messages: int = _key("compactionThresholdInMessages", _int_range(0), "0", "scheduler",
        "Compact a topic whose backlog has more records than this (0 = off).")
    max_lag_seconds: int = _key("compactionMaxLagSeconds", _int_range(0), "0", "scheduler",
        "Compact a topic whose oldest uncompacted record is older than this (0 = off).")
    min_dirty_ratio: float = _key("compactionMinDirtyRatio", _float_range(0.0, 1.0), "0", "scheduler",
        "Compact when tail records / (ledger + tail records) exceeds this (0 = off).")
    topics_pattern: str = _key("compactionTopicsPattern", _regex, r"(?!__).*", "scheduler",
        "Regex (full match) of the topics the monitor compacts; default every topic not starting with __.")
    max_concurrent_tasks: int = _key("compactionMaxConcurrentTasks", _int_range(1, 64), "1", "scheduler",
        "Compactions that may run at once; others wait in state Pending.")
    cancel_timeout_seconds: int = _key("compactionCancelTimeoutSeconds", _int_range(1, 600), "10",
        "scheduler", "How long a cancel, unload or delete request waits for the task to stop.")
    task_timeout_seconds: int = _key("compactionTaskTimeoutSeconds", _int_range(1), "3600", "scheduler",
        "A task running longer than this fails.")
    # HTTP
    http_bind_address: str = _key("httpBindAddress", _bind_address, "127.0.0.1", "http",
        "Address the HTTP API binds.")
    http_port: int = _key("httpPort", _int_range(0, 65535), "8642", "http",
        "Port of the HTTP API (0 = any free port).")
    http_auth_token: str = _key("httpAuthToken", _str, "", "http",
        "Bearer token required on /v1, /docs and /openapi.json (file:/path reads it from a file); it allows "
        "every endpoint. Required when httpBindAddress is not a loopback address (see "
        "httpAllowUnauthenticated).", secret=True)
    http_read_token: str = _key("httpReadToken", _str, "", "http",
        "Optional bearer token for applications that only read: GET of /v1/topics, /v1/tasks and a topic's "
        "compaction status, /horizon, /compacted and /compacted/last; nothing else (403). Needs "
        "httpAuthToken (file:/path reads it from a file).", secret=True)
    http_allow_unauthenticated: bool = _key("httpAllowUnauthenticated", _bool, "false", "http",
        "true: serve the API without a token on a non-loopback httpBindAddress (otherwise the daemon "
        "refuses to start).")
    http_allowed_hosts: str = _key("httpAllowedHosts", _host_list, "", "http",
        "Host header values the API answers to when httpBindAddress is not loopback (name[:port],...; "
        "empty = any); on loopback only localhost, 127.0.0.1 and [::1]. /healthz, /readyz and /metrics "
        "accept any.")
    http_tls_cert_file: str = _key("httpTlsCertFile", _str, "", "http",
        "Certificate (PEM): HTTPS when set with the key.")
    http_tls_key_file: str = _key("httpTlsKeyFile", _str, "", "http",
        "Private key (PEM) of the HTTPS certificate.")
    http_read_max_bytes: int = _key("httpReadMaxBytes", _int_range(1), "8388608", "http",
        "Most bytes of keys, values and headers in one page of GET .../compacted (before base64); a page "
        "always holds one entry, and says next_start when it stopped early.")
    http_max_request_bytes: int = _key("httpMaxRequestBytes", _int_range(1), "1048576", "http",
        "Largest request body accepted; a larger one is answered 413 request_too_large.")
    http_request_body_timeout_seconds: int = _key("httpRequestBodyTimeoutSeconds", _int_range(1, 3600), "30",
        "http", "Time to receive a request's body; a slower one is answered 408 request_timeout.")
    http_max_connections: int = _key("httpMaxConnections", _int_range(1, 100000), "200", "http",
        "Requests served at once (the probes and /metrics not counted); more are answered 503 server_busy. "
        "Open connections are capped at twice this plus 50.")
    http_idle_timeout_seconds: int = _key("httpIdleTimeoutSeconds", _int_range(1, 3600), "5", "http",
        "A connection that sends no request (a first one, or the next one on a kept-alive connection) "
        "for this long is closed.")
    # Logging
    log_format: str = _key("logFormat", _choice("text", "json"), "text", "logging",
        "text or json (one object a line).")
    log_level: str = _key("logLevel", _choice("DEBUG", "INFO", "WARNING", "ERROR"), "INFO", "logging",
        "DEBUG, INFO, WARNING or ERROR.")
    spark_conf: dict[str, str] = field(default_factory=dict)  # every spark.* key of the file

    @property
    def allowed_hosts(self) -> tuple[str, ...]:
        """The names of ``httpAllowedHosts``."""
        return tuple(self.http_allowed_hosts.split(",")) if self.http_allowed_hosts else ()

    @property
    def strategy_plugins(self) -> tuple[str, ...]:
        """The references of ``compactionStrategyPlugins``."""
        return tuple(self.compaction_strategy_plugins.split(",")) if self.compaction_strategy_plugins else ()

    def with_overrides(self, **changes: Any) -> Settings:
        return replace(self, **changes)

    def kafka_client_config(self) -> dict[str, Any]:
        """kafka-python keyword arguments shared by every client (security included)."""
        cfg: dict[str, Any] = {
            "bootstrap_servers": self.kafka_bootstrap_servers.split(","),
            "client_id": self.kafka_client_id,
            "request_timeout_ms": self.kafka_request_timeout_ms,
            "security_protocol": self.kafka_security_protocol,
        }
        if self.kafka_security_protocol.startswith("SASL"):
            cfg["sasl_mechanism"] = self.kafka_sasl_mechanism
            if self.kafka_sasl_username:
                cfg["sasl_plain_username"] = self.kafka_sasl_username
                cfg["sasl_plain_password"] = self.kafka_sasl_password
        if self.kafka_security_protocol.endswith("SSL"):
            cfg["ssl_check_hostname"] = self.kafka_ssl_check_hostname
            for attr, arg in (("kafka_ssl_cafile", "ssl_cafile"), ("kafka_ssl_certfile", "ssl_certfile"),
                              ("kafka_ssl_keyfile", "ssl_keyfile"), ("kafka_ssl_password", "ssl_password")):
                if getattr(self, attr):
                    cfg[arg] = getattr(self, attr)
        return cfg


#: The keys, in field order; each ``Key`` is its field's metadata with the attribute name filled in.
KEYS: tuple[Key, ...] = tuple(
    replace(f.metadata["key"], attr=f.name) for f in fields(Settings) if "key" in f.metadata
)
KEYS_BY_NAME = {key.name: key for key in KEYS}


def _read_secret(key: str, raw: str) -> str:
    if not raw.startswith("file:"):
        return raw
    path = Path(raw[len("file:") :])
    try:
        secret = path.read_text(encoding="utf-8").rstrip("\r\n")
    except OSError as exc:
        raise ConfigError(key, raw, f"the secret file cannot be read ({exc.strerror})") from None
    if not secret.strip():  # an empty token file must not turn authentication off
        raise ConfigError(key, raw, "the secret file is empty (or holds only white space); write the secret "
                                    "into it, or leave the key unset")
    return secret


def _check_http(values: dict[str, Any]) -> None:
    """The rules between the HTTP keys: no API open by accident."""
    address, token, read_token = values["http_bind_address"], values["http_auth_token"], values["http_read_token"]
    if not is_loopback(address) and not token and not values["http_allow_unauthenticated"]:
        raise ConfigError("httpBindAddress", address, "a non-loopback address needs httpAuthToken (anyone who "
                          "reaches the port could cancel, delete and rebuild), or httpAllowUnauthenticated=true "
                          "to serve the API open on purpose")
    if read_token and not token:
        raise ConfigError("httpAuthToken", token, "must be set when httpReadToken is (without it the endpoints "
                          "that the read token does not allow would be open)")
    if read_token and read_token == token:
        raise ConfigError("httpReadToken", "<the value of httpAuthToken>", "must differ from httpAuthToken")


def _resolve_factory_alias(values: dict[str, Any], explicit: set[str]) -> None:
    factory = values["compaction_service_factory_class_name"]
    if factory == PULSAR_DEFAULT_FACTORY:
        values["compaction_service_factory_class_name"] = DEFAULT_FACTORY
    elif factory == PULSAR_EVENT_TIME_FACTORY:
        values["compaction_service_factory_class_name"] = DEFAULT_FACTORY
        if "compactionStrategy" in explicit and values["compaction_strategy"] != "event-time":
            raise ConfigError(
                "compactionStrategy", values["compaction_strategy"],
                f"compactionServiceFactoryClassName={PULSAR_EVENT_TIME_FACTORY} selects the event-time "
                "strategy; leave compactionStrategy unset or set it to event-time",
            )
        values["compaction_strategy"] = "event-time"


def settings_from_properties(props: Mapping[str, str], env: Mapping[str, str] | None = None) -> Settings:
    """Validate ``props`` (the parsed file) with ``env`` overrides into ``Settings``.

    :raises ConfigError: an unknown key or a bad value (naming the key, the value and what is allowed).
    """
    env = os.environ if env is None else env
    merged: dict[str, str] = {}
    spark_conf: dict[str, str] = {}
    for name, raw in props.items():
        if name.startswith("spark."):
            spark_conf[name] = raw
        elif name not in KEYS_BY_NAME:
            raise ConfigError(name, raw, "unknown key; see broker.conf.example for the keys compactord knows")
        else:
            merged[name] = raw
    for env_name, raw in env.items():
        if not env_name.startswith(ENV_PREFIX):
            continue
        name = env_name[len(ENV_PREFIX) :]
        if name.startswith("spark."):
            raise ConfigError(env_name, raw, "spark.* keys can be set in the config file only")
        if name not in KEYS_BY_NAME:
            raise ConfigError(env_name, raw, "unknown key; see broker.conf.example for the keys compactord knows")
        merged[name] = raw
    values: dict[str, Any] = {}
    explicit: set[str] = set()
    for key in KEYS:
        raw = merged.get(key.name, "")
        if raw.strip() == "":  # an empty value means the default
            raw = key.default
        else:
            explicit.add(key.name)
            if key.secret:
                raw = _read_secret(key.name, raw)
        values[key.attr] = key.parse(key.name, raw) if raw != "" else raw
    _resolve_factory_alias(values, explicit)
    _check_http(values)
    values["spark_conf"] = spark_conf
    return Settings(**values)


def load_settings(path: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None) -> Settings:
    """Read a broker.conf file (None: defaults and environment only)."""
    props: dict[str, str] = {}
    if path is not None:
        try:
            text = Path(path).read_text(encoding="latin-1")  # Properties.load reads ISO 8859-1
        except OSError as exc:
            raise ConfigError("--config", str(path), f"the file cannot be read ({exc.strerror})") from None
        try:
            props = load_properties(text)
        except ValueError as exc:
            raise ConfigError("--config", str(path), f"not valid properties text ({exc})") from None
    return settings_from_properties(props, env)
