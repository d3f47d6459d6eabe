"""What the next compaction of a topic would do, before it runs (``GET .../compaction/preview``).

- ``exact_preview``: the job's read and choose steps (``job.build_winners``) over the same plan as a
  run, counted instead of written: a preview task (kind ``preview``) that never switches a ledger.
- ``sampled_preview``: an estimate on the driver, from the last ``sample`` records of each
  partition's tail (kafka-python) and the current ledger's keys (pyarrow): answers in seconds.

Bytes are the raw bytes of keys and values. ``kept_digest`` (exact only) is the sum over the kept
records of CRC-32 of ``"partition:offset"``: equal to the same sum over the ledger the next
compaction writes, record for record.
"""

from __future__ import annotations

import builtins
import zlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compactord.engine.job import CompactionJobSpec, build_winners
from compactord.engine.strategies import ResolvedStrategy, fold
from compactord.interfaces import CompactionStrategy
from compactord.model import Entry, LedgerManifest, PartitionOffsets
from compactord.storage import ObjectStore

__all__ = ["SAMPLE_RECORDS", "LedgerTotals", "exact_preview", "kept_digest", "ledger_totals", "sampled_preview"]

#: Tail records per partition that a sampled preview reads (at most).
SAMPLE_RECORDS = 10_000


def kept_digest(entries: Sequence[tuple[int, int]]) -> int:
    """The digest of kept records ``(partition, offset)``, as ``exact_preview`` computes it in Spark."""
    return sum(zlib.crc32(f"{p}:{o}".encode()) for p, o in entries)


def exact_preview(spark: Any, spec: CompactionJobSpec, strategy: CompactionStrategy) -> dict[str, int]:
    """Kept records, their key and value bytes and digest: the rows the job would write, counted."""
    from pyspark.sql import functions as F

    winners = build_winners(spark, spec, strategy)
    live = ~F.coalesce(F.col("marker"), F.lit(False))
    size = F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0))
    digest = F.crc32(F.concat_ws(":", F.col("partition").cast("string"), F.col("offset").cast("string")))
    row = winners.agg(
        F.sum(F.when(live, 1).otherwise(0)).alias("n"), F.sum(F.when(live, 0).otherwise(1)).alias("m"),
        F.sum(F.when(live, size).otherwise(0)).alias("b"), F.sum(F.when(live, digest).otherwise(0)).alias("d"),
    ).collect()[0]
    return {"records_kept": int(row["n"] or 0), "markers": int(row["m"] or 0), "bytes_kept": int(row["b"] or 0),
            "kept_digest": int(row["d"] or 0)}


@dataclass
class LedgerTotals:
    """A ledger's live entries and their key and value bytes, its markers, and the live entries of the
    keys asked for: (partition, key) -> bytes."""

    live: int = 0
    bytes: int = 0
    markers: int = 0
    matched: dict[tuple[int, builtins.bytes], int] = field(default_factory=dict)  # builtins: a field is "bytes"


