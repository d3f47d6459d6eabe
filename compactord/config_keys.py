"""broker.conf's keys: each written once, as a ``Settings`` field (``_key``), with its default, section and
meaning; ``KEYS`` is derived from the fields.

``docs/configuration.md`` and ``broker.conf.example`` are generated from them (``config_reference``); the file
is read into ``Settings`` by ``config_load``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from compactord.config_values import (
    Parser,
    bind_address,
    boolean,
    bootstrap,
    choice,
    class_ref,
    class_refs,
    cluster_name,
    event_time_source,
    float_range,
    host_list,
    http_url,
    iceberg_catalog_uri,
    iceberg_namespace,
    int_range,
    ledger_root,
    listener_list,
    pem_file,
    regex,
    spark_master,
    text,
)

__all__ = ["DEFAULT_FACTORY", "ENV_PREFIX", "GROUPS", "KAFKA_SECRET_ARGS", "KEYS", "KEYS_BY_NAME",
           "PULSAR_DEFAULT_FACTORY", "PULSAR_EVENT_TIME_FACTORY", "Key", "Settings"]

ENV_PREFIX = "COMPACTORD_CONF_"
DEFAULT_FACTORY = "compactord.engine.factory:SparkCompactionServiceFactory"
PULSAR_DEFAULT_FACTORY = "org.apache.pulsar.compaction.PulsarCompactionServiceFactory"
PULSAR_EVENT_TIME_FACTORY = "org.apache.pulsar.compaction.EventTimeCompactionServiceFactory"

#: The sections of the keys, in order, each with its title.
GROUPS = {
    "broker": "Broker: the Kafka-protocol brokers compactord reads topics from",
    "storage": "Storage: where the compacted ledgers are kept",
    "compaction": "Compaction: how a topic is compacted",
    "spark": "Spark: the engine that does the compaction",
    "scheduler": "Scheduler: when topics are compacted (the backlog monitor)",
    "http": "HTTP: the API",
    "listener": "Kafka listener: the compacted view for any Kafka client, read-only",
    "cluster": "Cluster: several daemons sharing one ledger root, one owner per topic",
    "iceberg": "Iceberg: the compacted view published as an Apache Iceberg table (the [iceberg] extra)",
    "logging": "Logging",
}


@dataclass(frozen=True, slots=True)
class Key:
    """One broker.conf key: the metadata of a ``Settings`` field (``KEYS`` is built from them)."""

    name: str  # as spelled in broker.conf
    attr: str  # Settings attribute
    parse: Parser[Any]
    default: str  # as it would be written in the file ("" = none)
    group: str
    doc: str
    pulsar: bool = False  # the key is also in Pulsar's broker.conf
    secret: bool = False  # may be given as file:/path

    @property
    def allowed(self) -> str:
        """What the key accepts, in the words of its error message."""
        return self.parse.allowed


def _key(name: str, parse: Parser[Any], default: str, group: str, doc: str, *,
         pulsar: bool = False, secret: bool = False) -> Any:
    """A ``Settings`` field read from the key ``name``; its default is ``default`` as the loader parses it."""
    value = parse(name, default) if default != "" else default
    return field(default=value, metadata={"key": Key(name, "", parse, default, group, doc, pulsar, secret)})


@dataclass(frozen=True)
class Settings:
    """Every key of broker.conf, in the order of broker.conf.example; ``spark_conf``: the spark.* keys."""

    # Broker
    kafka_bootstrap_servers: str = _key("kafkaBootstrapServers", bootstrap, "127.0.0.1:9092", "broker",
        "Kafka-protocol brokers to read from, host:port[,host:port...].")
    kafka_client_id: str = _key("kafkaClientId", text, "compactord", "broker",
        "Client id sent to the broker.")
    kafka_request_timeout_ms: int = _key("kafkaRequestTimeoutMs", int_range(1000), "30000", "broker",
        "Timeout of one broker request, in milliseconds.")
    kafka_security_protocol: str = _key("kafkaSecurityProtocol",
        choice("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"), "PLAINTEXT", "broker",
        "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.")
    kafka_sasl_mechanism: str = _key("kafkaSaslMechanism",
        choice("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER"), "PLAIN", "broker",
        "SASL mechanism when the protocol is SASL_*.")
    kafka_sasl_username: str = _key("kafkaSaslUsername", text, "", "broker", "SASL user name.")
    kafka_sasl_password: str = _key("kafkaSaslPassword", text, "", "broker",
        "SASL password (file:/path reads it from a file).", secret=True)
    kafka_ssl_cafile: str = _key("kafkaSslCafile", text, "", "broker",
        "CA bundle to verify the broker (PEM).")
    kafka_ssl_certfile: str = _key("kafkaSslCertfile", text, "", "broker",
        "Client certificate (PEM) for mutual TLS.")
    kafka_ssl_keyfile: str = _key("kafkaSslKeyfile", text, "", "broker", "Client private key (PEM).")
    kafka_ssl_password: str = _key("kafkaSslPassword", text, "", "broker",
        "Password of the client key (file:/path reads it from a file).", secret=True)
    kafka_ssl_check_hostname: bool = _key("kafkaSslCheckHostname", boolean, "true", "broker",
        "Check that the broker's certificate matches its host name.")
    # Storage
    compacted_ledger_root: str = _key("compactedLedgerRoot", ledger_root, "data/ledgers", "storage",
        "Where the compacted ledgers are kept, by one writer daemon at a time: a folder (on a cluster, shared by "
        "every executor), or s3://BUCKET/PREFIX, a bucket that needs no shared folder (s3Region required).")
    s3_endpoint: str = _key("s3Endpoint", text, "", "storage",
        "URL of an S3-compatible store (e.g. https://minio.example.internal:9000); empty = AWS S3 in s3Region.")
    s3_region: str = _key("s3Region", text, "", "storage",
        "Region of the bucket (e.g. eu-west-1); required for an s3:// root, so that no client looks it up.")
    s3_access_key_id: str = _key("s3AccessKeyId", text, "", "storage",
        "Access key id; with s3SecretAccessKey empty too, the standard AWS credential chain is used "
        "(environment, profile, instance or pod role).")
    s3_secret_access_key: str = _key("s3SecretAccessKey", text, "", "storage",
        "Secret access key (file:/path reads it from a file); set with s3AccessKeyId, or neither.", secret=True)
    s3_path_style_access: bool | str = _key("s3PathStyleAccess", boolean, "", "storage",
        "Address the bucket in the path (https://endpoint/bucket/key) instead of the host name; empty = true "
        "when s3Endpoint is set, false for AWS.")
    s3_ca_bundle: str = _key("s3CaBundle", text, "", "storage",
        "CA bundle (PEM) to verify the store's certificate; empty = the system's.")
    s3_server_side_encryption: str = _key("s3ServerSideEncryption", choice("", "AES256", "aws:kms"), "",
        "storage", "Server-side encryption of every object written: empty (the bucket's default), AES256, or "
        "aws:kms (with s3KmsKeyId, or the account's default key).")
    s3_kms_key_id: str = _key("s3KmsKeyId", text, "", "storage",
        "KMS key (id, ARN or alias) for s3ServerSideEncryption=aws:kms.")
    storage_lease_seconds: int = _key("storageLeaseSeconds", int_range(5, 600), "30", "storage",
        "Lease of an object-store root (s3://), in seconds: its daemon renews it every third of this; a second "
        "daemon refuses to start while it is renewed, and takes over one not renewed for this long. A local "
        "root is locked instead.")
    storage_sweep_interval_seconds: int = _key("storageSweepIntervalSeconds",
        int_range(1, 86400, or_zero=True, recommended=60),
        "600", "storage", "How often each topic's folder is swept of what no pointer names (ledgers of runs that "
        "crashed or were cancelled, unfinished uploads); 0 = only at the start.")
    storage_sweep_min_age_seconds: int = _key("storageSweepMinAgeSeconds", int_range(1, 604800, recommended=60),
        "3600",
        "storage", "The sweep removes only objects and uploads older than this: on a cluster, executors may still "
        "write after their driver died.")
    storage_metadata_cache_bytes: int = _key("storageMetadataCacheBytes", int_range(0, 4 * 1024 ** 3), "67108864",
        "storage", "Bytes of memory for the Parquet footers of ledger files (kept once read: a page read is then "
        "one ranged read per row group, no footer read); 0 turns the cache off, at most 4 GiB.")
    storage_read_retry_seconds: float = _key("storageReadRetrySeconds", float_range(0.2, 30.0), "2", "storage",
        "Time an S3 read (list, head, get) may take, its two attempts included, before it fails with "
        "storage_unavailable (a ledger read then answers 503).")
    storage_write_retry_seconds: float = _key("storageWriteRetrySeconds", float_range(1.0, 600.0), "60",
        "storage",
        "Time an S3 write is retried (503 SlowDown, 5xx, a connection lost) before it fails with "
        "storage_unavailable (a compaction's write: the compaction fails, its ledger is not switched in).")
    # Compaction
    compaction_service_factory_class_name: str = _key("compactionServiceFactoryClassName", class_ref,
        DEFAULT_FACTORY, "compaction", "CompactionServiceFactory implementation, module:Class (Pulsar's "
        "class names are accepted as aliases).", pulsar=True)
    compaction_strategy: str = _key("compactionStrategy", class_ref, "publishing-order", "compaction",
        "Which record of a key survives: publishing-order, event-time, first-value, or module:Class.")
    compaction_strategy_plugins: str = _key("compactionStrategyPlugins", class_refs, "", "compaction",
        "Strategy plug-ins (module:Class[,module:Class...]) that a topic's policies may choose over HTTP, "
        "by the exact reference; loaded and checked at start-up. HTTP may choose the built-in strategies, "
        "compactionStrategy and these, nothing else: a request never makes the daemon import code.")
    compaction_event_time_source: str = _key("compactionEventTimeSource", event_time_source, "timestamp",
        "compaction", "Event time of a record: timestamp, or header:NAME.")
    compaction_tombstone_retention_ms: int = _key("compactionTombstoneRetentionMs", int_range(0), "86400000",
        "compaction", "How long a deletion marker stays in the ledger (Kafka's "
        "delete.retention.ms): the Kafka listener serves it as a tombstone.")
    topic_compaction_retain_null_key: bool = _key("topicCompactionRetainNullKey", boolean, "false",
        "compaction", "Keep records without a key in place (otherwise they are dropped).", pulsar=True)
    compaction_empty_value_is_tombstone: bool = _key("compactionEmptyValueIsTombstone", boolean, "false",
        "compaction", "Pulsar's rule: an empty value deletes its key like a null one. Off: Kafka's rule (only a "
        "null value deletes; an empty value is kept). A change rebuilds each ledger in full.")
    compaction_retired_ledger_grace_seconds: int = _key("compactionRetiredLedgerGraceSeconds", int_range(0, 86400),
        "300", "compaction", "How long a ledger replaced by a switch stays readable by id (?ledger_id=), so that "
        "a reader pinned to it finishes; then reads of it answer 410 ledger_retired.")
    compaction_key_ttl_ms: int = _key("compactionKeyTtlMs", int_range(0), "0", "compaction",
        "Key expiry (0 = off): a key whose winning record is older than this many milliseconds (its record "
        "timestamp, or its event time under event-time) leaves the compacted view at the next compaction, "
        "as if deleted. Per topic: the policy field keyTtlMs. Expiry alone starts no run.")
    compaction_max_read_bytes_per_second: int = _key("compactionMaxReadBytesPerSecond", int_range(0), "0",
        "compaction", "Most bytes (keys and values) per second one compaction reads from the brokers, summed "
        "over its reading tasks (0 = unlimited; Kafka's log.cleaner.io.max.bytes.per.second). Per topic: the "
        "policy field maxReadBytesPerSecond.")
    compaction_read_ranges_per_core: int = _key("compactionReadRangesPerCore", int_range(1, 64), "2",
        "compaction", "Offset ranges per Spark core that the topic is split into for reading, in runs that group "
        "their rows in Spark (a plug-in strategy, first-value, a partition past the final-read bounds); a run "
        "of an ordered strategy reads each partition in one task, however many cores Spark has.")
    compaction_reader_batch_records: int = _key("compactionReaderBatchRecords", int_range(100, 1_000_000),
        "10000", "compaction", "Records per Arrow batch read from Kafka inside Spark.")
    compaction_history_max_runs: int = _key("compactionHistoryMaxRuns", int_range(1, 100_000), "1000",
        "compaction", "Runs kept in each topic's run history (GET /v1/topics/{topic}/history, compactord "
        "history TOPIC), under @compactord/history/ of the ledger root; older ones are dropped.")
    compaction_history_max_age_days: int = _key("compactionHistoryMaxAgeDays", int_range(1, 36500), "30",
        "compaction", "Days a run stays in its topic's run history.")
    compaction_reader_client: str = _key("compactionReaderClient", choice("auto", "librdkafka", "kafka-python"),
        "auto", "compaction", "Chooses nothing: the topic is read inside Spark with librdkafka (confluent-kafka, "
        "a dependency). Kept so that config files that set it still load: auto and librdkafka as they are, "
        "kafka-python with a warning at start that it is no longer available and librdkafka reads.")
    # Spark
    spark_master: str = _key("sparkMaster", spark_master, "local[*]", "spark",
        "Spark master: local[*] (one thread per core), spark://HOST:PORT, yarn, k8s://... (spark.* keys are "
        "passed to Spark).")
    # Scheduler
    monitor_interval_seconds: int = _key("brokerServiceCompactionMonitorIntervalInSeconds", int_range(1),
        "60", "scheduler", "How often the backlog monitor looks at every topic.", pulsar=True)
    threshold_bytes: int = _key("brokerServiceCompactionThresholdInBytes", int_range(0), "104857600",
        "scheduler", "Compact a topic whose backlog is larger than this many bytes (0 = off).", pulsar=True)
    threshold_messages: int = _key("compactionThresholdInMessages", int_range(0), "0", "scheduler",
        "Compact a topic whose backlog has more records than this (0 = off).")
    max_lag_seconds: int = _key("compactionMaxLagSeconds", int_range(0), "0", "scheduler",
        "Compact a topic whose oldest uncompacted record is older than this (0 = off).")
    min_dirty_ratio: float = _key("compactionMinDirtyRatio", float_range(0.0, 1.0), "0", "scheduler",
        "Compact when tail records / (ledger + tail records) exceeds this (0 = off).")
    topics_pattern: str = _key("compactionTopicsPattern", regex, r"(?!__).*", "scheduler",
        "Regex (full match) of the topics the monitor compacts; default every topic not starting with __.")
    max_concurrent_tasks: int = _key("compactionMaxConcurrentTasks", int_range(1, 64), "1", "scheduler",
        "Compactions that may run at once; others wait in state Pending.")
    driver_run_max_records: int = _key("compactionDriverRunMaxRecords", int_range(0, 10_000_000), "20000",
        "scheduler", "A compaction whose previous ledger and new tail hold at most this many records reads its "
        "topic in the daemon's driver, without a Spark job (a small topic's run then takes a fraction of a "
        "second); 0: every compaction is a Spark job (e.g. to keep all reading on a cluster's executors).")
    cancel_timeout_seconds: int = _key("compactionCancelTimeoutSeconds", int_range(1, 600), "10",
        "scheduler", "How long a cancel, unload or delete request waits for the task to stop.")
    task_timeout_seconds: int = _key("compactionTaskTimeoutSeconds", int_range(1), "3600", "scheduler",
        "A task running longer than this fails.")
    # HTTP
    http_bind_address: str = _key("httpBindAddress", bind_address, "127.0.0.1", "http",
        "Address the HTTP API binds.")
    http_port: int = _key("httpPort", int_range(0, 65535), "8642", "http",
        "Port of the HTTP API (0 = any free port).")
    http_auth_token: str = _key("httpAuthToken", text, "", "http",
        "Bearer token required on /v1, /docs and /openapi.json (file:/path reads it from a file); it allows "
        "every endpoint. Required when httpBindAddress is not a loopback address (see "
        "httpAllowUnauthenticated).", secret=True)
    http_read_token: str = _key("httpReadToken", text, "", "http",
        "Optional bearer token for applications that only read: GET of /v1/topics, /v1/tasks, /v1/info (the "
        "broker's address a reader tails, the ledger root) and a topic's compaction status, /horizon, "
        "/history, /compacted and /compacted/last; nothing else (403). Needs "
        "httpAuthToken (file:/path reads it from a file).", secret=True)
    http_allow_unauthenticated: bool = _key("httpAllowUnauthenticated", boolean, "false", "http",
        "true: serve the API without a token on a non-loopback httpBindAddress (otherwise the daemon "
        "refuses to start).")
    http_allowed_hosts: str = _key("httpAllowedHosts", host_list, "", "http",
        "Host header values the API answers to when httpBindAddress is not loopback (name[:port],...; "
        "empty = any); on loopback only localhost, 127.0.0.1 and [::1]. /healthz, /readyz and /metrics "
        "also accept any IP literal (a probe's or a scraper's pod address), but no other name.")
    http_tls_cert_file: str = _key("httpTlsCertFile", text, "", "http",
        "Certificate (PEM): HTTPS when set with the key.")
    http_tls_key_file: str = _key("httpTlsKeyFile", text, "", "http",
        "Private key (PEM) of the HTTPS certificate.")
    http_read_max_bytes: int = _key("httpReadMaxBytes", int_range(1), "8388608", "http",
        "Most bytes of keys, values and headers in one page of GET .../compacted (counted before base64); a "
        "page always holds one entry, and says next_start when it stopped early.")
    http_response_buffer_bytes: int = _key("httpResponseBufferBytes", int_range(1048576), "268435456", "http",
        "Most bytes of large answers (over 64 KiB: pages of the compacted view) held at once for clients still "
        "receiving them; an answer past it is 503 server_busy, and a client that takes none of an answer "
        "for httpRequestBodyTimeoutSeconds is disconnected. Bounds the memory clients that never read can "
        "hold.")
    http_max_request_bytes: int = _key("httpMaxRequestBytes", int_range(1), "1048576", "http",
        "Largest request body accepted; a larger one is answered 413 request_too_large.")
    http_request_body_timeout_seconds: int = _key("httpRequestBodyTimeoutSeconds", int_range(1, 3600), "30",
        "http", "Time to receive a request's body, in seconds; a slower one is answered 408 request_timeout. A "
        "client that takes no part of a large answer for as long is disconnected.")
    http_max_connections: int = _key("httpMaxConnections", int_range(1, 100000), "200", "http",
        "Requests served at once (/healthz, /readyz and /metrics not counted); more are answered 503 "
        "server_busy. "
        "Open connections are capped at twice this plus 50.")
    http_idle_timeout_seconds: int = _key("httpIdleTimeoutSeconds", int_range(1, 3600), "5", "http",
        "A connection that sends no request (a first one, or the next one on a kept-alive connection) "
        "for this many seconds is closed.")
    metrics_per_topic_max_topics: int = _key("metricsPerTopicMaxTopics", int_range(0, 10_000_000), "1000", "http",
        "/metrics has series per topic (backlog, ledger, runs: docs/operations.md) while at most this many topics "
        "are matched by compactionTopicsPattern or have a folder under the root (as of the backlog monitor's last "
        "pass); past it only the totals are exported (0 = never per topic).")
    # Kafka listener
    kafka_listeners: str = _key("kafkaListeners", listener_list, "", "listener",
        "Empty: no listener. SCHEME://host:port[,...]: serve each compacted topic over Kafka's protocol there, read "
        "only: a fetch at or below the topic's horizon from its ledger (original offsets), past it relayed to the "
        "broker (docs/design.md#the-kafka-listener). SASL_PLAINTEXT and SASL_SSL take SASL/PLAIN with the password "
        "token:<httpAuthToken> or token:<httpReadToken> (any user name); SSL and SASL_SSL need kafkaTlsCertFile "
        "and kafkaTlsKeyFile. With httpAuthToken set every listener must be SASL_PLAINTEXT or SASL_SSL; without "
        "it SASL listeners are refused, and a non-loopback host needs httpAllowUnauthenticated=true, as "
        "httpBindAddress does.")
    kafka_advertised_listeners: str = _key("kafkaAdvertisedListeners", listener_list, "", "listener",
        "The addresses Metadata answers (one for each of kafkaListeners, in order, with the same scheme): what "
        "clients connect to. Empty: kafkaListeners (with the port bound for port 0).")
    kafka_tls_cert_file: str = _key("kafkaTlsCertFile", pem_file, "", "listener",
        "Certificate (PEM, the chain after it) of the SSL and SASL_SSL listeners; TLS 1.2 at least.")
    kafka_tls_key_file: str = _key("kafkaTlsKeyFile", pem_file, "", "listener",
        "Private key (PEM, not encrypted) of kafkaTlsCertFile; never logged.")
    kafka_max_connections: int = _key("kafkaMaxConnections", int_range(1, 100000), "1000", "listener",
        "Open connections to the Kafka listener; one more is closed at once.")
    kafka_connections_max_idle_ms: int = _key("kafkaConnectionsMaxIdleMs", int_range(1000, 86_400_000), "600000",
        "listener", "A Kafka listener connection that sends no request for this long is closed (Kafka's "
        "connections.max.idle.ms); one on a SASL listener that has not authenticated within 10 s is closed sooner.")
    # Cluster
    cluster_name: str = _key("clusterName", cluster_name, "", "cluster",
        "Empty: one daemon owns the root. Set: the daemons with this name and these brokers form one cluster, "
        "members of the consumer group compactord-NAME over the coordination topic __compactord-NAME (created "
        "if missing); a topic is compacted by the member that holds its coordination partition.")
    cluster_coordination_partitions: int = _key("clusterCoordinationPartitions", int_range(1, 1024), "32",
        "cluster", "Partitions of the coordination topic: the units of ownership the members share (a topic's "
        "is crc32(topic) modulo this). An existing coordination topic with another count refuses the start; "
        "changing it moves every topic.")
    cluster_advertised_url: str = _key("clusterAdvertisedUrl", http_url, "", "cluster",
        "The URL the other members reach this daemon's API at (carried in its group membership); empty = "
        "derived from httpBindAddress and the port the API listens on (the host's name for a wildcard "
        "address).")
    cluster_session_timeout_ms: int = _key("clusterSessionTimeoutMs", int_range(1000, 300000), "6000", "cluster",
        "Group session: a member not heard from for this long loses its coordination partitions to the others, "
        "and a member whose last heartbeat is older stops writing by itself; it heartbeats every third of it. "
        "Must lie within the brokers' group.min.session.timeout.ms and group.max.session.timeout.ms.")
    cluster_tls_ca_file: str = _key("clusterTlsCaFile", text, "", "cluster",
        "CA bundle (PEM) to verify the other members' HTTPS certificates; empty = the system's. A file that "
        "cannot be read refuses the start.")
    # Iceberg
    iceberg_catalog_uri: str = _key("icebergCatalogUri", iceberg_catalog_uri, "", "iceberg",
        "Empty: off. Set: after each switch, the topic's new ledger is committed as one snapshot of the Iceberg "
        "table (icebergNamespace, TOPIC) of this catalog, referencing the ledger's part files in place (on an "
        "s3:// root by s3:// URLs, read with the root's s3* settings). A SQL catalog keeps the tables' metadata "
        "under the root's @compactord/iceberg/; a REST catalog chooses where. A SQLite file serves one daemon "
        "(refused with clusterName): a cluster uses PostgreSQL or a REST catalog. Never shown in logs or "
        "/v1/info (file:/path reads it from a file).", secret=True)
    iceberg_catalog_token: str = _key("icebergCatalogToken", text, "", "iceberg",
        "Bearer token sent to a REST catalog (icebergCatalogUri http:// or https://); empty: none. Never shown "
        "in logs or /v1/info (file:/path reads it from a file).", secret=True)
    iceberg_namespace: str = _key("icebergNamespace", iceberg_namespace, "compactord", "iceberg",
        "The catalog namespace of the topics' tables; a topic's table is named as the topic, exactly.")
    iceberg_snapshots_retained: int = _key("icebergSnapshotsRetained", int_range(1, 10_000), "5", "iceberg",
        "Snapshots of this many ledgers stay in each table (older ones are expired; time travel to a ledger "
        "reads its files, which exist for compactionRetiredLedgerGraceSeconds after its replacement).")
    # Logging
    log_format: str = _key("logFormat", choice("text", "json"), "text", "logging",
        "text or json (one object a line).")
    log_level: str = _key("logLevel", choice("DEBUG", "INFO", "WARNING", "ERROR"), "INFO", "logging",
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

    @property
    def s3_path_style(self) -> bool:
        """``s3PathStyleAccess``, or its default: path style when ``s3Endpoint`` is set."""
        return bool(self.s3_endpoint) if self.s3_path_style_access == "" else bool(self.s3_path_style_access)

    def with_overrides(self, **changes: Any) -> Settings:
        return replace(self, **changes)

    def kafka_client_config(self, *, secrets: bool = True) -> dict[str, Any]:
        """kafka-python keyword arguments shared by every client (security included). ``secrets=False``: without
        the arguments of the secret keys (``kafka_client_secrets``): what may be shipped to Spark's tasks."""
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
            for attr, arg in _SSL_ARGS:
                if getattr(self, attr):
                    cfg[arg] = getattr(self, attr)
        if not secrets:
            return {arg: value for arg, value in cfg.items() if arg not in KAFKA_SECRET_ARGS}
        return cfg

    def kafka_client_secrets(self) -> dict[str, Any]:
        """The secret part of ``kafka_client_config`` (the arguments of keys marked ``secret``): served to the
        reading tasks over the run's channel, never shipped with them."""
        return {arg: value for arg, value in self.kafka_client_config().items() if arg in KAFKA_SECRET_ARGS}


_SSL_ARGS = (("kafka_ssl_cafile", "ssl_cafile"), ("kafka_ssl_certfile", "ssl_certfile"),
             ("kafka_ssl_keyfile", "ssl_keyfile"), ("kafka_ssl_password", "ssl_password"))
# The Settings attribute behind each client argument that is not a plain copy of one key's name.
_KAFKA_ARG_ATTRS = {"sasl_plain_username": "kafka_sasl_username", "sasl_plain_password": "kafka_sasl_password",
                    **{arg: attr for attr, arg in _SSL_ARGS}}


#: The keys, in field order; each ``Key`` is its field's metadata with the attribute name filled in.
KEYS: tuple[Key, ...] = tuple(
    replace(f.metadata["key"], attr=f.name) for f in fields(Settings) if "key" in f.metadata
)
KEYS_BY_NAME = {key.name: key for key in KEYS}
_SECRET_ATTRS = {key.attr for key in KEYS if key.secret}
#: The Kafka client arguments whose keys are secret (``Key.secret``): never in what reaches Spark's tasks.
KAFKA_SECRET_ARGS = frozenset(arg for arg, attr in _KAFKA_ARG_ATTRS.items() if attr in _SECRET_ATTRS)
