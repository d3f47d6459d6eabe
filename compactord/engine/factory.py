"""The default ``CompactionServiceFactory``: Spark jobs, Parquet ledgers, per-topic strategies. It owns the
Spark session (its ``runtime``), unless one is given to share."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from compactord.config import Settings
from compactord.engine.preview import sampled_preview
from compactord.engine.service import SparkTopicCompactionService
from compactord.engine.spark_session import SparkSessionManager
from compactord.engine.strategies import ResolvedStrategy, allowed_strategies, load_strategy_plugins
from compactord.interfaces import BrokerMetadata, CompactionServiceFactory, ServiceContext
from compactord.kafka.admin import KafkaAdmin
from compactord.ledger import layout
from compactord.ledger.store import LedgerStore
from compactord.model import LedgerManifest, PartitionOffsets, validate_topic_name
from compactord.storage import open_store
from compactord.task import TaskProbe

__all__ = ["SparkCompactionServiceFactory", "SparkRuntime"]


class SparkRuntime:
    """The factory's Spark session as the daemon starts, watches and stops it (an ``EngineRuntime``)."""

    def __init__(self, spark: SparkSessionManager, owned: bool) -> None:
        self.spark = spark
        self._owned = owned  # False: a session given to share, which its giver stops

    @property
    def warmed(self) -> bool:
        return self.spark.warmed

    def start(self, scratch: Path | None) -> None:
        self.spark.start()
        if scratch is not None:
            scratch.mkdir(parents=True, exist_ok=True)
        self.spark.warm_up(scratch)

    def alive(self, timeout: float) -> bool:
        return self.spark.alive(timeout=timeout)

    def stop(self) -> None:
        if self._owned:
            self.spark.stop()


class SparkCompactionServiceFactory(CompactionServiceFactory):
    def initialize(self, context: ServiceContext) -> None:
        settings = context.settings
        self.settings: Settings = settings
        load_strategy_plugins(settings)
        self.strategy = self._resolve(settings.compaction_strategy, "compactionStrategy")
        self._topic_strategies: dict[str, ResolvedStrategy] = {}
        self._topic_limits: dict[str, tuple[int | None, int | None]] = {}
        self.spark: SparkSessionManager = context.spark or SparkSessionManager(settings)
        self._runtime = SparkRuntime(self.spark, owned=context.spark is None)
        self._owns_store = context.store is None
        root = settings.compacted_ledger_root
        self.store: LedgerStore = context.store or LedgerStore(root, open_store(root, settings)).open()
        self._owns_broker = context.broker is None
        self.broker: BrokerMetadata = context.broker or KafkaAdmin(settings)
        self.probe: TaskProbe = context.probe
        self._services: dict[str, SparkTopicCompactionService] = {}
        self._lock = threading.Lock()

    def _resolve(self, ref: str, key: str) -> ResolvedStrategy:
        return ResolvedStrategy.resolve(ref, self.settings.compaction_event_time_source,
                                        self.settings.topic_compaction_retain_null_key, key,
                                        self.settings.compaction_empty_value_is_tombstone)

    def runtime(self) -> SparkRuntime:
        return self._runtime

    def allowed_strategies(self) -> tuple[str, ...]:
        return allowed_strategies(self.settings)

    def set_topic_strategy(self, topic: str, ref: str | None) -> None:
        validate_topic_name(topic)
        with self._lock:
            if ref is None or ref == self.settings.compaction_strategy:
                self._topic_strategies.pop(topic, None)
            else:
                self._topic_strategies[topic] = self._resolve(ref, "strategy")

    def strategy_for(self, topic: str) -> ResolvedStrategy:
        with self._lock:
            return self._topic_strategies.get(topic, self.strategy)

    def set_topic_limits(self, topic: str, *, key_ttl_ms: int | None = None,
                         max_read_bytes_per_second: int | None = None) -> None:
        validate_topic_name(topic)
        with self._lock:
            if key_ttl_ms is None and max_read_bytes_per_second is None:
                self._topic_limits.pop(topic, None)
            else:
                self._topic_limits[topic] = (key_ttl_ms, max_read_bytes_per_second)

    def key_ttl_ms_for(self, topic: str) -> int:
        with self._lock:
            ttl = self._topic_limits.get(topic, (None, None))[0]
        return self.settings.compaction_key_ttl_ms if ttl is None else ttl

    def max_read_rate_for(self, topic: str) -> int:
        with self._lock:
            rate = self._topic_limits.get(topic, (None, None))[1]
        return self.settings.compaction_max_read_bytes_per_second if rate is None else rate

    def new_topic_compaction_service(self, topic: str) -> SparkTopicCompactionService:
        validate_topic_name(topic)
        with self._lock:
            service = self._services.get(topic)
            if service is None:
                service = self._services[topic] = SparkTopicCompactionService(topic, self)
            return service

    def existing_topic_compaction_service(self, topic: str) -> SparkTopicCompactionService | None:
        validate_topic_name(topic)
        with self._lock:
            service = self._services.get(topic)
        if service is None and not self._has_state(topic):
            return None  # never compacted nor asked to: nothing to keep
        return service or self.new_topic_compaction_service(topic)

    def _has_state(self, topic: str) -> bool:
        """The root holds something of ``topic`` (a folder of a local root; objects under an S3 root's
        ``topic/``, which has no folders)."""
        if self.store.objects.local_root is not None:
            return self.store.topic_dir(topic).is_dir()
        return bool(self.store.objects.children(layout.topic_prefix(topic)))

    def sampled_preview(self, topic: str, offsets: Mapping[int, PartitionOffsets],
                        check: Callable[[LedgerManifest], object]) -> dict[str, Any]:
        client_config = self.settings.kafka_client_config()
        handle = self.new_topic_compaction_service(topic).current()
        if handle is None:
            return sampled_preview(client_config, topic, offsets, None, [], self.strategy_for(topic))
        check(handle.manifest)
        handle.acquire()  # the ledger's files stay while they are read, whatever a switch does
        try:
            folder = self.store.ledger_key(topic, handle.manifest.ledger_id)
            files = [f"{folder}/{f['name']}" for f in handle.manifest.files]
            return sampled_preview(client_config, topic, offsets, handle.manifest, files, self.strategy_for(topic),
                                   store=self.store.objects)
        finally:
            handle.release()

    def services(self) -> list[SparkTopicCompactionService]:
        with self._lock:
            return list(self._services.values())

    def forget(self, topic: str) -> None:
        with self._lock:
            self._services.pop(topic, None)

    def close(self) -> None:
        with self._lock:
            services, self._services = list(self._services.values()), {}
        for service in services:
            service.close()
        if self._owns_broker:
            self.broker.close()
        if self._owns_store:
            self.store.close()
