"""Benchmark: the fixed cost of a small topic's compaction, through the real daemon over HTTP (loopback only).

Usage (from the repository root, with the project's venv)::

    .venv/bin/python bench/small_runs.py                       # 300 topics of 300 records, 1 partition
    .venv/bin/python bench/small_runs.py --topics 1000
    .venv/bin/python bench/small_runs.py --source /tmp/base --source .   # two checkouts side by side
    .venv/bin/python bench/small_runs.py --profile wall                  # py-spy over the incremental burst (or cpu, gil)

It starts the bundled broker, creates ``--topics`` topics of ``--records`` records each (``--partitions``
partitions, 100-byte values over ``--keys`` keys, 2% tombstones), then for each ``--source`` (a checkout whose
``compactord`` package the daemon runs; default: this one) starts a daemon (``compactord run``, a ledger root
of its own, ``sparkMaster=local[2]``, the monitor triggering nothing) and, once it is ready (Spark warm):

1. ``--singles`` small compactions one at a time, each of a topic not compacted yet (a first, full run), then
   as many again after ``--more`` more records were produced to those topics (an incremental run): each one's
   wall time from the trigger's request to its ``finished_at``; their p50 and p90.
2. every other topic's first compaction triggered at once (the triggers sent from 8 threads): the time from the
   first trigger to the last ``finished_at``, the rate, and the daemon process's CPU time per run meanwhile
   (``/proc``: its threads', the status polls' included; not Spark's JVM); then ``--more`` more records to every
   topic and every topic's incremental compaction triggered at once, the same figures.

The sources run one after the other on the same broker and topics (the same records); ``--rounds`` > 1
alternates them. It prints a table. Targets (see #40): a small compaction's p50 <= 0.1 s, 1,000 topics due
at once all done within 60 s. Figures, not assertions: timings here depend on the machine, which other jobs
share; compare sources measured in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compactord.embedded import EmbeddedBroker, free_port

JSON = {"Content-Type": "application/json"}
TRIGGER_THREADS = 8


def parse_ts(value: str) -> float:
    return datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.UTC).timestamp()


@contextlib.contextmanager
def daemon(work: Path, bootstrap: str, source: Path, conf: dict[str, str]) -> Iterator[tuple[str, int]]:
    """A ready daemon running ``source``'s package, its root and log under ``work``; its base URL and pid. Stopped
    on exit (SIGTERM, then SIGKILL to its process group, its Spark JVM included)."""
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    keys = {"kafkaBootstrapServers": bootstrap, "compactedLedgerRoot": str(work / "ledgers"), "httpPort": str(port),
            "sparkMaster": "local[2]", "compactionTopicsPattern": "(?!)", **conf}
    conf_file = work / "broker.conf"
    conf_file.write_text("".join(f"{k}={v}\n" for k, v in keys.items()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTORD_")}
    env.update(PYTHONPATH=str(source.resolve()), PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    base = f"http://127.0.0.1:{port}"
    with open(work / "daemon.log", "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "compactord", "run", "--config", str(conf_file)],
                                   cwd=source, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            with httpx.Client(base_url=base, timeout=60) as client:
                deadline = time.monotonic() + 300
                while True:
                    with contextlib.suppress(httpx.HTTPError, ValueError):
                        if client.get("/readyz").json().get("compactions"):
                            break
                    if time.monotonic() > deadline or process.poll() is not None:
                        raise SystemExit(f"the daemon did not become ready; see {work / 'daemon.log'}")
                    time.sleep(0.2)
            yield base, process.pid
        finally:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        for i in range(0, len(names), 100):
            admin.create_topics([NewTopic(n, partitions, 1) for n in names[i:i + 100]])
    finally:
        admin.close()


def produce(bootstrap: str, names: list[str], records: int, keys: int, partitions: int, start: int) -> None:
    """Records ``start .. start+records-1`` to each topic: key ``i % keys``, 2% tombstones, 100-byte values."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=256 * 1024)
    try:
        for name in names:
            for i in range(start, start + records):
                value = None if i % 50 == 49 else b"v" * 100
                producer.send(name, key=b"k%d" % (i % keys), value=value, partition=i % partitions)
        producer.flush()
    finally:
        producer.close()


def trigger(client: httpx.Client, topic: str) -> float:
    """Trigger ``topic``'s compaction; the time (epoch seconds) the request was sent."""
    sent = time.time()
    response = client.put(f"/v1/topics/{topic}/compaction", headers=JSON)
    if response.status_code != 202:
        raise SystemExit(f"trigger of {topic} answered {response.status_code}: {response.text[:300]}")
    return sent


def finished(client: httpx.Client, topic: str) -> float | None:
    """``topic``'s task's ``finished_at`` once it succeeded, None while it runs."""
    body = client.get(f"/v1/topics/{topic}/compaction").json()
    if body.get("status") == "RUNNING":
        return None
    if body.get("status") != "SUCCESS":
        raise SystemExit(f"compaction of {topic} ended {body.get('state')}: {body.get('last_error')}")
    return parse_ts(body["finished_at"])


def single(client: httpx.Client, topic: str) -> float:
    sent = trigger(client, topic)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        done = finished(client, topic)
        if done is not None:
            return done - sent
        time.sleep(0.005)
    raise SystemExit(f"compaction of {topic} did not end in 300 s")


