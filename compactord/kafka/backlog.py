"""A small read of topics' tails, for the backlog monitor: record sizes and the oldest timestamp after the horizon.
``sample_tails`` reads many topics with one consumer (its fetches go to each leader for all partitions at once)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from kafka import TopicPartition

from compactord.config import Settings
from compactord.kafka.client import consumer, translate_kafka_errors

__all__ = ["TailSample", "sample_tail", "sample_tails"]

SAMPLE_RECORDS = 200  # per partition
SAMPLE_FETCH_BYTES = 64 << 10  # per partition: the first batch at the horizon is all a sample needs


@dataclass(frozen=True)
class TailSample:
    mean_record_bytes: float  # key + value
    first_timestamp_ms: int | None  # of the oldest first record after the horizon, over partitions


def sample_tail(settings: Settings, topic: str, ranges: dict[int, tuple[int, int]],
                timeout_s: float = 5.0) -> TailSample:
    """Read the first few records of every non-empty ``[start, end)`` range."""
    live = {p: r for p, r in ranges.items() if r[1] > r[0]}
    if not live:
        return TailSample(0.0, None)
    with translate_kafka_errors(settings.kafka_bootstrap_servers, topic):
        cons = consumer(settings.kafka_client_config(), max_poll_records=SAMPLE_RECORDS * len(live))
        try:
            tps = {p: TopicPartition(topic, p) for p in live}
            cons.assign(list(tps.values()))
            for p, (start, _end) in live.items():
                cons.seek(tps[p], start)
            sizes: list[int] = []
            first: dict[int, int] = {}
            deadline = time.monotonic() + timeout_s
            while len(first) < len(live) and time.monotonic() < deadline:
                for tp, records in cons.poll(timeout_ms=200).items():
                    end = live[tp.partition][1]
                    for r in records[:SAMPLE_RECORDS]:
                        if r.offset >= end:
                            break
                        first.setdefault(tp.partition, r.timestamp)
                        sizes.append((len(r.key) if r.key else 0) + (len(r.value) if r.value else 0))
                    cons.pause(tp)
        finally:
            cons.close()
    valid = [ts for ts in first.values() if ts is not None and ts >= 0]
    return TailSample(sum(sizes) / len(sizes) if sizes else 0.0, min(valid) if valid else None)


def sample_tails(settings: Settings, ranges: dict[str, dict[int, tuple[int, int]]],
                 timeout_s: float = 5.0) -> dict[str, TailSample]:
    """``sample_tail`` of many topics at once: one consumer reads the first records of every non-empty
    ``[start, end)`` range of every topic."""
    live = {(t, p): r for t, parts in ranges.items() for p, r in parts.items() if r[1] > r[0]}
    sizes: dict[str, list[int]] = {t: [] for t in ranges}
    first: dict[tuple[str, int], int] = {}
    if live:
        with translate_kafka_errors(settings.kafka_bootstrap_servers, None):
            cons = consumer(settings.kafka_client_config(), max_poll_records=100_000,
                            max_partition_fetch_bytes=SAMPLE_FETCH_BYTES)
            try:
                tps = {key: TopicPartition(*key) for key in live}
                cons.assign(list(tps.values()))
                for key, (start, _end) in live.items():
                    cons.seek(tps[key], start)
                deadline = time.monotonic() + timeout_s
                while len(first) < len(live) and time.monotonic() < deadline:
                    for tp, records in cons.poll(timeout_ms=200).items():
                        key = (tp.topic, tp.partition)
                        end = live[key][1]
                        for r in records[:SAMPLE_RECORDS]:
                            if r.offset >= end:
                                break
                            first.setdefault(key, r.timestamp)
                            sizes[tp.topic].append((len(r.key) if r.key else 0) + (len(r.value) if r.value else 0))
                        cons.pause(tp)
            finally:
                cons.close()
    out = {}
    for topic in ranges:
        valid = [ts for (t, _p), ts in first.items() if t == topic and ts is not None and ts >= 0]
        got = sizes[topic]
        out[topic] = TailSample(sum(got) / len(got) if got else 0.0, min(valid) if valid else None)
    return out
