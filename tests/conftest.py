"""Shared fixtures: one real Kafka-protocol broker and one real local Spark session per test session.

Processes started here are stopped here, by PID, also when a test fails.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Spark's Python workers import test strategies by reference (tests.inprocess.engine.strategies:Name).
_REPO = str(Path(__file__).resolve().parent.parent)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_REPO, os.environ.get("PYTHONPATH")]))

from compactord.config import Settings
from compactord.embedded import EmbeddedBroker
from tests.support.s3_server import s3_server  # noqa: F401 - the session's S3 server, a fixture

_counter = itertools.count()


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    log_path = tmp_path_factory.mktemp("broker") / "tansu.log"
    b = EmbeddedBroker(log_path=log_path).start()
    try:
        yield b
    finally:
        b.stop()


def settings_for(broker: EmbeddedBroker, root: Path, **overrides: Any) -> Settings:
    base = dict(
        kafka_bootstrap_servers=broker.bootstrap,
        kafka_request_timeout_ms=10000,
        compacted_ledger_root=str(root),
        spark_master="local[2]",
        spark_conf={"spark.driver.memory": "1g"},
        # A replaced ledger is deleted at once (once no read holds it), as the tests of the ledger's
        # life expect; the tests of pinned reads set a grace period.
        compaction_retired_ledger_grace_seconds=0,
    )
    base.update(overrides)
    return Settings(**base)


@pytest.fixture(scope="session")
def spark_manager(broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from compactord.engine.spark_session import SparkSessionManager

    manager = SparkSessionManager(settings_for(broker, tmp_path_factory.mktemp("spark")))
    manager.start()
    manager.warm_up()
    try:
        yield manager
    finally:
        manager.stop()


@dataclass
class Kafka:
    """Topic and produce helpers on the test broker."""

    bootstrap: str
    admin: Any = None

    def topic(self, partitions: int = 1, prefix: str = "t") -> str:
        from kafka.admin import NewTopic

        name = f"{prefix}-{next(_counter)}-{uuid.uuid4().hex[:6]}"
        self.admin.create_topics([NewTopic(name, partitions, 1)])
        return name

    @contextlib.contextmanager
    def producer(self, compression: str | None = None) -> Iterator[Any]:
        """A producer of its own, closed after use.

        Not one shared producer: kafka-python 3.0.12's sender spins at 100% CPU once a topic it has sent
        to drops out of its metadata (``RecordAccumulator.ready`` flags an unknown leader for the
        topic's empty batch queue and asks for metadata again without backing off), which slowed the
        whole suite threefold; it also makes Tansu auto-create a topic a test has just deleted.
        """
        from kafka import KafkaProducer

        kwargs: dict[str, Any] = {"bootstrap_servers": self.bootstrap, "linger_ms": 5}
        if compression:
            kwargs["compression_type"] = compression
        producer = KafkaProducer(**kwargs)
        try:
            yield producer
        finally:
            producer.close(timeout=10)

    def produce(self, topic: str, records: list[tuple], *, compression: str | None = None) -> None:
        """``records``: (key, value[, partition[, timestamp_ms[, headers]]]) tuples; str is UTF-8 encoded."""
        with self.producer(compression) as producer:
            for rec in records:
                key, value, *rest = rec
                partition = rest[0] if len(rest) > 0 else 0
                timestamp = rest[1] if len(rest) > 1 else None
                headers = rest[2] if len(rest) > 2 else None
                producer.send(topic, key=_b(key), value=_b(value), partition=partition,
                              timestamp_ms=timestamp, headers=headers)
            producer.flush()

    def recreate(self, topic: str, partitions: int = 1) -> None:
        """Delete ``topic`` and create it again under its name, empty; nothing tells compactord (Apache
        Kafka calls no hook either)."""
        from kafka.admin import NewTopic

        from tests.support.waiting import wait_for

        self.admin.delete_topics([topic])
        wait_for(lambda: topic not in self.admin.list_topics(), 30, f"topic {topic} to be deleted", interval=0.2)
        self.admin.create_topics([NewTopic(topic, partitions, 1)])

    def close(self) -> None:
        if self.admin is not None:
            self.admin.close()


def _b(x: Any) -> bytes | None:
    return x.encode() if isinstance(x, str) else x


@pytest.fixture(scope="session")
def kafka(broker: EmbeddedBroker) -> Iterator[Kafka]:
    from kafka import KafkaAdminClient

    k = Kafka(broker.bootstrap, admin=KafkaAdminClient(bootstrap_servers=broker.bootstrap))
    try:
        yield k
    finally:
        k.close()


@pytest.fixture
def make_factory(broker: EmbeddedBroker, spark_manager: Any, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``make_factory(**settings_overrides)``: an initialised Spark compaction factory on a fresh root."""
    from compactord.engine.factory import SparkCompactionServiceFactory
    from compactord.interfaces import ServiceContext

    made: list[Any] = []
    owned: list[Any] = []

    def make(root: Path | None = None, store: Any = None, probe: Any = None,
             metadata: Callable[[Any], Any] | None = None, **overrides: Any) -> Any:
        """A second factory on the same root must share the first one's ``store`` (it holds the lock);
        ``probe`` sees (and may hold) its tasks (``tests.support.probes``); ``metadata`` wraps the real
        broker metadata (e.g. ``tests.support.brokers.Answers``) to give answers the test broker cannot."""
        from compactord.kafka.admin import KafkaAdmin

        root = store.location if store is not None else root or tmp_path / "ledgers"
        settings = settings_for(broker, root, **overrides)
        answers = metadata(KafkaAdmin(settings)) if metadata is not None else None
        if answers is not None:
            owned.append(answers)
        factory = SparkCompactionServiceFactory()
        factory.initialize(ServiceContext(settings, spark=spark_manager, store=store, probe=probe, broker=answers))
        made.append(factory)
        return factory

    yield make
    for factory in made:
        for service in factory.services():
            task = service.task
            if task is not None and not task.done:
                try:
                    task.cancel()
                except Exception:  # noqa: BLE001, S110 (teardown: a task that ended meanwhile may refuse)
                    pass
            if task is not None:
                task.worker_done.wait(60)
        factory.close()
    for answers in owned:
        answers.close()


# -- the order the workers take the modules in ------------------------------------------------------------
#
# ``--dist loadfile --no-loadscope-reorder``: each worker takes the next module of this order when it is almost
# done with its own. The longest modules first (the last CI logs' slowest modules, none of which uses a daemon
# of tests/daemon/conftest.py's package fixtures), so that no long module starts at the end while the other
# worker idles; then the daemon tier, then the others, whose many short modules even the two workers' ends out.
# A tier is taken whole before the next, so that a worker starts the package's shared daemons once (one that
# went back and forth between tiers started them again each time it came back).
_LONGEST_FIRST = (
    "tests/daemon/test_cluster_faults.py", "tests/daemon/test_cluster.py", "tests/daemon/test_s3_lease.py",
    "tests/inprocess/engine/test_crash.py", "tests/daemon/test_listener.py", "tests/deploy/test_cluster.py",
    "tests/inprocess/cluster/test_membership.py", "tests/daemon/test_listing.py", "tests/daemon/test_iceberg.py",
    "tests/daemon/test_tasks.py", "tests/daemon/test_failures.py", "tests/daemon/test_recovery.py",
)
_TIERS = ("tests/daemon/", "tests/deploy/", "tests/inprocess/", "tests/unit/")


def _module_rank(module: str) -> tuple[int, int]:
    if module in _LONGEST_FIRST:
        return 0, _LONGEST_FIRST.index(module)
    tier = next((i for i, prefix in enumerate(_TIERS) if module.startswith(prefix)), len(_TIERS))
    return 1 + tier, 0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: _module_rank(item.nodeid.split("::", 1)[0]))  # stable: a module's own order stays


# -- where the suite's time goes: the slowest modules, in every CI log (beside --durations' slowest tests) ----

_module_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.split("::", 1)[0]
    _module_seconds[module] = _module_seconds.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _module_seconds:
        return
    total = sum(_module_seconds.values())
    terminalreporter.section(f"slowest 15 modules (setup, calls and teardown; {total:.0f} s in all)")
    for module, seconds in sorted(_module_seconds.items(), key=lambda item: -item[1])[:15]:
        terminalreporter.write_line(f"{seconds:8.1f}s  {module}")
    tiers: dict[str, float] = {}
    for module, seconds in _module_seconds.items():
        tier = "/".join(module.split("/")[:2])  # tests/unit, tests/inprocess, tests/daemon, tests/deploy
        tiers[tier] = tiers.get(tier, 0.0) + seconds
    terminalreporter.write_line("by tier: " + ", ".join(f"{tier} {seconds:.0f} s" for tier, seconds
                                                        in sorted(tiers.items(), key=lambda item: -item[1])))
