"""Benchmark: one topic of many distinct keys, compacted full and then incrementally, with the peak memory of each
process, then read whole through the HTTP API (loopback only).

Usage (from the repository root, with the project's venv; the machine is shared, so niced)::

    nice -n 15 .venv/bin/python bench/large_topic.py                  # 10,000,000 distinct keys, 8 partitions
    nice -n 15 .venv/bin/python bench/large_topic.py --keys 200000    # a smoke run of about a minute
    .venv/bin/python bench/large_topic.py --replay-merge <root>/large/ledger-2   # only the merge's steps

It starts the bundled broker (Tansu, its records in memory) and makes one topic of ``--partitions`` partitions,
then produces ``--keys`` records with confluent-kafka's producer (``--producers`` processes, each owning whole
partitions; linger 50 ms, batches of 1 MB, ``--compression``): record ``k`` has the key ``key-%08d`` % k, a
100-byte ASCII value and the partition ``k % partitions``. It starts a daemon (``load.daemon_process``:
``compactord run``, a local root of its own, ``sparkMaster=local[2]``, the monitor triggering nothing, defaults
otherwise) and:

1. **full**: triggers the topic's compaction (``PUT .../compaction``) and waits for its SUCCESS;
2. **incremental**: produces ``--keys // 10`` more records, half of them updates of existing keys (``k * 7919 %
   keys``, every 25th of them a tombstone), half new keys, then triggers the incremental run;
3. **read**: reads the whole compacted view, every partition from offset 0, in pages of ``--page`` entries
   (``GET /v1/topics/<t>/compacted?encoding=utf8``, as ``compactord read`` does), counting entries;
4. once the daemon is stopped, replays partition 0's steps of an incremental run after its tail is read, on the
   last ledger, in a process of its own (``--replay-merge LEDGER_DIR`` does only this): the Arrow bytes allocated
   after each step and their peak during it, and the RSS (``partition_rows``, ``merge_into_ledger``, the deletion
   rules, ``write_part``, and the pool's ``release_unused()``).

For each run it prints the wall time (the trigger's request to the task's ``finished_at``), records read, rows in
the new ledger and its bytes (the run's history record; the ledger folder's size on disk), and the peak memory of
the daemon's Python process (the driver), its Spark JVM (the ``java`` child), Spark's Python daemon and the
Python workers that run the reading tasks (``pyspark_daemon`` / ``pyspark.worker`` in their command line, the
daemon's forked children), and the broker. A thread samples the process tree every 0.2 s: each process's
``VmHWM`` (the kernel's own peak; reset to the current RSS at each phase's start through ``/proc/<pid>/clear_refs``
where this user may, which root may) and the sum of ``VmRSS`` of each kind's live processes. Bytes per key are
(a worker's peak - the Python daemon's RSS it was forked from) / the keys of one reading range (a partition: a
reading task reads its partitions one after the other, each whole while it holds at most 3,000,000 records).

It stops (a non-zero exit naming every process's RSS) once the machine's ``MemAvailable`` falls below
``--min-available-gib`` (default 4). Figures, not assertions: timings here depend on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import daemon_process  # noqa: E402
from small_runs import create_topics, finished, trigger  # noqa: E402
from usage import _descendants, status_kb  # noqa: E402

from compactord.embedded import EmbeddedBroker  # noqa: E402
from compactord.ledger.layout import ledger_prefix  # noqa: E402

TOPIC = "large"
VALUE_BYTES = 100
UPDATE_STRIDE = 7919  # a prime: k * 7919 % keys are distinct keys spread over every partition
TOMBSTONE_EVERY = 25  # every 25th update deletes its key
KINDS = ("daemon", "jvm", "pyspark daemon", "worker", "other python", "broker")


# -- the records ----------------------------------------------------------------------------------------------

def _value_pool() -> bytes:
    rng = random.Random(1)
    return bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(4096 + VALUE_BYTES))


def record(keys: int, k: int, more: int = -1) -> tuple[int, bytes]:
    """The key id of the ``more``-th record of the increment (``more=-1``: of the first records, ``k``)."""
    if more < 0:
        return k, b"key-%08d" % k
    key_id = (more // 2) * UPDATE_STRIDE % keys if more % 2 == 0 else keys + more // 2
    return key_id, b"key-%08d" % key_id


def is_tombstone(more: int) -> bool:
    return more >= 0 and more % 2 == 0 and (more // 2) % TOMBSTONE_EVERY == 0


def _produce_share(args: tuple[str, str, int, int, int, bool, list[int], str]) -> tuple[int, int]:
    """A producer process: the records whose partition it owns; (records sent, delivery errors)."""
    from confluent_kafka import Producer

    bootstrap, topic, keys, partitions, count, increment, owned, compression = args
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000,
                         "compression.type": compression, "queue.buffering.max.messages": 1_000_000,
                         "queue.buffering.max.kbytes": 1 << 20})
    errors = [0]

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors[0] += 1

    pool = _value_pool()
    owned_set = set(owned)
    sent = 0
    for i in range(count):
        key_id, key = record(keys, i, i if increment else -1)
        p = key_id % partitions
        if p not in owned_set:
            continue
        start = (i * 131) % 4096
        value = None if is_tombstone(i if increment else -1) else pool[start:start + VALUE_BYTES]
        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=p, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        sent += 1
        if sent % 10_000 == 0:
            producer.poll(0)
    if producer.flush(300) != 0:
        raise SystemExit("the producer did not deliver every record within 300 s")
    return sent, errors[0]


def produce(bootstrap: str, keys: int, partitions: int, count: int, increment: bool, processes: int,
            compression: str) -> float:
    """``count`` records (the first ones, or the increment) with ``processes`` producer processes; seconds."""
    groups = [list(range(g, partitions, processes)) for g in range(processes)]
    started = time.monotonic()
    with mp.get_context("spawn").Pool(processes) as pool:
        results = pool.map(_produce_share, [(bootstrap, TOPIC, keys, partitions, count, increment, g, compression)
                                            for g in groups if g])
    if sum(e for _, e in results) or sum(s for s, _ in results) != count:
        raise SystemExit(f"produced {sum(s for s, _ in results)} of {count}, {sum(e for _, e in results)} errors")
    return time.monotonic() - started


# -- memory -------------------------------------------------------------------------------------------------

def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[1])
    except (OSError, ValueError):
        return 0


def mem_available_kb() -> int:
    return status_kb_of("/proc/meminfo", "MemAvailable")


def status_kb_of(path: str, name: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    return 0


@dataclass
class Peaks:
    """One phase's peaks by kind of process: the largest VmHWM of one process and the largest sampled sum of
    VmRSS over the kind's live processes (kB); how many processes of each kind were seen."""

    one: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    total: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    pids: dict[str, set[int]] = field(default_factory=lambda: {k: set() for k in KINDS})
    by_pid: dict[int, tuple[str, int]] = field(default_factory=dict)  # each process's kind and peak
    min_available_kb: int = 1 << 60
    reset: bool = True  # every VmHWM was reset at the phase's start


