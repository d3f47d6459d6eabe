"""``compactord demo``: the stock-ticker example of Pulsar's compaction docs, end to end.

Starts the bundled broker and an in-process daemon (HTTP API on a free loopback port), produces ticks
for a few symbols (and delists one with a tombstone), compacts the topic, prints the horizon, and reads
the compacted view back through ``CompactedReader`` (ledger up to the horizon, then the live tail).
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from compactord.client import CompactedReader
from compactord.config import Settings
from compactord.daemon.core import Daemon
from compactord.daemon.server import ThreadedServer
from compactord.embedded import EmbeddedBroker
from compactord.errors import CompactordError
from compactord.task import TaskState

__all__ = ["run_demo"]

SYMBOLS = ("AAPL", "AMZN", "GOOG", "MSFT", "NVDA", "TSLA")
TOPIC = "stock-ticker"


def _produce(bootstrap: str, ticks: int, start: int = 0) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    rng = random.Random(7 + start)
    for i in range(start, start + ticks):
        symbol = SYMBOLS[i % len(SYMBOLS)]
        price = round(100 * (1 + rng.uniform(-0.2, 0.2)), 2)
        value = json.dumps({"symbol": symbol, "price": price, "tick": i}).encode()
        producer.send(TOPIC, key=symbol.encode(), value=value, partition=SYMBOLS.index(symbol) % 2)
    producer.flush()
    producer.close()


def _delist(bootstrap: str, symbol: str) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap)
    producer.send(TOPIC, key=symbol.encode(), value=None, partition=SYMBOLS.index(symbol) % 2)
    producer.flush()
    producer.close()


def run_demo(root: str | None = None, ticks: int = 5000, out: Callable[[str], None] = print) -> int:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    with tempfile.TemporaryDirectory(prefix="compactord-demo-") as tmp, EmbeddedBroker() as broker:
        ledger_root = root or str(Path(tmp) / "ledgers")
        settings = Settings(kafka_bootstrap_servers=broker.bootstrap, compacted_ledger_root=ledger_root,
                            threshold_bytes=0)
        daemon = Daemon(settings)
        daemon.start()
        server = ThreadedServer(daemon).start()
        try:
            out(f"embedded broker on {broker.bootstrap}; compactord API on {server.url}; ledgers in {ledger_root}")
            admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
            admin.create_topics([NewTopic(TOPIC, 2, 1)])
            admin.close()
            _produce(broker.bootstrap, ticks)
            out(f"produced {ticks} ticks for {len(SYMBOLS)} symbols")
            out("starting Spark (the first job of a new session is the slowest)...")
            deadline = time.monotonic() + 300
            while daemon.readiness_problems():
                if daemon.fatal or time.monotonic() > deadline:
                    raise CompactordError("; ".join(daemon.readiness_problems()))
                time.sleep(0.5)
            started = time.monotonic()
            task = daemon.registry.trigger(TOPIC)
            state = task.result(600)
            out(f"compaction {task.task_id}: {state.value} in {time.monotonic() - started:.1f}s, "
                f"{task.stats.records_read} records read, {task.stats.records_kept} kept")
            if state is not TaskState.SUCCEED:
                out(f"error: {task.error}")
                return 1
            manifest = daemon.registry.service(TOPIC).ledger_info()
            assert manifest is not None
            out("horizon: " + ", ".join(f"partition {p} -> offset {o}" for p, o in sorted(manifest.horizon.items())))
            _produce(broker.bootstrap, 3, start=ticks)  # a tail after the horizon, and TSLA is delisted:
            _delist(broker.bootstrap, "TSLA")
            out("3 more ticks and a tombstone for TSLA after the compaction; reading the compacted view "
                "(ledger, then live tail):")
            reader = CompactedReader(broker.bootstrap, TOPIC, url=server.url)
            latest: dict[str, str] = {}
            for entry in reader:
                assert entry.key is not None  # the demo's records all have keys
                latest[entry.key.decode()] = entry.value.decode() if entry.value else "(deleted: tombstone)"
                out(f"  p{entry.partition} @{entry.offset:<6} {entry.key.decode()}: {latest[entry.key.decode()]}")
            out(f"{reader.ledger_entries} entries from the ledger + {reader.tail_records} from the tail "
                f"instead of {ticks + 4} records; latest price per symbol:")
            for symbol in sorted(latest):
                out(f"  {symbol}: {latest[symbol]}")
            return 0
        finally:
            server.stop()
            daemon.shutdown()
