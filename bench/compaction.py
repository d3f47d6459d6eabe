"""Benchmark: a compaction on Spark against the floor of reading the topic with the same Kafka client.

Usage (from the repository root, with the project's venv)::

    .venv/bin/python bench/compaction.py                      # 1,000,000 records, 10,000 keys, 4 partitions
    .venv/bin/python bench/compaction.py --quick              # a smoke run of a few seconds per figure
    .venv/bin/python bench/compaction.py --distinct-keys-check  # 1,000,000 distinct keys, default driver memory
    .venv/bin/python bench/compaction.py --distinct-keys-mode   # 5,000,000 distinct keys, spark.driver.memory=1g
    .venv/bin/python bench/compaction.py --slots 4              # Spark on local[4] (bench/contention.py compares)
    .venv/bin/python bench/compaction.py --concurrent           # two topics compacted at once, against one by one

It starts the bundled broker, builds the topic with several kafka-python producer processes, then
measures, in one run and on one warm Spark session:

- two **floors**: the data source's own consumer (librdkafka, same settings) and kafka-python's, each reading the whole topic once outside Spark: as many processes as the machine
  has cores (whatever ``--slots`` gives Spark), over the offset ranges ``plan_ranges`` gives the
  compaction, only iterating the records;
- a **full** compaction (``rebuild=True``) through the service, after untimed warm-up compactions (a full
  one of the topic; a full and ``--warmup-incrementals`` incremental ones of a side topic, which warm the
  incremental path as a daemon that has been up for a while has);
- an **incremental** compaction after producing 10% more records (ledger + tail);
- with ``--concurrent``, full compactions of two topics of the workload, one after the other and then both
  at once (as a daemon with ``compactionMaxConcurrentTasks=2`` runs them): ``concurrent/sequential=<ratio>``.

The floors and the full compaction alternate; each figure is the median of ``--runs`` runs. Every
compaction's ledger is checked against the number of live keys the generator implies. The last three
lines are ``full/floor_fastest=<ratio>`` (against the faster floor), ``full/floor=<ratio>`` (against
kafka-python's) and ``incremental/full=<ratio>`` (ratios of medians); ``--concurrent`` adds
``concurrent/sequential=<ratio>`` before them.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from floors import FLOOR_CLIENTS, floor_range, warm_worker
from usage import ROLES, MemorySampler, cpu_by_role, mb, status_kb
from workload import CONCURRENT_TOPIC, TOPIC, WARMUP_TOPIC, Workload, produce, release_scratch


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _fmt(xs: list[float]) -> str:
    return f"{_median(xs):.2f} s (runs: {', '.join(f'{x:.2f}' for x in xs)})"


def throttled_run(service: Any, factory: Any, cap: int) -> tuple[float, float, int]:
    """One full compaction at ``cap`` bytes/s: (read rate, reading seconds, bytes read). The reading
    runs from the first reading task's start to the moment the last one read its last record (both
    reported by the tasks themselves)."""
    factory.set_topic_limits(TOPIC, max_read_bytes_per_second=cap)
    try:
        task = service.compact(rebuild=True)
        while not task.done:
            time.sleep(0.05)
        if task.state.value != "Succeed":
            raise RuntimeError(f"the throttled compaction ended {task.state.value}: {task.error}")
        task.worker_done.wait(60)
        started, ended = task.progress.read_started_at, task.progress.read_ended_at
        if started is None or ended is None:
            raise RuntimeError("the throttled compaction's readers reported no reading time")
        seconds = ended - started
        return task.stats.bytes_read / max(seconds, 1e-3), seconds, task.stats.bytes_read
    finally:
        factory.set_topic_limits(TOPIC)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, help="records in the topic (default 1,000,000; 5,000,000 with --distinct-keys-mode)")
    ap.add_argument("--keys", type=int, default=10_000, help="distinct keys (default 10,000)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--tombstone-ratio", type=float, default=0.02)
    ap.add_argument("--runs", type=int, default=3, help="timed runs per figure (the median is reported)")
    ap.add_argument("--incremental-ratio", type=float, default=0.10, help="new records before an incremental run")
    ap.add_argument("--distinct-keys-mode", action="store_true",
                    help="every record has its own key (memory at scale); default 5,000,000 records and "
                         "spark.driver.memory=1g")
    ap.add_argument("--distinct-keys-check", action="store_true",
                    help="every record has its own key; default 1,000,000 records and Spark's default driver memory")
    ap.add_argument("--compare-grouping", action="store_true",
                    help="also time each full run with final reads off (the grouping job), back to back")
    ap.add_argument("--driver-memory", help="spark.driver.memory (default: Spark's own, 1g)")
    ap.add_argument("--conf", action="append", default=[], metavar="spark.KEY=VALUE",
                    help="a Spark setting for the daemon's session (repeatable), as a spark.* key of broker.conf")
    ap.add_argument("--producers", type=int, default=0, help="producer processes (default: one per partition, at most 8)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 40,000 records, 1,000 keys, 1 run")
    ap.add_argument("--no-incremental", dest="incremental", action="store_false",
                    help="skip the incremental runs (their figure and ratio print as nan)")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="skip the untimed warm-up compaction and floor (for the long distinct-keys runs)")
    ap.add_argument("--warmup-incrementals", type=int, default=6, metavar="N",
                    help="untimed incremental compactions of the warm-up topic before the timed runs (default 6)")
    ap.add_argument("--throttle", type=int, default=0, metavar="R",
                    help="after the timed runs, one full compaction capped at R bytes/s (maxReadBytesPerSecond): "
                         "prints the measured read rate against R")
    ap.add_argument("--slots", type=int, default=0, metavar="N",
                    help="Spark's task slots: sparkMaster=local[N] (default: local[*], one per core)")
    ap.add_argument("--concurrent", action="store_true",
                    help="also time two topics' full compactions at once against one after the other")
    ap.add_argument("--keep-logs", action="store_true", help="keep the broker log and ledger root (printed)")
    args = ap.parse_args(argv)
    if args.quick:
        args.records = args.records or 40_000
        args.keys = min(args.keys, 1_000)
        args.runs = 1 if "--runs" not in (argv if argv is not None else sys.argv) else args.runs
    if args.distinct_keys_mode and args.distinct_keys_check:
        ap.error("--distinct-keys-mode and --distinct-keys-check exclude each other")
    if args.distinct_keys_mode:
        args.records = args.records or 5_000_000
        args.driver_memory = args.driver_memory or "1g"
    if args.distinct_keys_check:
        args.distinct_keys_mode = True
        args.records = args.records or 1_000_000
    args.records = args.records or 1_000_000
    if args.slots < 0:
        ap.error(f"--slots must be positive (or 0: one per core), got: {args.slots}")
    for name in ("records", "partitions", "runs"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be positive, got: {getattr(args, name)}")
    if not args.distinct_keys_mode and args.keys < 1:
        ap.error(f"--keys must be positive, got: {args.keys}")
    for item in args.conf:
        key, sep, _ = item.partition("=")
        if not sep or not key.startswith("spark."):
            ap.error(f"--conf must be spark.KEY=VALUE, got: {item}")
    if not 0 <= args.tombstone_ratio < 1:
        ap.error(f"--tombstone-ratio must be in [0, 1), got: {args.tombstone_ratio}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from compactord.embedded import EmbeddedBroker

    workload = Workload(
        keys=0 if args.distinct_keys_mode else args.keys, partitions=args.partitions,
        value_bytes=args.value_bytes, tombstone_ratio=args.tombstone_ratio,
    )
    tmp = Path(tempfile.mkdtemp(prefix="compactord-bench-"))
    broker = EmbeddedBroker(log_path=tmp / "tansu.log")
    ctx = mp.get_context("spawn")  # never fork a process that has a JVM gateway and threads
    producers = args.producers or min(args.partitions, 8)
    sampler: MemorySampler | None = None
    manager = factory = None
    workers = None
    try:
        broker.start()
        print(f"broker {broker.bootstrap} (pid {broker.pid}); scratch {tmp}", flush=True)
        print(f"workload: {args.records:,} records, "
              f"{'distinct keys' if workload.keys == 0 else f'{workload.keys:,} keys'}, "
              f"{args.partitions} partitions, {args.value_bytes}-byte values, "
              f"{args.tombstone_ratio:.0%} tombstones; {args.runs} runs per figure", flush=True)
        with ctx.Pool(producers) as pool:
            from kafka import KafkaAdminClient
            from kafka.admin import NewTopic

            admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
            topics = [TOPIC, WARMUP_TOPIC] + ([CONCURRENT_TOPIC] if args.concurrent else [])
            admin.create_topics([NewTopic(name, args.partitions, 1) for name in topics])
            admin.close()
            sent, seconds = produce(pool, producers, workload, broker.bootstrap, 0, args.records)
            if args.concurrent:
                produce(pool, producers, workload, broker.bootstrap, 0, args.records, topic=CONCURRENT_TOPIC)
            if args.warmup:
                # The warm-up topic: one incremental-sized slice to compact fully, and one more after it.
                step = max(1, int(args.records * args.incremental_ratio))
                produce(pool, producers, workload, broker.bootstrap, 0, step, topic=WARMUP_TOPIC)
        print(f"build: {sent:,} records in {seconds:.1f} s ({sent / seconds:,.0f} records/s, "
              f"{producers} producer processes)", flush=True)
        produced = args.records

        from compactord.config import Settings
        from compactord.engine.factory import SparkCompactionServiceFactory
        from compactord.engine.kafka_source import OffsetRange, plan_ranges
        from compactord.engine.spark_session import SparkSessionManager
        from compactord.interfaces import ServiceContext
        from compactord.kafka.admin import KafkaAdmin
        from compactord.task import TaskState

        spark_conf = dict(item.split("=", 1) for item in args.conf)
        if args.driver_memory:
            spark_conf["spark.driver.memory"] = args.driver_memory
        settings = Settings(kafka_bootstrap_servers=broker.bootstrap, compacted_ledger_root=str(tmp / "ledgers"),
                            spark_conf=spark_conf,
                            spark_master=f"local[{args.slots}]" if args.slots else "local[*]")
        started = time.monotonic()
        manager = SparkSessionManager(settings)
        manager.start()
        sampler = MemorySampler().start()
        manager.warm_up()
        cores = manager.cores
        print(f"spark: master {settings.spark_master}, {cores} cores, driver memory "
              f"{args.driver_memory or 'default (1g)'}, settings {spark_conf or 'the daemon defaults'}; "
              f"session up and warm in {time.monotonic() - started:.1f} s", flush=True)
        factory = SparkCompactionServiceFactory()
        factory.initialize(ServiceContext(settings, spark=manager))
        service = factory.new_topic_compaction_service(TOPIC)

        readers = os.cpu_count() or 1
        workers = ctx.Pool(readers)  # the floor's readers: one process per core, started once
        workers.map(warm_worker, range(readers), chunksize=1)
        client = settings.kafka_client_config()

        cpu: dict[str, list[dict[str, float]]] = {
            **{f"floor {c}": [] for c in FLOOR_CLIENTS}, "full": [], "full, grouping": [], "incremental": [],
            "two at once": []}

        def cpu_now() -> dict[str, float]:
            return cpu_by_role(broker.pid, sampler.jvm_pid if sampler else None)

        def cpu_since(start: dict[str, float]) -> dict[str, float]:
            end = cpu_now()
            return {role: end[role] - start[role] for role in ROLES}

        def floor(client_name: str) -> float:
            kafka_admin = KafkaAdmin(settings)
            try:
                offsets = kafka_admin.offsets(TOPIC)
            finally:
                kafka_admin.close()
            ranges = plan_ranges([OffsetRange(p, o.log_start, o.end) for p, o in sorted(offsets.items())],
                                 readers, settings.compaction_read_ranges_per_core, whole_partitions=True)
            tasks = [(client_name, client, TOPIC, r.partition, r.start, r.end,
                      settings.compaction_reader_batch_records) for r in ranges]
            c0 = cpu_now()
            t0 = time.monotonic()
            n = sum(workers.map(floor_range, tasks, chunksize=1))  # largest first, handed out as cores free
            elapsed = time.monotonic() - t0
            cpu[f"floor {client_name}"].append(cpu_since(c0))
            total = sum(o.end - o.log_start for o in offsets.values())
            if n != total:
                raise RuntimeError(f"the floor read {n} records, the topic has {total}")
            return elapsed

        def compaction(rebuild: bool, expect_records: int, role: str | None = "", on: Any = None) -> tuple[float, dict[str, Any]]:
            c0 = cpu_now()
            t0 = time.monotonic()
            task = (on or service).compact(rebuild=rebuild)
            state = task.result(3600)
            elapsed = time.monotonic() - t0
            if role is not None:
                cpu[role or ("full" if rebuild else "incremental")].append(cpu_since(c0))
            checked(on or service, task, state, expect_records)
            # Field by field, not dataclasses.asdict: the stats hold a request counter with its lock.
            return elapsed, {f.name: getattr(task.stats, f.name) for f in dataclasses.fields(task.stats)}

        def checked(on: Any, task: Any, state: Any, expect_records: int) -> None:
            if state is not TaskState.SUCCEED:
                raise RuntimeError(f"compaction ended {state.value}: {task.error}")
            task.worker_done.wait(60)
            manifest = on.ledger_info()
            if manifest is None:
                raise RuntimeError("the compaction succeeded but the topic has no current ledger")
            kept = manifest.records_kept
            want = workload.live_keys(expect_records)
            if kept != want:
                raise RuntimeError(f"the ledger kept {kept} entries, the workload has {want} live keys")

        def two_at_once(other: Any) -> float:
            c0 = cpu_now()
            t0 = time.monotonic()
            tasks = [(on, on.compact(rebuild=True)) for on in (service, other)]
            states = [task.result(3600) for _, task in tasks]
            elapsed = time.monotonic() - t0
            cpu["two at once"].append(cpu_since(c0))
            for (on, task), state in zip(tasks, states):
                checked(on, task, state, args.records)
            return elapsed

        if args.warmup:
            t_warm, _ = compaction(True, produced)
            t_floor_warm = min(floor(c) for c in FLOOR_CLIENTS)
            # A long-running daemon compacts incrementally again and again: its JVM has compiled that
            # path (reading the ledger's Parquet next to the tail) too. Warm it on a topic of its own.
            # Several (``--warmup-incrementals``, small slices): the timed runs measure the steady state of
            # a daemon that has been up for a while, its JVM's compiler quiet (the closure cleaner's burst
            # is taken by the session's warm-up, ``spark_session.LOCAL_DRIVER_JAVA_OPTIONS``).
            warm_service = factory.new_topic_compaction_service(WARMUP_TOPIC)
            slices = [(step, 2 * step)] + [(2 * step + i * (step // 10), 2 * step + (i + 1) * (step // 10))
                                           for i in range(max(0, args.warmup_incrementals - 1))]
            for rebuild, (lo, hi) in [(True, (0, 0))] + [(False, s) for s in slices]:
                if not rebuild:
                    with ctx.Pool(producers) as pool:
                        produce(pool, producers, workload, broker.bootstrap, lo, hi, topic=WARMUP_TOPIC)
                t0 = time.monotonic()
                task = warm_service.compact(rebuild=rebuild)
                if task.result(3600) is not TaskState.SUCCEED:
                    raise RuntimeError(f"the warm-up compaction ended {task.state.value}: {task.error}")
                task.worker_done.wait(60)
            warm_incremental = f", last incremental on {WARMUP_TOPIC} {time.monotonic() - t0:.2f} s"
            for runs in cpu.values():
                runs.clear()
            print(f"warm-up (untimed): compaction {t_warm:.2f} s, floor {t_floor_warm:.2f} s{warm_incremental}",
                  flush=True)

        floors_by: dict[str, list[float]] = {c: [] for c in FLOOR_CLIENTS}
        fulls: list[float] = []
        groupings: list[float] = []
        for run in range(args.runs):
            if args.compare_grouping:
                from compactord.engine import job as engine_job

                reads_are_final, engine_job.reads_are_final = engine_job.reads_are_final, lambda *_, **__: False
                try:
                    groupings.append(compaction(True, produced, "full, grouping")[0])
                finally:
                    engine_job.reads_are_final = reads_are_final
                print(f"run {run + 1}: full with final reads off (the grouping job) {groupings[-1]:.2f} s", flush=True)
            for c in FLOOR_CLIENTS:
                floors_by[c].append(floor(c))
            t, stats = compaction(True, produced)
            fulls.append(t)
            used = cpu["full"][-1]
            print(f"run {run + 1}: floors {', '.join(f'{c} {v[-1]:.2f} s' for c, v in floors_by.items())}, "
                  f"full {t:.2f} s (read {stats['records_read']:,}, kept {stats['records_kept']:,}; CPU-s "
                  f"{', '.join(f'{role} {used[role]:.2f}' for role in ROLES if role != 'floor readers')})", flush=True)
        floors = floors_by["kafka-python"]
        fastest = min(FLOOR_CLIENTS, key=lambda c: _median(floors_by[c]))

        # Two topics: one after the other, then both at once, alternating run by run.
        sequentials: list[float] = []
        concurrents: list[float] = []
        if args.concurrent:
            other = factory.new_topic_compaction_service(CONCURRENT_TOPIC)
            compaction(True, args.records, None, other)  # untimed: its first run
            for run in range(args.runs):
                sequentials.append(compaction(True, produced, None)[0] + compaction(True, args.records, None, other)[0])
                concurrents.append(two_at_once(other))
                print(f"concurrent {run + 1}: one after the other {sequentials[-1]:.2f} s, both at once "
                      f"{concurrents[-1]:.2f} s", flush=True)

        incrementals: list[float] = []
        step = max(1, int(args.records * args.incremental_ratio))
        with ctx.Pool(producers) as pool:
            for run in range(args.runs if args.incremental else 0):
                sent, seconds = produce(pool, producers, workload, broker.bootstrap, produced, produced + step)
                produced += step
                t, stats = compaction(False, produced)
                if stats.get("full_rebuild"):
                    raise RuntimeError("the incremental compaction was a full rebuild")
                incrementals.append(t)
                print(f"incremental {run + 1}: +{sent:,} records (produced in {seconds:.1f} s), {t:.2f} s "
                      f"(ledger rows {stats['ledger_rows_read']:,} + tail {stats['tail_records']:,}, "
                      f"kept {stats['records_kept']:,})", flush=True)

        throttled = throttled_run(service, factory, args.throttle) if args.throttle else None
        sampler.stop()
        py_hwm = status_kb("self", "VmHWM")
        floor_m, full_m, inc_m = _median(floors), _median(fulls), _median(incrementals)
        print()
        for c in FLOOR_CLIENTS:
            print(f"floor ({c}, {readers} processes): {_fmt(floors_by[c])}")
        print(f"Spark {cores} slots on {os.cpu_count()} cores")
        print(f"full compaction (warm session):        {_fmt(fulls)}")
        if groupings:
            print(f"full compaction, final reads off:      {_fmt(groupings)}; "
                  f"full/grouping={_median(fulls) / _median(groupings):.2f}")
        print(f"incremental compaction (+{args.incremental_ratio:.0%}):      {_fmt(incrementals)}")
        print(f"records/s: floor {args.records / floor_m:,.0f} (kafka-python), "
              f"{args.records / _median(floors_by[fastest]):,.0f} ({fastest}); full {args.records / full_m:,.0f}")
        pairs = [full / fl for fl, full in zip(floors_by[fastest], fulls)]
        print(f"full/floor_fastest of each run (measured back to back): {', '.join(f'{x:.2f}' for x in pairs)}; "
              f"median {_median(pairs):.2f}")
        for name, runs in cpu.items():
            if runs:
                total = _median([sum(v for k, v in r.items() if k != "broker") for r in runs])
                parts = ", ".join(f"{role} {_median([r[role] for r in runs]):.2f}" for role in ROLES)
                print(f"CPU seconds (medians), {name}: {total:.2f} without the broker; {parts}")
        print(f"peak RSS, daemon Python process (VmHWM): {mb(py_hwm)}")
        print(f"peak RSS, Spark driver JVM (VmHWM, pid {sampler.jvm_pid}): {mb(sampler.jvm_hwm_kb)}")
        print(f"peak RSS, Spark Python workers (sum, sampled): {mb(sampler.workers_peak_kb)}")
        if throttled is not None:
            rate, seconds, nbytes = throttled
            print(f"throttled full compaction (cap {args.throttle:,} B/s): read {nbytes:,} bytes in {seconds:.1f} s, "
                  f"{rate:,.0f} B/s = {rate / args.throttle:.1%} of the cap")
        if concurrents:
            print(f"two topics, one after the other: {_fmt(sequentials)}; both at once: {_fmt(concurrents)}")
            print(f"concurrent/sequential={_median(concurrents) / _median(sequentials):.2f}")
        print(f"full/floor_fastest={full_m / _median(floors_by[fastest]):.2f}")
        print(f"full/floor={full_m / floor_m:.2f}")
        print(f"incremental/full={inc_m / full_m:.2f}")
        return 0
    finally:
        if sampler is not None and sampler._thread.is_alive():
            sampler.stop()
        if workers is not None:
            workers.terminate()
        if factory is not None:
            factory.close()
        if manager is not None:
            manager.stop()
        broker.stop()  # by PID (its process group)
        release_scratch(tmp, args.keep_logs)


if __name__ == "__main__":
    sys.exit(main())
