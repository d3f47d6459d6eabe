"""The reader backends (``compactionReaderClient``): the engine suite runs on the default one (``auto``:
librdkafka, confluent-kafka being a dependency); the tests that take ``reader_client`` run on kafka-python
too (codecs, transactions, cancel, reads out of the log's range), so that neither backend rots while CI
pays for only a few more runs."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

READER_CLIENTS = ("auto", "kafka-python")


@pytest.fixture(params=READER_CLIENTS)
def reader_client(request: pytest.FixtureRequest) -> str:
    return request.param


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