def cpu_seconds(pid: int) -> float:
    """The process's CPU seconds so far (user and system, its threads; not its children's, so not Spark's JVM)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def burst(base: str, topics: list[str], pid: int) -> tuple[float, int, float]:
    """Trigger every topic's compaction at once; (seconds from the first trigger to the last end, topics, the
    daemon's CPU seconds meanwhile, its status requests' included)."""
    cpu = cpu_seconds(pid)
    clients = [httpx.Client(base_url=base, timeout=120) for _ in range(TRIGGER_THREADS)]
    try:
        with ThreadPoolExecutor(TRIGGER_THREADS) as pool:
            sent = list(pool.map(lambda it: trigger(clients[it[0] % TRIGGER_THREADS], it[1]), enumerate(topics)))
        first = min(sent)
        left, last = set(topics), 0.0
        deadline = time.monotonic() + 3600
        while left and time.monotonic() < deadline:
            for topic in sorted(left):
                done = finished(clients[0], topic)
                if done is None:
                    break  # polled again after a pause
                last = max(last, done)
                left.discard(topic)
            if left:
                time.sleep(0.2)
        if left:
            raise SystemExit(f"{len(left)} compactions did not end within an hour")
        return last - first, len(topics), cpu_seconds(pid) - cpu
    finally:
        for c in clients:
            c.close()


@contextlib.contextmanager
def profiled(pid: int, out: Path | None, mode: str) -> Iterator[None]:
    """Sample the daemon ``pid`` with py-spy while the block runs (``--profile``: its raw output to ``out``;
    ``wall``: idle threads included, ``cpu``: only threads on a core, ``gil``: only the thread holding the GIL,
    whose Python work the process does one at a time); nothing when ``out`` is None."""
    if out is None:
        yield
        return
    idle = {"wall": ["--idle"], "gil": ["--gil"]}.get(mode, [])
    spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", *idle, "--threads", "--nonblocking",
                            "--format", "raw", "-r", "50", "-o", str(out), "-p", str(pid)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)  # attached
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(60)
        except subprocess.TimeoutExpired:
            spy.kill()


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topics", type=int, default=300)
    ap.add_argument("--records", type=int, default=300, help="records per topic (default 300)")
    ap.add_argument("--keys", type=int, default=100, help="keys per topic (default 100)")
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--more", type=int, default=50, help="records added before the incremental runs")
    ap.add_argument("--singles", type=int, default=15, help="compactions timed one at a time (of each kind)")
    ap.add_argument("--source", action="append", type=Path, default=[],
                    help="a checkout whose compactord the daemon runs (repeatable; default: this one)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a daemon config key")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, ledgers)")
    ap.add_argument("--profile", choices=("wall", "cpu", "gil"),
                    help="sample each daemon with py-spy during the incremental burst (the venv's py-spy; wall: "
                         "idle threads included; gil: the GIL's holder only; the raw profiles in the work "
                         "directory, which is then kept)")
    args = ap.parse_args(argv)
    if args.topics <= args.singles or min(args.records, args.keys, args.partitions, args.singles) < 1:
        ap.error("need --topics > --singles >= 1 and positive --records, --keys, --partitions")
    sources = args.source or [Path(__file__).resolve().parent.parent]
    conf = dict(kv.split("=", 1) for kv in args.conf)

    work = Path(tempfile.mkdtemp(prefix="compactord-small-runs-"))
    print(f"work directory: {work}", flush=True)
    broker = EmbeddedBroker(log_path=work / "tansu.log").start()
    rows: list[tuple[str, str, str]] = []
    try:
        names = [f"small-{i:05d}" for i in range(args.topics)]
        started = time.monotonic()
        create_topics(broker.bootstrap, names, args.partitions)
        produce(broker.bootstrap, names, args.records, args.keys, args.partitions, 0)
        print(f"{args.topics} topics of {args.records} records made in {time.monotonic() - started:.1f} s", flush=True)
        produced = args.records
        for round_ in range(args.rounds):
            order = sources if round_ % 2 == 0 else sources[::-1]
            for n, source in enumerate(order):
                label = f"{source.resolve().name or source}"
                with daemon(work / f"daemon-{round_}-{n}", broker.bootstrap, source, conf) as (base, pid), \
                        httpx.Client(base_url=base, timeout=120) as client:
                    singles, rest = names[:args.singles], names[args.singles:]
                    full = [single(client, t) for t in singles]
                    produce(broker.bootstrap, singles, args.more, args.keys, args.partitions, produced)
                    incremental = [single(client, t) for t in singles]
                    full_burst = burst(base, rest, pid)
                    produce(broker.bootstrap, rest, args.more, args.keys, args.partitions, produced)
                    out = work / f"profile-{round_}-{n}-{label}.txt" if args.profile else None
                    with profiled(pid, out, args.profile):
                        inc_burst = burst(base, rest, pid)
                produced += args.more  # every topic got as many
                for kind, values in (("single full", full), ("single incremental", incremental)):
                    rows.append((label, kind, (f"p50 {statistics.median(values) * 1000:.0f} ms, "
                                               f"p90 {pct(values, 90) * 1000:.0f} ms ({len(values)} runs)")))
                for kind, (s, c, cpu) in (("at once, full", full_burst), ("at once, incremental", inc_burst)):
                    rows.append((label, kind, (f"{c} in {s:.1f} s ({c / s:.1f} a second; daemon CPU "
                                              f"{cpu * 1000 / c:.0f} ms a run)")))
                print("\n".join(f"{a:<20} {b:<22} {c}" for a, b, c in rows[-4:]), flush=True)
        print()
        print(f"{'source':<20} {'runs':<22} figures")
        for a, b, c in rows:
            print(f"{a:<20} {b:<22} {c}")
        return 0
    finally:
        broker.stop()
        if not args.keep and not args.profile:
            import shutil

            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
