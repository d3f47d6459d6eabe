"""The Spark job of one compaction: previous ledger + new tail -> winners per key -> new ledger.

- Ordered built-in strategies pick winners natively (``max_by`` over the strategy's SQL order);
  other strategies fold each key's records in offset order in Python (``mapInArrow`` over rows
  sorted by partition, key and offset).
- A winning tombstone (a null value: Kafka's rule) deletes its key; under the built-in strategies it stays in the
  ledger as a marker until ``compactionTombstoneRetentionMs`` has passed since it first entered a ledger.
- Null-key records are kept in place when ``topicCompactionRetainNullKey`` is set (the reader already
  dropped them otherwise), each as a group of its own in the same aggregation.
- Rows below a partition's log start are dropped before the winners are chosen.
- Key expiry (``compactionKeyTtlMs``, the policy's ``keyTtlMs``): a keyed winner older than the TTL at
  the job's ``now_ms`` (its timestamp; its event time under ``event-time``) is treated as a winning
  deletion: dropped, or kept as a marker like any deletion.
- The output is sorted by (partition, offset) and written as Parquet into the new ledger's folder.
- Every ledger byte is read and written in Python (pyarrow), in the driver or Spark's Python workers, never
  by the JVM (whose Hadoop file system reaches no object store here): the grouping job reads the previous
  ledger's row groups and writes its sorted result through ``engine.ledger_io``.
- Final reads (``reads_are_final``): where each Kafka partition is read by one task, an ordered strategy's
  reader keeps exactly each key's winner (a key lives in one partition), so the job neither shuffles nor
  groups. An incremental run merges the partition's previous ledger rows in the same task
  (``merge.merge_into_ledger``). Each task then applies the deletion rules in Arrow and writes its
  partition's part file itself (``ledger.parts``): no row crosses into the JVM, and the tasks run as one
  stage of plain Python tasks (``kafka_source.run_writing_tasks``), not as a read through the data source. With every key distinct,
  the grouping and then the JVM's share of the write were most of the job's cost.
- The deletion rules (tombstones, markers, expiry) are ``deletions.DeletionRules``, in SQL and in Arrow.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from compactord.config import KAFKA_SECRET_ARGS, Settings
from compactord.engine import windows
from compactord.engine.deletions import DeletionRules, deleted_sql
from compactord.engine.kafka_source import FORMAT, OffsetRange, read_tasks, run_writing_tasks
from compactord.engine.ledger_io import ledger_rows, write_sorted
from compactord.engine.strategies import BUILTIN_REDUCERS, EventTimeOrder, ResolvedStrategy, fold, plan_for
from compactord.engine.strategies.publishing_order import reduce_last_offset
from compactord.engine.worker_store import describe, new_output
from compactord.interfaces import CompactionStrategy, OrderedCompactionStrategy
from compactord.ledger.row_groups import FileFacts, FileSlice, ledger_row_groups, max_partition_rows, partition_groups
from compactord.model import RECORD_DDL, RECORD_SCHEMA, Entry
from compactord.storage import ObjectStore

__all__ = ["CompactionJobSpec", "JobWidths", "job_spec", "reads_are_final", "run_compaction_job",
           "shuffle_partitions_for", "writing_tasks_spec"]

_COLUMNS = [f.name for f in RECORD_SCHEMA]
# Rows per shuffle partition when the width is sized from the job's rows (~64 MiB of 130-byte records,
# AQE's advisory partition size), and at least ~100k rows per partition to spread a job over the cores.
ROWS_PER_SHUFFLE_PARTITION = 500_000
MIN_ROWS_PER_SHUFFLE_PARTITION = 100_000
# The largest range whose reader may hold its partition's winners to the end (final reads): with every key
# distinct that is every row, ~400 bytes each as Python tuples (~200 MB per reading task at this bound).
# A full rebuild under publishing-order is bounded further out: its windows go to local disk past a memory
# budget (``engine.windows``), and what it holds is the set of keys it has seen: one task of 1,250,000 distinct
# keys peaked at 442 MB, of 3,000,000 at 661 MB (~125 bytes a key). Past it, the grouping job, which spills
# in the JVM.
FINAL_READ_MAX_RECORDS = 500_000
FINAL_SPILLING_READ_MAX_RECORDS = 3_000_000
# The most previous-ledger rows of one partition that its reading task may merge (held in Arrow, ~130 bytes
# a row at ~100-byte values, and copied a few times while merging): past it, the grouping job, which spills.
FINAL_READ_MAX_LEDGER_ROWS = 2_000_000


class JobWidths(NamedTuple):
    """The shuffle widths of a job (0 for both: the session's ``spark.sql.shuffle.partitions``)."""

    shuffle_partitions: int  # the aggregation by (partition, key)
    output_files: int  # the sort into the ledger's files


def shuffle_partitions_for(rows: int, cores: int) -> JobWidths:
    """The shuffle widths (aggregation, output files) of a job over ``rows`` records (an upper bound:
    readers drop losers).

    Spark's default of 200 partitions (which AQE coalesces only after the map side has written them)
    costs ~0.8 s per shuffle on a small job here, so a compaction is sized from what it reads: one
    partition per 500,000 rows, and for the aggregation at least one per core once there are 100,000
    rows per core. The sort into the ledger's files samples its input to find range bounds unless it
    writes a single file, so it is not widened for the cores.
    """
    by_size = max(1, -(-rows // ROWS_PER_SHUFFLE_PARTITION))
    by_cores = min(cores, -(-rows // MIN_ROWS_PER_SHUFFLE_PARTITION))
    return JobWidths(max(by_size, by_cores), by_size)


@dataclass(frozen=True)
class CompactionJobSpec:
    topic: str
    client_config: Mapping[str, Any] = field(repr=False)  # its secrets: never in a log line or an error
    ranges: Sequence[OffsetRange]
    ledger_files: Sequence[str]  # the previous ledger's Parquet files (empty for a full rebuild)
    output_path: str
    strategy_ref: str  # built-in name or module:Class, loaded again inside the readers
    event_time_source: str
    retain_null_key: bool
    empty_value_is_tombstone: bool
    tombstone_retention_ms: int
    now_ms: int
    log_start: Mapping[int, int]
    batch_records: int
    # The run's channel (``channel.RunChannel.endpoint``); None: tasks that report nothing (the warm-up's).
    # Its token goes to the tasks, in what the driver ships them, and nowhere else: not in the spec's repr.
    channel: Mapping[str, Any] | None = field(default=None, repr=False)
    # The shuffle widths of the aggregation and of the sort into the ledger's files (0: the session's
    # spark.sql.shuffle.partitions); see ``shuffle_partitions_for``.
    shuffle_partitions: int = 0
    output_files: int = 0
    # Each reading task keeps exactly its partition's winners: no shuffle, no grouping (``reads_are_final``).
    final_reads: bool = False
    key_ttl_ms: int = 0  # 0: keys never expire
    ttl_by_event_time: bool = False  # a key's age is its winner's event time (else its timestamp)
    read_bytes_per_second: float = 0  # one reading task's share of the read budget (0: unlimited)
    # Final reads of an incremental run: per partition, the previous ledger's files and row groups its
    # reading task merges (``ledger.row_groups.partition_groups``; the footers are read once, here).
    ledger_groups: Mapping[int, Sequence[FileSlice]] = field(default_factory=dict)
    # Each of ``ledger_files``' size and CRC-32C as the previous ledger's manifest lists them: its footer is then
    # read without a HEAD, and once per process (``ledger.row_groups.file_footer``).
    ledger_facts: Mapping[str, FileFacts] = field(default_factory=dict)
    # The cores that run the reading tasks: a small job's ranges are packed into a task per core
    # (``kafka_source.read_tasks``); 0: a task per range.
    cores: int = 0
    # The ledger root, as tasks open it (``worker_store.describe``: no credential in it): ``ledger_files`` and
    # ``output_path`` are its keys. None: they are local paths (the warm-up's).
    store: Mapping[str, Any] | None = None


def job_spec(
    settings: Settings,
    strategy: ResolvedStrategy,
    *,
    topic: str,
    ranges: Sequence[OffsetRange],
    ledger_files: Sequence[str],
    output_path: str,
    log_start: Mapping[int, int],
    widths: JobWidths,
    channel: Mapping[str, Any] | None = None,
    client_config: Mapping[str, Any] | None = None,
    now_ms: int | None = None,
    key_ttl_ms: int = 0,
    read_bytes_per_second: float = 0,
    cores: int = 0,
    store: ObjectStore | None = None,
    ledger_facts: Mapping[str, FileFacts] | None = None,
) -> CompactionJobSpec:
    """The one place a job's spec is built: from the settings and the strategy in force for the run.

    ``now_ms`` (default: now) is the instant tombstone retention and key expiry are measured at: the
    task's start, so that a run's result does not depend on when Spark reaches the step. ``store``: the ledger
    root whose keys ``ledger_files`` and ``output_path`` are (None: local paths); ``ledger_facts``: their sizes
    and checksums (``CompactionJobSpec.ledger_facts``)."""
    facts = dict(ledger_facts or {})
    groups = ledger_row_groups(ledger_files, store, facts) if ledger_files else []
    final = reads_are_final(strategy.strategy, ranges, ledger_files, log_start, max_partition_rows(groups),
                            retain_null_key=strategy.settings.retain_null_key)
    return CompactionJobSpec(
        topic=topic,
        client_config=settings.kafka_client_config(secrets=False) if client_config is None else client_config,
        ranges=ranges,
        ledger_files=ledger_files,
        output_path=output_path,
        strategy_ref=strategy.ref,
        event_time_source=strategy.settings.event_time_source,
        retain_null_key=strategy.settings.retain_null_key,
        empty_value_is_tombstone=strategy.settings.empty_value_is_tombstone,
        tombstone_retention_ms=settings.compaction_tombstone_retention_ms,
        now_ms=int(time.time() * 1000) if now_ms is None else now_ms,
        log_start=log_start,
        batch_records=settings.compaction_reader_batch_records,
        channel=channel,
        shuffle_partitions=widths.shuffle_partitions,
        output_files=widths.output_files,
        final_reads=final,
        key_ttl_ms=key_ttl_ms,
        ttl_by_event_time=isinstance(strategy.strategy, EventTimeOrder),
        read_bytes_per_second=read_bytes_per_second,
        ledger_groups={p: partition_groups(groups, p, start, facts) for p, start in log_start.items()}
        if final and ledger_files else {},
        ledger_facts=facts,
        cores=cores,
        store=describe(store) if store is not None else None,
    )


def reads_are_final(strategy: CompactionStrategy, ranges: Sequence[OffsetRange], ledger_files: Sequence[str],
                    log_start: Mapping[int, int], ledger_partition_rows: int = 0, *,
                    retain_null_key: bool = False) -> bool:
    """Whether the readers' own reduction is the job's answer, so that Spark need not group the rows.

    It is when the strategy is an order (its reducer keeps each key's best record: exactly the winner, a
    key living in one partition), each partition is read by a single task from at or above its log start
    (nothing is dropped after the reduction), and no range is so large that holding its winners to the
    end costs too much memory (``FINAL_READ_MAX_RECORDS``; ``FINAL_SPILLING_READ_MAX_RECORDS`` under
    publishing-order when the run is a full rebuild that retains no null-key record: its task keeps its
    windows on local disk past a memory budget, ``engine.windows``). An incremental run merges each partition's
    previous ledger rows in its reading task (``merge.merge_into_ledger``): ``log_start`` must then name
    every partition of the topic (a task is planned for each, also one without new records), no partition
    may have more ledger rows than a task should hold (``ledger_partition_rows``, at most
    ``FINAL_READ_MAX_LEDGER_ROWS``: ``ledger.row_groups.max_partition_rows``), and a
    plug-in order under event time (its deletion markers) is left to the grouping job, whose rows carry
    the marker columns the plug-in's ``order_key`` may look at.
    """
    if not ranges or not isinstance(strategy, OrderedCompactionStrategy):
        return False
    partitions = [r.partition for r in ranges]
    if ledger_files:
        plan = plan_for(strategy)
        if not set(partitions) <= set(log_start) or ledger_partition_rows > FINAL_READ_MAX_LEDGER_ROWS or (
                plan.keeps_deletion_markers and plan.reducer not in BUILTIN_REDUCERS.values()):
            return False
    # What else a final read holds to its end stays in memory: another order's rows, merged ledger rows,
    # retained null-key rows.
    spills = not ledger_files and not retain_null_key and plan_for(strategy).reducer is reduce_last_offset
    most = FINAL_SPILLING_READ_MAX_RECORDS if spills else FINAL_READ_MAX_RECORDS
    return len(set(partitions)) == len(partitions) and all(
        r.size <= most and r.start >= log_start.get(r.partition, 0) for r in ranges)


def _read_ranges(spec: CompactionJobSpec) -> list[OffsetRange]:
    """The reading tasks' ranges. Final reads write a file per reading task: in partition order, so that
    the files' names sort as their rows do (the ledger is sorted across its files); an incremental one
    has a task for every partition, which carries over the ledger rows of one without new records."""
    if not spec.final_reads:
        return list(spec.ranges)
    ranges = list(spec.ranges)
    if spec.ledger_files:
        read = {r.partition for r in ranges}
        ranges += [OffsetRange(p, 0, 0) for p in spec.log_start if p not in read]
    return sorted(ranges, key=lambda r: r.partition)


def _reader_spec(spec: CompactionJobSpec, write: DeletionRules | None = None) -> str:
    """The data source's options. ``write``: final reads whose tasks apply these rules and write their
    partition's part file into the output folder themselves (``run_compaction_job``). No secret of the Kafka
    client is in them: the tasks get those over the run's channel."""
    ranges = _read_ranges(spec)
    return json.dumps(
        {
            "client": {arg: value for arg, value in spec.client_config.items() if arg not in KAFKA_SECRET_ARGS},
            "topic": spec.topic,
            "ranges": [[r.partition, r.start, r.end] for r in ranges],
            "read_tasks": read_tasks(ranges, spec.cores) if spec.cores else 0,
            "final": spec.final_reads,
            "ledger_groups": {str(p): [[part.name, list(part.indexes), part.size, part.crc32c] for part in groups]
                              for p, groups in spec.ledger_groups.items()},
            "log_start": {str(p): s for p, s in spec.log_start.items()},
            "strategy": spec.strategy_ref,
            "event_time_source": spec.event_time_source,
            "retain_null_key": spec.retain_null_key,
            "empty_value_is_tombstone": spec.empty_value_is_tombstone,
            "batch_records": spec.batch_records,
            "channel": dict(spec.channel) if spec.channel is not None else None,
            "read_bytes_per_second": spec.read_bytes_per_second,
            "write_to": spec.output_path if write is not None else None,
            "deletion_rules": write.to_json() if write is not None else None,
            "window_memory_bytes": windows.MEMORY_BUDGET_BYTES,
            "store": dict(spec.store) if spec.store is not None else None,
        }
    )


def _fold_partition(strategy: CompactionStrategy) -> Any:
    """An RDD ``mapPartitions`` function: rows sorted by their group and offset -> each group's winner.

    Only strategies without a native query take this path (per-row Python); the built-ins run in SQL.
    """

    def run(rows: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
        group: list[Entry] = []
        group_key: tuple[Any, ...] | None = None
        for row in rows:
            key = (row["partition"], row["key"], row[_NULL_KEY_GROUP])
            if key != group_key and group:
                winner = fold(strategy, group)
                if winner is not None:
                    yield _entry_row(winner)
                group = []
            group_key = key
            group.append(Entry.from_row(row.asDict(recursive=True)))
        if group:
            winner = fold(strategy, group)
            if winner is not None:
                yield _entry_row(winner)

    return run


def _entry_row(e: Entry) -> tuple[Any, ...]:
    headers = [(k, v) for k, v in e.headers]
    return (e.partition, e.offset, e.timestamp, e.key, e.value, headers, e.event_time, e.marker, e.marker_at)


# Rows are grouped by (partition, key, this): null for a keyed row, the offset for a null-key row, so
# that every retained null-key record is a group of its own and wins itself, in the same pass.
_NULL_KEY_GROUP = "null_key_offset"
_LAST_RANK = 2**63 - 1  # first-value: a deletion ranks after every value of its key
_GROUP = ["partition", "key", _NULL_KEY_GROUP]


def _records(spark: Any, spec: CompactionJobSpec) -> Any:
    """The tail and the previous ledger's rows, minus what the log no longer holds.

    The log start bounds what is readable (Kafka's rule, and Pulsar's for its compacted ledger): rows
    below it are dropped *before* the winners are chosen, so that a strategy chooses among what the
    log still holds (first-value's next value, not a value retention removed).
    """
    from pyspark.sql import functions as F

    records = spark.read.format(FORMAT).option("spec", _reader_spec(spec)).load()
    if spec.ledger_files and not spec.final_reads:  # final reads merge the ledger in the reading tasks
        ledger = ledger_rows(spark, spec.ledger_files, spec.log_start,
                             spec.cores or spark.sparkContext.defaultParallelism, _task_access(spec), spec.ledger_facts)
        if ledger is not None:
            records = records.unionByName(ledger)
    if any(spec.log_start.values()):
        starts = F.create_map(*[F.lit(x) for p, s in spec.log_start.items() for x in (p, s)])
        records = records.where(F.col("offset") >= F.coalesce(starts[F.col("partition")], F.lit(0)))
    if not spec.retain_null_key:
        records = records.where(F.col("key").isNotNull())  # the readers dropped them already
    return records.withColumn(_NULL_KEY_GROUP, F.when(F.col("key").isNull(), F.col("offset")))


def build_winners(spark: Any, spec: CompactionJobSpec, strategy: CompactionStrategy) -> Any:
    """The DataFrame of the new ledger (unsorted). Kafka is read once (``explain()`` shows one scan)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    plan = plan_for(strategy)
    records = _records(spark, spec)
    if spec.final_reads:
        # Each row is its key's winner already (``reads_are_final``): only the deletion rules below apply.
        return deletion_rules(spec, strategy).apply_sql(records).select(*_COLUMNS)
    if spec.shuffle_partitions:
        # The aggregations below group by (partition, key, ...): this exchange is the only one they need.
        records = records.repartition(spec.shuffle_partitions, "partition", "key")
    deleted = deleted_sql()
    if plan.sql_order is not None:
        winners = (
            records.groupBy(*_GROUP)
            .agg(F.max_by(F.struct(*_COLUMNS), F.expr(plan.sql_order)).alias("w"))
            .select("w.*")
        )
    elif plan.first_value:
        # The first value after the key's last deletion (or its first value if it has none); a key with no
        # value after it: that deletion (a tombstone, or a marker carried over), for the deletion rules.
        last_delete = F.max(F.when(deleted, F.col("offset"))).over(Window.partitionBy(*_GROUP))
        rank = F.when(deleted, F.lit(_LAST_RANK)).otherwise(F.col("offset"))
        winners = (
            records.withColumn("last_delete", F.coalesce(last_delete, F.lit(-1)))
            .where(F.col("offset") >= F.col("last_delete"))
            .groupBy(*_GROUP)
            .agg(F.min_by(F.struct(*_COLUMNS), rank).alias("w"))
            .select("w.*")
        )
    else:
        if not spec.shuffle_partitions:
            records = records.repartition("partition", "key")
        sorted_rows = records.sortWithinPartitions(*_GROUP, "offset")
        winners = spark.createDataFrame(sorted_rows.rdd.mapPartitions(_fold_partition(strategy)), RECORD_DDL)

    return deletion_rules(spec, strategy).apply_sql(winners).select(*_COLUMNS)


def deletion_rules(spec: CompactionJobSpec, strategy: CompactionStrategy) -> DeletionRules:
    """The deletion rules of the job ``spec`` describes (``deletions.py``)."""
    return DeletionRules(now_ms=spec.now_ms, tombstone_retention_ms=spec.tombstone_retention_ms,
                         keeps_markers=plan_for(strategy).keeps_deletion_markers, key_ttl_ms=spec.key_ttl_ms,
                         ttl_by_event_time=spec.ttl_by_event_time)


def writing_tasks_spec(spec: CompactionJobSpec, strategy: CompactionStrategy) -> dict[str, Any] | None:
    """The reading tasks' spec when they write the ledger's part files themselves (final reads), else None.

    No exchange, no sort, and no row into the JVM: each reading task holds its partition's winners in offset
    order (``RangeReadTask._flush``), applies the deletion rules in Arrow and writes its part file
    (``ledger.parts.write_part``); the job's only rows are none. Through Spark's writer, the rows' way from
    Arrow to Parquet cost the JVM ~6.7 CPU-s per million rows."""
    if not spec.final_reads:
        return None
    return json.loads(_reader_spec(spec, write=deletion_rules(spec, strategy)))


def run_compaction_job(spark: Any, spec: CompactionJobSpec, strategy: CompactionStrategy) -> None:
    """Compute the winners and write them, sorted by (partition, offset), to ``spec.output_path``."""
    tasks = writing_tasks_spec(spec, strategy)
    if tasks is not None:
        new_output(spec.store, spec.output_path)
        run_writing_tasks(spark, tasks)
        return
    result = build_winners(spark, spec, strategy)
    if spec.output_files:
        # repartitionByRange(1) samples nothing and costs no more than a plain exchange.
        ordered = result.repartitionByRange(spec.output_files, "partition", "offset")
        ordered = ordered.sortWithinPartitions("partition", "offset")
    else:
        ordered = result.orderBy("partition", "offset")
    write_sorted(ordered, spec.output_path, _task_access(spec))


def _task_access(spec: CompactionJobSpec) -> dict[str, Any]:
    """What the grouping job's tasks need to open the ledger root (``worker_store.spec_store``)."""
    return {"store": dict(spec.store) if spec.store is not None else None,
            "channel": dict(spec.channel) if spec.channel is not None else None}
