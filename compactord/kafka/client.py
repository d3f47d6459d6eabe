"""kafka-python clients, and the one boundary where kafka-python's errors become compactord's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import kafka.errors as kerr
from kafka import KafkaAdminClient, KafkaConsumer

from compactord.errors import BrokerUnavailable, CompactordError, TopicNotFound

__all__ = ["admin_client", "consumer", "describe", "translate_kafka_errors"]

# Fetch sizes for whole-topic reads: bigger fetches cost each reader memory without reading faster
# (docs/performance.md).
READ_FETCH_BYTES = 8 * 1024 * 1024


def describe(exc: BaseException) -> str:
    """``Name: text`` of an exception, once: kafka-python's errors put their class name in their text
    already ("KafkaTimeoutError: Unable to bootstrap")."""
    name, text = type(exc).__name__, str(exc)
    if not text:
        return name
    return text if text.startswith(name) else f"{name}: {text}"


@contextlib.contextmanager
def translate_kafka_errors(bootstrap: str, topic: str | None = None) -> Iterator[None]:
    """Map kafka-python's exceptions to the error tree (``raise ... from``)."""
    try:
        yield
    except CompactordError:
        raise
    except kerr.UnknownTopicOrPartitionError as exc:
        if topic is None:
            raise BrokerUnavailable(f"broker at {bootstrap} reported an unknown topic: {exc}") from exc
        raise TopicNotFound(topic) from exc
    except (kerr.KafkaConnectionError, kerr.KafkaTimeoutError, kerr.NodeNotReadyError,
            kerr.RequestTimedOutError, ConnectionError, TimeoutError) as exc:
        raise BrokerUnavailable(
            f"the Kafka broker at {bootstrap} is unreachable ({describe(exc)}); "
            "check kafkaBootstrapServers and that the broker is up"
        ) from exc
    except kerr.KafkaError as exc:
        raise BrokerUnavailable(f"the Kafka broker at {bootstrap} failed a request: {exc}") from exc


def consumer(client_config: Mapping[str, Any], **overrides: Any) -> KafkaConsumer:
    """A consumer without a group (``assign()`` only), reading committed data only."""
    cfg: dict[str, Any] = dict(client_config)
    cfg.update(
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        # Never create a topic by asking for its metadata: a reader running while a topic is deleted
        # would bring it back (brokers auto-create by default).
        allow_auto_create_topics=False,
        max_partition_fetch_bytes=READ_FETCH_BYTES,
        fetch_max_bytes=READ_FETCH_BYTES * 4,
        bootstrap_timeout_ms=min(int(cfg.get("request_timeout_ms", 30000)), 10000),
    )
    cfg.update(overrides)
    return KafkaConsumer(**cfg)


def admin_client(client_config: Mapping[str, Any]) -> KafkaAdminClient:
    cfg = dict(client_config)
    cfg.setdefault("bootstrap_timeout_ms", min(int(cfg.get("request_timeout_ms", 30000)), 10000))
    return KafkaAdminClient(**cfg)
