"""``compactord demo``: the stock-ticker example of Pulsar's compaction docs, end to end.

Starts the bundled broker, produces ticks for a few symbols (and delists one with a tombstone),
compacts the topic on a local Spark session, and prints the compacted view and the horizon.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from compactord.config import Settings
from compactord.embedded import EmbeddedBroker
from compactord.interfaces import ServiceContext
from compactord.model import Position

__all__ = ["run_demo"]

SYMBOLS = ("AAPL", "AMZN", "GOOG", "MSFT", "NVDA", "TSLA")


def run_demo(root: str | None = None, ticks: int = 5000, out: Callable[[str], None] = print) -> int:
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import NewTopic

    from compactord.service import SparkCompactionServiceFactory

    with tempfile.TemporaryDirectory(prefix="compactord-demo-") as tmp, EmbeddedBroker() as broker:
        ledger_root = root or str(Path(tmp) / "ledgers")
        out(f"embedded broker on {broker.bootstrap}; ledgers under {ledger_root}")
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        admin.create_topics([NewTopic("stock-ticker", 2, 1)])
        admin.close()
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
        rng = random.Random(7)
        prices = {s: 100.0 for s in SYMBOLS}
        for i in range(ticks):
            symbol = SYMBOLS[i % len(SYMBOLS)]
            prices[symbol] = round(prices[symbol] * (1 + rng.uniform(-0.01, 0.01)), 2)
            value = json.dumps({"symbol": symbol, "price": prices[symbol], "tick": i}).encode()
            producer.send("stock-ticker", key=symbol.encode(), value=value, partition=SYMBOLS.index(symbol) % 2)
        producer.send("stock-ticker", key=b"TSLA", value=None, partition=SYMBOLS.index("TSLA") % 2)  # delisted
        producer.flush()
        producer.close()
        out(f"produced {ticks} ticks for {len(SYMBOLS)} symbols, then a tombstone for TSLA")

        settings = Settings(kafka_bootstrap_servers=broker.bootstrap, compacted_ledger_root=ledger_root)
        factory = SparkCompactionServiceFactory()
        factory.initialize(ServiceContext(settings))
        try:
            out("starting Spark and compacting (the first job of a new session is the slowest)...")
            started = time.monotonic()
            service = factory.new_topic_compaction_service("stock-ticker")
            task = service.compact()
            state = task.result()
            out(f"task {task.task_id}: {state.value} in {time.monotonic() - started:.1f}s; {task.stats}")
            if task.error:
                out(f"error: {task.error}")
                return 1
            horizon = service.get_last_compacted_position() or {}
            out("compacted view (latest price per symbol):")
            for partition in sorted(horizon):
                for entry in service.read_compacted_entries(Position(partition, 0), 100):
                    out(f"  partition {entry.partition} offset {entry.offset:>5}  {entry.key.decode()}: "
                        f"{entry.value.decode()}")
            out("horizon: " + ", ".join(f"partition {p} -> offset {o}" for p, o in sorted(horizon.items())))
            return 0
        finally:
            factory.close()
            factory.spark.stop()
