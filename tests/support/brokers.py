"""``Answers``: the real broker's metadata, with some answers given by the test.

The test broker (Tansu 0.6) cannot move a log start (DeleteRecords breaks the connection), runs no
cleaner, and a production broker may report no topic id. Where a test needs such an answer, it gives
it here, at the one boundary where compactord receives it (``BrokerMetadata``, passed to the factory
in its ``ServiceContext``); everything else (the readers in Spark, the job, the ledger) runs for real
against the real broker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from compactord.errors import CompactordError
from compactord.interfaces import BrokerMetadata
from compactord.model import PartitionOffsets, RecordFingerprint, TopicConfigs

__all__ = ["Answers"]

_REAL = object()


@dataclass
class Answers(BrokerMetadata):
    """``real``'s answers, except: ``log_start[topic][partition]`` (a log start moved by retention or a
    broker's cleaner), ``topic_ids[topic]`` (None: a broker that reports no ids), ``ends[topic][p]``
    (an end the log may no longer reach), ``configs[topic]``."""

    real: BrokerMetadata
    log_start: dict[str, dict[int, int]] = field(default_factory=dict)
    topic_ids: dict[str, str | None] = field(default_factory=dict)
    ends: dict[str, dict[int, int]] = field(default_factory=dict)
    configs: dict[str, TopicConfigs] = field(default_factory=dict)

    def list_topics(self) -> list[str]:
        return self.real.list_topics()

    def ping(self) -> None:
        self.real.ping()

    def partitions(self, topic: str) -> list[int]:
        return self.real.partitions(topic)

    def topic_id(self, topic: str) -> str | None:
        given = self.topic_ids.get(topic, _REAL)
        return self.real.topic_id(topic) if given is _REAL else given  # type: ignore[return-value]

    def describe_many(self, topics: Sequence[str], stopping: Callable[[], bool] = lambda: False
                      ) -> dict[str, tuple[str | None, dict[int, PartitionOffsets], TopicConfigs] | CompactordError]:
        """``real``'s batched answer (the monitor's pass), with the answers given here."""
        found = self.real.describe_many(topics, stopping)
        for topic, answer in found.items():
            if not isinstance(answer, CompactordError):
                topic_id, offsets, configs = answer
                given = self.topic_ids.get(topic, _REAL)
                found[topic] = (topic_id if given is _REAL else given,  # type: ignore[assignment]
                                self._given(topic, offsets), self.configs.get(topic) or configs)
        return found

    def offsets(self, topic: str) -> dict[int, PartitionOffsets]:
        return self._given(topic, self.real.offsets(topic))

    def _given(self, topic: str, offsets: dict[int, PartitionOffsets]) -> dict[int, PartitionOffsets]:
        for p, start in self.log_start.get(topic, {}).items():
            o = offsets[p]
            offsets[p] = replace(o, log_start=start, end=max(o.end, start))
        for p, end in self.ends.get(topic, {}).items():
            offsets[p] = replace(offsets[p], end=end)
        return offsets

    def first_records(self, topic: str, at: Mapping[int, int],
                      offsets: Mapping[int, PartitionOffsets]) -> dict[int, RecordFingerprint | None]:
        starts = self.log_start.get(topic, {})
        found = self.real.first_records(topic, {p: o for p, o in at.items() if o >= starts.get(p, 0)}, offsets)
        return {p: found.get(p) for p in at}  # below a given log start: gone, as on a real broker

    def topic_configs(self, topic: str) -> TopicConfigs:
        return self.configs.get(topic) or self.real.topic_configs(topic)

    def close(self) -> None:
        self.real.close()
