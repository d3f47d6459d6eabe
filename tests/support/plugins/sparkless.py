"""A compaction service factory that uses no Spark: a daemon that names it starts no JVM, and is ready for
compactions as soon as the broker answers. Its services hold no ledger and refuse to compact."""

from __future__ import annotations

from compactord.errors import InvalidArgument
from compactord.interfaces import CompactionServiceFactory, ServiceContext, TopicCompactionService

__all__ = ["SparklessFactory"]


class SparklessFactory(CompactionServiceFactory):
    def initialize(self, context: ServiceContext) -> None:
        self.settings = context.settings

    def new_topic_compaction_service(self, topic: str) -> TopicCompactionService:
        raise InvalidArgument(f"the test factory {type(self).__name__} compacts nothing (topic {topic!r})")

    def existing_topic_compaction_service(self, topic: str) -> TopicCompactionService | None:
        return None

    def set_topic_strategy(self, topic: str, ref: str | None) -> None:
        pass

    def close(self) -> None:
        pass
