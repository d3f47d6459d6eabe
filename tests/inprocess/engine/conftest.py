"""Fixtures of the engine suite."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def tx_producer(kafka) -> Iterator[Any]:
    """A transactional kafka-python producer on the test broker (its own transactional id)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, transactional_id=f"tx-{uuid.uuid4().hex[:8]}",
                             linger_ms=5)
    producer.init_transactions()
    try:
        yield producer
    finally:
        producer.close()
