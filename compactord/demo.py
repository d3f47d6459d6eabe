"""``compactord demo``: the stock-ticker example of Pulsar's compaction docs, end to end.

Produces ticks for a few symbols, compacts the topic over the HTTP API, prints the horizon, delists one
symbol with a tombstone and reads the compacted view back through ``CompactedReader`` (ledger up to the
horizon, then the live tail). On its own broker and in-process daemon (HTTP API on a free loopback
port), or, with ``--url``, on a running daemon and its broker.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compactord.client import DaemonClient
from compactord.compacted_reader import CompactedReader
from compactord.config import Settings
from compactord.daemon.core import Daemon
from compactord.embedded import EmbeddedBroker
from compactord.errors import CompactionAlreadyRunning, CompactordError, DaemonRequestFailed
from compactord.server import ThreadedServer

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


def run_demo(root: str | None = None, ticks: int = 5000, out: Callable[[str], None] = print, *,
             url: str | None = None, token: str | None = None) -> int:
    """The demo on its own broker and daemon; with ``url``, on the running daemon there and its broker
    (learnt from ``GET /v1/info``)."""
    if url is not None:
        daemon = DaemonClient(url, token)
        bootstrap = daemon.info()["broker"]["bootstrap"]
        out(f"compactord at {daemon.url}; its broker at {bootstrap}")
        return _story(daemon, bootstrap, ticks, out)
    with tempfile.TemporaryDirectory(prefix="compactord-demo-") as tmp, EmbeddedBroker() as broker:
        ledger_root = root or str(Path(tmp) / "ledgers")
        settings = Settings(kafka_bootstrap_servers=broker.bootstrap, compacted_ledger_root=ledger_root,
                            threshold_bytes=0)
        local = Daemon(settings)
        local.start()
        server = ThreadedServer(local).start()
        try:
            out(f"embedded broker on {broker.bootstrap}; compactord API on {server.url}; ledgers in {ledger_root}")
            return _story(DaemonClient(server.url, token=""), broker.bootstrap, ticks, out)
        finally:
            server.stop()
            local.shutdown()


def _create_topic(bootstrap: str) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(TOPIC, 2, 1)])
    except TopicAlreadyExistsError:
        pass  # a demo run before this one: its ticks are compacted with these
    finally:
        admin.close()


def _wait_ready(daemon: DaemonClient, out: Callable[[str], None]) -> None:
    deadline = time.monotonic() + 300
    ready = daemon.readiness()
    if not ready["compactions"]:
        out("waiting for the daemon (the Spark session starts; the first job of a new session is the slowest)...")
    while not ready["compactions"]:
        if time.monotonic() > deadline:
            raise CompactordError("the daemon cannot compact yet: " + "; ".join(ready["problems"]))
        time.sleep(0.5)
        ready = daemon.readiness()


def _compact(daemon: DaemonClient) -> dict[str, Any]:
    """Trigger a compaction of the demo topic (after one already running, if any) and wait for its end."""
    deadline = time.monotonic() + 600
    while True:
        try:
            task_id = daemon.trigger(TOPIC)["task_id"]
            break
        except DaemonRequestFailed as exc:  # the monitor was quicker: let its run end, then ours
            if exc.error != CompactionAlreadyRunning.code or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    while True:
        status: dict[str, Any] = daemon.status(TOPIC)
        if status["task_id"] == task_id and status["status"] != "RUNNING":
            return status
        if time.monotonic() > deadline:
            raise CompactordError(f"compaction {task_id} did not end within 600s")
        time.sleep(0.3)


def _story(daemon: DaemonClient, bootstrap: str, ticks: int, out: Callable[[str], None]) -> int:
    _create_topic(bootstrap)
    _produce(bootstrap, ticks)
    out(f"produced {ticks} ticks for {len(SYMBOLS)} symbols to topic {TOPIC}")
    _wait_ready(daemon, out)
    started = time.monotonic()
    status = _compact(daemon)
    out(f"compaction {status['task_id']}: {status['state']} in {time.monotonic() - started:.1f}s, "
        f"{status['progress']['records_read']} records read")
    if status["status"] != "SUCCESS":
        out(f"error: {status['last_error']}")
        return 1
    horizon = daemon.horizon(TOPIC)
    out("horizon: " + ", ".join(f"partition {p['partition']} -> offset {p['offset']}" for p in horizon["partitions"]))
    _produce(bootstrap, 3, start=ticks)  # a tail after the horizon, and TSLA is delisted:
    _delist(bootstrap, "TSLA")
    out("3 more ticks and a tombstone for TSLA after the compaction; reading the compacted view "
        "(ledger, then live tail):")
    reader = CompactedReader(bootstrap, TOPIC, url=daemon.url, token=daemon.token)
    latest: dict[str, str] = {}
    for entry in reader:
        assert entry.key is not None  # the demo's records all have keys
        latest[entry.key.decode()] = entry.value.decode() if entry.value else "(deleted: tombstone)"
        out(f"  p{entry.partition} @{entry.offset:<6} {entry.key.decode()}: {latest[entry.key.decode()]}")
    out(f"{reader.ledger_entries} entries from the ledger + {reader.tail_records} from the tail "
        f"instead of {horizon_total(horizon) + 4} records; latest price per symbol:")
    for symbol in sorted(latest):
        out(f"  {symbol}: {latest[symbol]}")
    return 0


def horizon_total(horizon: dict[str, Any]) -> int:
    """The records up to the horizon (offsets start at 0 on the demo's topic)."""
    return sum(p["offset"] + 1 for p in horizon["partitions"])