def ledger_totals(files: Sequence[str], keys: Collection[bytes] = (), store: ObjectStore | None = None) -> LedgerTotals:
    """Count a ledger's files (keys of ``store``; no store: local paths) one at a time (memory: one file's key
    and value columns)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from compactord.ledger.row_groups import open_file

    totals = LedgerTotals()
    wanted = pa.array(list(keys), pa.binary())
    for name in files:
        with open_file(store, name) as f:
            table = pq.read_table(f, columns=["partition", "key", "value", "marker"])
        live = pc.invert(pc.fill_null(table["marker"], False))
        sizes = pc.add(pc.fill_null(pc.binary_length(table["key"]), 0), pc.fill_null(pc.binary_length(table["value"]), 0))
        totals.live += int(pc.sum(live).as_py() or 0)
        totals.markers += table.num_rows - int(pc.sum(live).as_py() or 0)
        totals.bytes += int(pc.sum(pc.if_else(live, sizes, 0)).as_py() or 0)
        if len(wanted):
            mask = pc.and_(live, pc.fill_null(pc.is_in(table["key"], value_set=wanted), False))
            found = table.filter(mask)
            for p, k, n in zip(found["partition"].to_pylist(), found["key"].to_pylist(),
                               pc.filter(sizes, mask).to_pylist(), strict=True):
                totals.matched[(p, k)] = n
    return totals


def sampled_preview(client_config: Mapping[str, Any], topic: str, offsets: Mapping[int, PartitionOffsets],
                    previous: LedgerManifest | None, ledger_files: Sequence[str], strategy: ResolvedStrategy,
                    sample: int = SAMPLE_RECORDS, store: ObjectStore | None = None) -> dict[str, Any]:
    """An estimate from the last ``sample`` tail records of each partition and the ledger's keys.

    The sample's share of kept records, of keys the ledger already holds, and of bytes is scaled to
    the whole tail; the ledger's entries whose keys the sample replaces are removed in proportion.
    """
    horizon = previous.horizon if previous is not None else {}
    tail_total = sampled = 0
    tail_bytes = 0
    winners: list[Entry] = []
    for p, o in sorted(offsets.items()):
        start = max(horizon.get(p, -1) + 1, o.log_start)
        if o.end <= start:
            continue
        tail_total += o.end - start
        records = _read_tail(client_config, topic, p, max(start, o.end - sample), o.end, strategy)
        sampled += len(records)
        tail_bytes += sum(len(e.key or b"") + len(e.value or b"") for e in records)
        winners.extend(_winners(strategy, records))
    ledger = ledger_totals(ledger_files if previous is not None else (), {w.key for w in winners if w.key}, store)
    live = ledger.matched
    scale = tail_total / sampled if sampled else 0.0
    kept_tail = [w for w in winners if not w.is_tombstone]
    replaced = [w for w in winners if (w.partition, w.key) in live]
    kept = ledger.live - len(replaced) * scale + len(kept_tail) * scale
    ledger_bytes = ledger.bytes
    kept_bytes = ledger_bytes - sum(live[(w.partition, w.key or b"")] for w in replaced) * scale \
        + sum(len(w.key or b"") + len(w.value or b"") for w in kept_tail) * scale
    read = ledger.live + tail_total
    read_bytes = ledger_bytes + tail_bytes * scale
    kept = max(0, min(read, round(kept)))
    kept_bytes = max(0, min(round(read_bytes), round(kept_bytes)))
    return {"records_kept": kept, "records_removed": read - kept, "bytes_kept": kept_bytes,
            "bytes_removed": max(0, round(read_bytes) - kept_bytes), "sample_records": sampled,
            "tail_records": tail_total}


def _winners(strategy: ResolvedStrategy, records: Sequence[Entry]) -> list[Entry]:
    by_key: dict[bytes, list[Entry]] = {}
    for e in records:
        if e.key is not None:
            by_key.setdefault(e.key, []).append(e)
    out = []
    for key, group in by_key.items():
        w = fold(strategy.strategy, group)
        # A key the sample deletes still replaces its ledger entry: it counts as a (removed) winner.
        out.append(w if w is not None else Entry(partition=group[0].partition, offset=group[-1].offset, key=key,
                                                 value=None))
    return out


def _read_tail(client_config: Mapping[str, Any], topic: str, partition: int, start: int, end: int,
               strategy: ResolvedStrategy) -> list[Entry]:
    """Records ``start`` to ``end`` of one partition (committed ones; control records skipped)."""
    import time

    from kafka import TopicPartition

    from compactord.event_time import event_time_extractor
    from compactord.kafka.client import consumer

    # No offset reset: a tail the log no longer holds is an error, never other offsets read instead.
    cons = consumer(client_config, max_poll_records=10_000, auto_offset_reset="none")
    out: list[Entry] = []
    extractor = event_time_extractor(strategy.settings.event_time_source)
    empty_deletes = strategy.settings.empty_value_is_tombstone
    try:
        tp = TopicPartition(topic, partition)
        cons.assign([tp])
        cons.seek(tp, start)
        deadline = time.monotonic() + 30
        while (cons.position(tp) or 0) < end and time.monotonic() < deadline:
            for r in cons.poll(timeout_ms=500).get(tp, ()):
                if r.offset < end:
                    value = None if empty_deletes and r.value == b"" else r.value
                    out.append(Entry(partition=partition, offset=r.offset, key=r.key, value=value,
                                     timestamp=r.timestamp, headers=tuple(r.headers or ()),
                                     event_time=extractor(r.timestamp, r.headers or ())))
    finally:
        cons.close()
    return out
