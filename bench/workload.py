"""The benchmark's topic: record ``i`` as a pure function of ``i``, and the producer processes that write it."""

from __future__ import annotations

import functools
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["CONCURRENT_TOPIC", "TOPIC", "WARMUP_TOPIC", "Workload", "produce", "release_scratch"]

_MASK = (1 << 64) - 1
TOPIC = "bench"
WARMUP_TOPIC = "bench-warm-up"
CONCURRENT_TOPIC = "bench-2"  # --concurrent: a second topic of the same workload, compacted beside TOPIC


def _mix(x: int) -> int:
    """splitmix64's finaliser: a cheap, well-spread, deterministic hash of an index."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


@dataclass(frozen=True)
class Workload:
    """Record ``i`` of the topic, as a pure function of ``i`` (so that producer processes agree)."""

    keys: int  # 0: every record has its own key
    partitions: int
    value_bytes: int
    tombstone_ratio: float
    seed: int = 1

    def key_id(self, i: int) -> int:
        return i if self.keys == 0 else _mix(i ^ (self.seed << 40)) % self.keys

    def partition(self, key_id: int) -> int:
        # Explicit partitions (no pure-Python murmur2 per record); a key stays in one partition.
        return key_id % self.partitions

    def is_tombstone(self, i: int) -> bool:
        return (_mix(i ^ (self.seed << 48) ^ 0x5A5A) % 1_000_000) < self.tombstone_ratio * 1_000_000

    @staticmethod
    def key(key_id: int) -> bytes:
        return b"key-%010d" % key_id

    def value_pool(self) -> bytes:
        return bytes(_mix(self.seed * 7919 + j) & 0xFF for j in range(4096 + self.value_bytes))

    @functools.lru_cache(maxsize=8)  # noqa: B019 (a handful of workloads per process)
    def live_keys(self, records: int) -> int:
        """How many keys a compaction of records ``0 .. records-1`` keeps (publishing order)."""
        if self.keys == 0:
            return sum(1 for i in range(records) if not self.is_tombstone(i))
        last: dict[int, int] = {}
        for i in range(records):
            last[self.key_id(i)] = i
        return sum(1 for i in last.values() if not self.is_tombstone(i))


def _produce_share(args: tuple[Workload, str, str, int, int, list[int]]) -> int:
    """A producer process: records ``lo .. hi-1`` whose partition it owns, in index order.

    Owning whole partitions (so whole keys) keeps each key's records in index order in the log, which
    makes the expected result of a compaction independent of how the processes interleave.
    """
    from kafka import KafkaProducer

    workload, bootstrap, topic, lo, hi, owned = args
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks=1, linger_ms=50, batch_size=1 << 20, max_request_size=8 << 20,
        compression_type=None,
    )
    pool = workload.value_pool()
    owned_set = set(owned)
    vb = workload.value_bytes
    sent = 0
    send = producer.send
    for i in range(lo, hi):
        key_id = workload.key_id(i)
        p = workload.partition(key_id)
        if p not in owned_set:
            continue
        if workload.is_tombstone(i):
            value = None
        else:
            start = _mix(i) % 4096
            value = pool[start : start + vb]
        send(topic, key=workload.key(key_id), value=value, partition=p)
        sent += 1
    producer.flush()
    producer.close()
    return sent


def produce(
    pool: Any, processes: int, workload: Workload, bootstrap: str, lo: int, hi: int, topic: str = TOPIC
) -> tuple[int, float]:
    """Produce records ``lo .. hi-1`` with one process per group of partitions; (records, seconds)."""
    groups = [list(range(g, workload.partitions, processes)) for g in range(processes)]
    started = time.monotonic()
    shares = [(workload, bootstrap, topic, lo, hi, g) for g in groups if g]
    sent = sum(pool.map(_produce_share, shares, chunksize=1))
    return sent, time.monotonic() - started


def release_scratch(tmp: Any, keep: bool) -> None:
    """A benchmark's scratch folder (broker log, ledger root) removed, or kept and named (``--keep-logs``)."""
    if keep:
        print(f"kept {tmp}", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
