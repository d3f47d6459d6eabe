"""The cluster's names on the broker and its coordination topic: which coordination partition a topic belongs
to, the topic and group a cluster uses, the topic created if missing, and the URL a member is reached at."""

from __future__ import annotations

import logging
import socket
import time
import zlib
from typing import Any

import kafka.errors as kerr

from compactord.config import Settings
from compactord.config_values import COORDINATION_TOPIC_PREFIX
from compactord.errors import BrokerUnavailable, ConfigError
from compactord.kafka.client import admin_client, translate_kafka_errors

__all__ = ["advertised_url", "coordination_partition", "coordination_topic", "ensure_coordination_topic",
           "group_id"]

log = logging.getLogger(__name__)

GROUP_PREFIX = "compactord-"
_DESCRIBE_RETRY_S = 0.2  # a topic just created may not be in the metadata yet


def coordination_partition(topic: str, partitions: int) -> int:
    """The coordination partition ``topic`` belongs to: its owner is the member that holds it."""
    return zlib.crc32(topic.encode()) % partitions


def coordination_topic(name: str) -> str:
    """The coordination topic of the cluster ``name`` (``clusterName``)."""
    return COORDINATION_TOPIC_PREFIX + name


def group_id(name: str) -> str:
    """The consumer group of the cluster ``name``."""
    return GROUP_PREFIX + name


def advertised_url(settings: Settings, port: int) -> str:
    """``clusterAdvertisedUrl``, or the URL derived from ``httpBindAddress`` and ``port`` (the port the API
    listens on: ``httpPort`` may be 0): https when the API serves TLS; a wildcard address gives the host's
    name, which the other members must be able to resolve."""
    if settings.cluster_advertised_url:
        return settings.cluster_advertised_url
    scheme = "https" if settings.http_tls_cert_file else "http"
    host = settings.http_bind_address
    if host in ("0.0.0.0", "::"):
        host = socket.getfqdn()
    elif ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


def ensure_coordination_topic(settings: Settings) -> None:
    """Create the coordination topic of ``clusterName`` with ``clusterCoordinationPartitions`` partitions and
    the brokers' default replication factor, unless it exists; one that exists with another partition count
    refuses the start (each topic's coordination partition would differ between members).

    :raises ConfigError: the topic exists with another partition count.
    :raises BrokerUnavailable: the brokers cannot be reached, or refuse the topic.
    """
    topic = coordination_topic(settings.cluster_name)
    wanted = settings.cluster_coordination_partitions
    bootstrap = settings.kafka_bootstrap_servers
    with translate_kafka_errors(bootstrap):
        admin = admin_client(settings.kafka_client_config())
        try:
            try:
                # -1: the brokers' default.replication.factor (KIP-464).
                admin.create_topics({topic: {"num_partitions": wanted, "replication_factor": -1}})
                log.info("created the coordination topic %s with %d partitions", topic, wanted)
                return
            except kerr.TopicAlreadyExistsError:
                pass
            found = _partition_count(admin, topic, settings.kafka_request_timeout_ms / 1000)
        finally:
            admin.close()
    if found != wanted:
        raise ConfigError("clusterCoordinationPartitions", wanted,
                          f"the coordination topic {topic} exists with {found} partitions, not {wanted}: set "
                          f"{found}, as every member of the cluster must (a topic's owner is chosen by its "
                          "coordination partition, so changing the count moves every topic; to change it, stop "
                          "every member and delete the topic)")


def _partition_count(admin: Any, topic: str, timeout_s: float) -> int:
    """The partitions of ``topic``, which exists (created by another member, perhaps a moment ago)."""
    deadline = time.monotonic() + timeout_s
    while True:
        (described,) = admin.describe_topics([topic])
        if not described["error_code"] and described["partitions"]:
            return len(described["partitions"])
        if time.monotonic() > deadline:
            raise BrokerUnavailable(f"the coordination topic {topic} exists but the brokers describe it with "
                                    f"error code {described['error_code']} and no partitions")
        time.sleep(_DESCRIBE_RETRY_S)