class TreeSampler:
    """Samples the daemon's process tree (and the broker) every 0.2 s; ``phase()`` starts new peaks."""

    def __init__(self, daemon_pid: int, broker_pid: int, min_available_kb: int) -> None:
        self.daemon_pid, self.broker_pid, self.min_available_kb = daemon_pid, broker_pid, min_available_kb
        self.peaks = Peaks()
        self.low_memory: str | None = None  # what each process held when the machine ran low
        self.commands: dict[int, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-sampler", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def tree(self) -> dict[int, str]:
        """Every process of the daemon's tree and the broker, by kind."""
        kinds = {self.daemon_pid: "daemon", self.broker_pid: "broker"}
        for pid in _descendants(self.daemon_pid):
            cmd = _cmdline(pid)
            if not cmd:
                continue
            if Path(cmd.split(" ", 1)[0]).name == "java":
                kinds[pid] = "jvm"
            elif "pyspark.worker" in cmd.split() and ("pyspark_daemon" in cmd or "pyspark.daemon" in cmd):
                # Spark's Python daemon for the tasks forks the workers: its child is a worker, same command line
                kinds[pid] = "worker" if kinds.get(_parent(pid)) in ("pyspark daemon", "worker") else "pyspark daemon"
            else:  # the data source's planners (pyspark.sql.worker.*: lookup, create, plan), their daemons
                kinds[pid] = "other python" if "python" in cmd else "other"
            self.commands[pid] = cmd
        return kinds

    def phase(self) -> Peaks:
        """End the current phase (its peaks returned) and start the next, resetting each process's VmHWM."""
        with self._lock:
            ended, self.peaks = self.peaks, Peaks()
            for pid in self.tree():
                try:
                    Path(f"/proc/{pid}/clear_refs").write_text("5")
                except OSError:
                    self.peaks.reset = False
        self.sample()
        return ended

    def sample(self) -> None:
        with self._lock:
            sums = dict.fromkeys(KINDS, 0)
            rss_by_pid = {}
            for pid, kind in self.tree().items():
                if kind not in KINDS:
                    continue
                rss = status_kb(pid, "VmRSS")
                if rss == 0:
                    continue  # ended
                rss_by_pid[pid] = (kind, rss)
                peak = max(status_kb(pid, "VmHWM"), rss)
                self.peaks.one[kind] = max(self.peaks.one[kind], peak)
                self.peaks.by_pid[pid] = (kind, max(peak, self.peaks.by_pid.get(pid, (kind, 0))[1]))
                self.peaks.pids[kind].add(pid)
                sums[kind] += rss
            for kind, kb in sums.items():
                self.peaks.total[kind] = max(self.peaks.total[kind], kb)
            available = mem_available_kb()
            self.peaks.min_available_kb = min(self.peaks.min_available_kb, available)
            if available < self.min_available_kb and self.low_memory is None:
                self.low_memory = (f"MemAvailable {available // 1024} MB < {self.min_available_kb // 1024} MB; RSS: "
                                   + ", ".join(f"{kind} {pid} {rss // 1024} MB" for pid, (kind, rss)
                                               in sorted(rss_by_pid.items(), key=lambda it: -it[1][1])))

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.sample()


# -- runs -------------------------------------------------------------------------------------------------------

def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def wait_success(client: httpx.Client, sampler: TreeSampler, sent: float, timeout: float) -> float:
    """Wait for the run triggered at ``sent`` to succeed (its end, epoch seconds); its progress every 30 s."""
    deadline, shown = time.monotonic() + timeout, time.monotonic()
    while time.monotonic() < deadline:
        if sampler.low_memory:
            raise SystemExit(f"stopped: {sampler.low_memory}")
        done = finished(client, TOPIC)  # SystemExit with its error if it did not succeed
        if done is not None and done >= sent - 1:
            return done
        if time.monotonic() - shown >= 30:
            shown = time.monotonic()
            progress = client.get(f"/v1/topics/{TOPIC}/compaction").json().get("progress") or {}
            print(f"  ... {progress.get('records_read')} of {progress.get('records_total')} records read, "
                  f"load {loadavg()}, MemAvailable {mem_available_kb() // 1024} MB", flush=True)
        time.sleep(0.5)
    raise SystemExit(f"the compaction did not end within {timeout:.0f} s")


def compaction(client: httpx.Client, sampler: TreeSampler, root: Path, timeout: float) -> dict[str, Any]:
    sampler.phase()
    load_before = loadavg()
    sent = trigger(client, TOPIC)
    done = wait_success(client, sampler, sent, timeout)
    peaks = sampler.phase()
    run = client.get(f"/v1/topics/{TOPIC}/history", params={"limit": 1}).json()["runs"][0]
    folder = root / ledger_prefix(TOPIC, run["ledger_after"])
    on_disk = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    return {"seconds": done - sent, "run": run, "on_disk": on_disk, "peaks": peaks,
            "load": f"{load_before} -> {loadavg()}"}


def read_all(client: httpx.Client, sampler: TreeSampler, partitions: int, page: int) -> dict[str, Any]:
    """Every partition's compacted view from offset 0, in pages; entries, tombstones, pages, seconds, peaks."""
    sampler.phase()
    entries = nulls = pages = 0
    started = time.monotonic()
    for p in range(partitions):
        start: int | None = 0
        while start is not None:
            if sampler.low_memory:
                raise SystemExit(f"stopped: {sampler.low_memory}")
            response = client.get(f"/v1/topics/{TOPIC}/compacted",
                                  params={"partition": p, "start": start, "limit": page, "encoding": "utf8"})
            if response.status_code != 200:
                raise SystemExit(f"page read answered {response.status_code}: {response.text[:300]}")
            body = response.json()
            pages += 1
            entries += len(body["entries"])
            nulls += sum(1 for e in body["entries"] if e["value"] is None)
            start = body["next_start"]
    seconds = time.monotonic() - started
    return {"seconds": seconds, "entries": entries, "nulls": nulls, "pages": pages, "peaks": sampler.phase()}


def replay_merge(ledger: Path) -> None:
    """Partition 0's steps of an incremental run after its tail is read (``range_task._finish``), replayed in this
    process on the ledger folder ``ledger`` with a tail made of its rows (every 20th key updated, as many new):
    after each step, Arrow's bytes allocated and their peak during the step (the bytes held at its start plus the
    peak of its own allocations, counted by a proxy of the pool that is the default during the step), and the
    process's RSS and its peak."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from compactord.engine.deletions import DeletionRules
    from compactord.engine.merge import merge_into_ledger
    from compactord.engine.strategies.publishing_order import reduce_last_offset
    from compactord.ledger.parts import part_name, write_part
    from compactord.ledger.row_groups import locate, partition_groups, partition_rows, row_groups_of
    from compactord.model import RECORD_SCHEMA

    pool = pa.default_memory_pool()
    proxies = []  # a proxy frees what it allocated: each outlives the step's tables

    def step(name: str | Callable[[Any], str], call: Callable[..., Any], *args: Any) -> Any:
        held, proxy = pa.total_allocated_bytes(), pa.proxy_memory_pool(pool)
        proxies.append(proxy)
        pa.set_memory_pool(proxy)
        try:
            result = call(*args)
        finally:
            pa.set_memory_pool(pool)
        show(name if isinstance(name, str) else name(result), held + proxy.max_memory())
        return result

    def show(name: str, peak: int | None = None) -> None:
        during = "" if peak is None else f", at most {peak >> 20:>5} MiB during it"
        print(f"  {name:<40} Arrow {pa.total_allocated_bytes() >> 20:>5} MiB{during:<28}; RSS "
              f"{status_kb('self', 'VmRSS') >> 10:>5} MiB, its peak {status_kb('self', 'VmHWM') >> 10:>5} MiB", flush=True)

    part = ledger / part_name(0)
    groups = partition_groups(list(row_groups_of(part, 0, pq.ParquetFile(part).metadata)), 0, 0)
    show(f"start ({pool.backend_name})")
    rows = step(lambda r: f"partition_rows: {r.num_rows:,} rows, {r.nbytes >> 20} MiB",
                partition_rows, groups, 0, 0, None)
    top = pc.max(rows["offset"]).as_py() + 1
    key_at, offset_at = RECORD_SCHEMA.get_field_index("key"), RECORD_SCHEMA.get_field_index("offset")

    def tail(rows: pa.Table) -> pa.Table:
        updates = rows.take(pa.array(range(0, rows.num_rows, 20)))
        updates = updates.set_column(offset_at, "offset", pc.add(updates["offset"], top))
        new = rows.take(pa.array(range(1, rows.num_rows, 20)))
        new = new.set_column(key_at, "key", pa.array([b"new-%08d" % i for i in range(new.num_rows)], pa.binary()))
        new = new.set_column(offset_at, "offset", pc.add(new["offset"], 2 * top))
        return pa.concat_tables([updates, new]).sort_by("offset").cast(RECORD_SCHEMA)

    winners = step(lambda r: f"(the tail's winners: {r.num_rows:,} rows)", tail, rows)
    table = step(lambda r: f"merge_into_ledger: {r.num_rows:,} rows",
                 merge_into_ledger, winners, rows, reduce_last_offset)
    del rows, winners
    show("the ledger's rows and the tail let go")
    rules = DeletionRules(int(time.time() * 1000), 86_400_000, False)
    table = step("apply_arrow", rules.apply_arrow, table)
    with tempfile.TemporaryDirectory() as scratch:
        step("write_part", write_part, table, *locate(None, f"{scratch}/{part_name(0)}"))
    del table
    show("every table let go")
    pool.release_unused()
    show("pyarrow's pool.release_unused()")


# -- the report -------------------------------------------------------------------------------------------------

def mib(kb: int) -> str:
    return f"{kb / 1024:,.0f} MiB"


def per_key(peaks: Peaks, keys_per_range: int) -> str:
    """A reading task's bytes per key: its worker's peak over the Python daemon it was forked from."""
    grown = peaks.one["worker"] - peaks.one["pyspark daemon"]
    if not peaks.one["worker"] or keys_per_range <= 0:
        return "n/a"
    return f"{grown * 1024 / keys_per_range:,.0f} B ({mib(grown)} / {keys_per_range:,} keys)"


def rows(results: dict[str, dict[str, Any]], keys_per_range: dict[str, int]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    full, inc, read = results["full"], results["incremental"], results["read"]

    def both(f: Any) -> tuple[str, str, str]:
        return f(full, "full"), f(inc, "incremental"), ""

    out.append(("wall time (trigger to SUCCESS; read: every page)", f"{full['seconds']:,.1f} s",
                f"{inc['seconds']:,.1f} s", f"{read['seconds']:,.1f} s ({read['pages']:,} pages)"))
    out.append(("records read", *both(lambda r, _: f"{r['run']['records_read']:,}")[:2],
                f"{read['entries']:,} entries ({read['nulls']:,} null values)"))
    out.append(("rows in the new ledger (entries and markers)", *both(lambda r, _: f"{r['run']['records_written']:,}")))
    out.append(("ledger bytes (manifest / on disk)",
                *both(lambda r, _: f"{r['run']['bytes_written'] / 2**20:,.1f} / {r['on_disk'] / 2**20:,.1f} MiB")))
    out.append(("spilled bytes", *both(lambda r, _: f"{(r['run'].get('spilled_bytes') or 0) / 2**20:,.1f} MiB")))
    for kind, label in (("daemon", "peak RSS, the daemon's Python process (driver)"),
                        ("jvm", "peak RSS, its Spark JVM (driver)"),
                        ("pyspark daemon", "peak RSS, Spark's Python daemon (workers forked from it)"),
                        ("worker", "peak RSS, one Python worker (a reading task)"),
                        ("broker", "peak RSS, the broker (Tansu, records in memory)")):
        out.append((label, *(mib(r["peaks"].one[kind]) for r in (full, inc, read))))
    out.append(("peak sum of the Python workers' RSS (sampled)", *(mib(r["peaks"].total["worker"])
                                                                   for r in (full, inc, read))))
    out.append(("Python workers seen", *(str(len(r["peaks"].pids["worker"])) for r in (full, inc, read))))
    out.append(("a reading task's bytes per key", per_key(full["peaks"], keys_per_range["full"]),
                per_key(inc["peaks"], keys_per_range["incremental"]), ""))
    out.append(("lowest MemAvailable", *(mib(r["peaks"].min_available_kb) for r in (full, inc, read))))
    out.append(("load average (before -> after)", full["load"], inc["load"], read.get("load", "")))
    return out


@contextlib.contextmanager
def _stopped_on_sigterm() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped bench stops its daemon and broker
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=10_000_000, help="records of the first compaction, each its own key")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--producers", type=int, default=2, help="producer processes")
    ap.add_argument("--compression", choices=("none", "lz4"), default="none")
    ap.add_argument("--page", type=int, default=10_000, help="entries per page of the read (1 to 10,000)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds a compaction may take")
    ap.add_argument("--min-available-gib", type=float, default=4.0,
                    help="stop once the machine's MemAvailable falls below this")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, ledgers)")
    ap.add_argument("--replay-merge", type=Path, metavar="LEDGER_DIR",
                    help="only replay partition 0's incremental merge on a ledger folder, step by step (the run "
                         "does this in a process of its own on its last ledger)")
    args = ap.parse_args(argv)
    if args.replay_merge:
        replay_merge(args.replay_merge)
        return 0
    if args.keys < 20 or args.partitions < 1 or args.producers < 1 or not 1 <= args.page <= 10_000:
        ap.error("need --keys >= 20, --partitions >= 1, --producers >= 1 and --page from 1 to 10,000")
    more = args.keys // 10
    min_available_kb = int(args.min_available_gib * 2**20)

    work = Path(tempfile.mkdtemp(prefix="compactord-large-topic-"))
    print(f"work directory: {work}; load {loadavg()}; MemAvailable {mem_available_kb() // 1024} MB", flush=True)
    results: dict[str, dict[str, Any]] = {}
    with _stopped_on_sigterm(), contextlib.ExitStack() as stack:
        broker = EmbeddedBroker(log_path=work / "tansu.log").start()
        stack.callback(broker.stop)
        if not args.keep:
            import shutil

            stack.callback(shutil.rmtree, work, True)
        assert broker.process is not None
        create_topics(broker.bootstrap, [TOPIC], args.partitions)
        seconds = produce(broker.bootstrap, args.keys, args.partitions, args.keys, False, args.producers,
                          args.compression)
        print(f"{args.keys:,} records produced in {seconds:.1f} s ({args.keys / seconds:,.0f} a second); broker RSS "
              f"{status_kb(broker.process.pid, 'VmRSS') // 1024} MB; load {loadavg()}", flush=True)
        if mem_available_kb() < min_available_kb:
            raise SystemExit(f"stopped: MemAvailable {mem_available_kb() // 1024} MB after producing")

        (work / "daemon").mkdir()
        with daemon_process(work / "daemon", broker.bootstrap) as (daemon, base), \
                httpx.Client(base_url=base, timeout=300) as client, \
                TreeSampler(daemon.pid, broker.process.pid, min_available_kb) as sampler:
            root = work / "daemon" / "ledgers"
            results["full"] = compaction(client, sampler, root, args.timeout)
            print(f"full: {results['full']['seconds']:.1f} s, {results['full']['run']['records_written']:,} rows",
                  flush=True)
            seconds = produce(broker.bootstrap, args.keys, args.partitions, more, True, args.producers,
                              args.compression)
            print(f"{more:,} more records produced in {seconds:.1f} s", flush=True)
            results["incremental"] = compaction(client, sampler, root, args.timeout)
            print(f"incremental: {results['incremental']['seconds']:.1f} s, "
                  f"{results['incremental']['run']['records_written']:,} rows", flush=True)
            load_before = loadavg()
            results["read"] = read_all(client, sampler, args.partitions, args.page)
            results["read"]["load"] = f"{load_before} -> {loadavg()}"
            resets = all(r["peaks"].reset for r in results.values())
            ledger = root / ledger_prefix(TOPIC, results["incremental"]["run"]["ledger_after"])

        print("\npartition 0's incremental merge replayed in a process of its own:", flush=True)
        subprocess.run([sys.executable, __file__, "--replay-merge", str(ledger)], check=True)

        tombstones = sum(1 for j in range(more) if is_tombstone(j))
        live = args.keys + more // 2 - tombstones  # the odd records of the increment are new keys
        # One reading range holds one partition's keys: the largest partition's (keys ``k % partitions``)
        keys_per_range = {"full": -(-args.keys // args.partitions),
                          "incremental": -(-(args.keys + more // 2) // args.partitions)}
        print()
        print(f"one topic of {args.keys:,} distinct keys, {args.partitions} partitions, {VALUE_BYTES}-byte values; "
              f"then {more:,} more ({more - more // 2:,} updates, {tombstones:,} of them tombstones, {more // 2:,} "
              f"new keys): {live:,} live keys expected; local[2], a local root; compression {args.compression}")
        if not resets:
            print("(VmHWM could not be reset per phase here: a process's figure is its peak since it started)")
        print("| | full | incremental | read of the whole view |\n|---|---|---|---|")
        for row in rows(results, keys_per_range):
            print("| " + " | ".join(row) + " |")
        print("\neach process's peak (VmHWM) by phase:")
        for name, result in results.items():
            for pid, (kind, kb) in sorted(result["peaks"].by_pid.items(), key=lambda it: (it[1][0], it[0])):
                print(f"  {name:<12} {kind:<15} {pid:>7} {mib(kb):>10}  {sampler.commands.get(pid, '')[-70:]}")
        if results["read"]["entries"] - results["read"]["nulls"] != live:
            print(f"FINDING: the read gave {results['read']['entries'] - results['read']['nulls']:,} live entries, "
                  f"{live:,} expected")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
