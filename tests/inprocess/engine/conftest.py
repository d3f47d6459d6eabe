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


@pytest.fixture
def spark_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run of the test through a Spark job, also a small one (whose reading task would otherwise run in
    the driver: ``compactionDriverRunMaxRecords``), for tests of the job itself: its tasks, its early start,
    its cancel."""
    from compactord.engine import run

    monkeypatch.setattr(run.CompactionRun, "_driver_max", lambda _self: -1)
