"""Load check: many concurrent readers of a compacted topic while a compaction runs (loopback only).

Usage (from the repository root, with the project's venv)::

    .venv/bin/python bench/load.py                 # 200 readers for 30 s
    .venv/bin/python bench/load.py --readers 50 --seconds 10

It starts the bundled broker and a daemon (``compactord run`` as a subprocess, its own ledger root),
builds a topic (``--records`` records over ``--keys`` keys, 4 partitions), compacts it, then for
``--seconds`` runs ``--readers`` threads that read ``GET .../compacted`` pages at random starts, while
a separate process asks ``/healthz`` every 50 ms (out of this process, whose 200 threads would hold its
GIL and inflate the figure) and the main thread produces more records and triggers a compaction. It
reports the requests, the answers by status (no 5xx is expected), the readers' and ``/healthz``
latency percentiles, and the daemon process's RSS before, at its peak and after (its own Python
process; the Spark JVM is a child). Figures, not assertions: timings here depend on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compactord.embedded import EmbeddedBroker, free_port

PARTITIONS = 4


@contextlib.contextmanager
def daemon_process(work: Path, bootstrap: str, conf: dict[str, str] | None = None, *, ready_for: str = "compactions",
                   ) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A daemon (``compactord run`` as a subprocess, its own ledger root and log under ``work``) on a free
    loopback port, ready for compactions (``ready_for="reads"``: as soon as ``/readyz`` says it serves reads):
    (its process, its base URL). ``conf``: broker.conf keys that replace or add to the bench's. Stopped on
    exit, with its Spark JVM (its own process group) if it does not end within a minute."""
    port = free_port()
    keys = {"kafkaBootstrapServers": bootstrap, "compactedLedgerRoot": str(work / "ledgers"), "httpPort": str(port),
            "sparkMaster": "local[2]", "compactionTopicsPattern": "(?!)", "brokerServiceCompactionThresholdInBytes": "0",
            **(conf or {})}
    conf_file = work / "broker.conf"
    conf_file.write_text("".join(f"{k}={v}\n" for k, v in keys.items()))
    base = f"http://127.0.0.1:{port}"
    with open(work / "daemon.log", "wb") as log:
        daemon = subprocess.Popen([sys.executable, "-m", "compactord", "run", "--config", str(conf_file)],
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            with httpx.Client(base_url=base, timeout=60) as client:
                deadline = time.monotonic() + 300
                while True:
                    try:
                        if client.get("/readyz").json().get(ready_for):
                            break
                    except (httpx.HTTPError, ValueError):
                        pass
                    if time.monotonic() > deadline or daemon.poll() is not None:
                        raise SystemExit(f"the daemon did not become ready; see {work / 'daemon.log'}")
                    time.sleep(0.5 if ready_for == "compactions" else 0.05)
            yield daemon, base
        finally:
            stop_daemon(daemon)


def stop_daemon(daemon: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and SIGKILL to its process group (the daemon and its Spark JVM) if it does not end in a minute."""
    daemon.terminate()
    try:
        daemon.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def produce(bootstrap: str, topic: str, records: int, keys: int, start: int = 0) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=256 * 1024)
    try:
        for i in range(start, start + records):
            producer.send(topic, key=b"k%d" % (i % keys), value=b"v" * 100, partition=i % PARTITIONS)
        producer.flush()
    finally:
        producer.close()


def probe_health(base: str, stop: mp.synchronize.Event, out: mp.Queue) -> None:  # type: ignore[type-arg]
    """``/healthz`` every 50 ms until ``stop``; puts the latencies (ms) on ``out``."""
    times: list[float] = []
    with httpx.Client(base_url=base, timeout=60) as c:
        while not stop.is_set():
            started = time.perf_counter()
            c.get("/healthz")
            times.append((time.perf_counter() - started) * 1000)
            time.sleep(0.05)
    out.put(times)


def pct(xs: list[float]) -> str:
    if not xs:
        return "n=0"
    q = statistics.quantiles(xs, n=100) if len(xs) >= 2 else [xs[0]] * 99
    return f"p50={statistics.median(xs):.1f} p99={q[98]:.1f} max={max(xs):.1f} n={len(xs)}"


def wait_compacted(client: httpx.Client, topic: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = client.get(f"/v1/topics/{topic}/compaction").json().get("state")
        if state in ("Succeed", "Failed", "Cancelled"):
            if state != "Succeed":
                raise SystemExit(f"the compaction ended {state}")
            return
        time.sleep(0.5)
    raise SystemExit("the compaction did not end in time")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readers", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=20_000)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="compactord-load-"))
    broker = EmbeddedBroker(log_path=work / "tansu.log").start()
    json_headers = {"Content-Type": "application/json"}
    try:
        with daemon_process(work, broker.bootstrap) as (daemon, base), httpx.Client(base_url=base, timeout=60) as client:
            from kafka.admin import KafkaAdminClient, NewTopic

            admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
            topic = "load"
            admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
            admin.close()
            produce(broker.bootstrap, topic, args.records, args.keys)
            client.put(f"/v1/topics/{topic}/compaction", headers=json_headers)
            wait_compacted(client, topic)
            horizon = {p["partition"]: p["offset"] for p in client.get(f"/v1/topics/{topic}/horizon").json()["partitions"]}

            rss_before = rss_mb(daemon.pid)
            stop = threading.Event()
            statuses: Counter[int] = Counter()
            read_ms: list[float] = []
            rss_peak = [rss_before]
            lock = threading.Lock()

            def reader() -> None:
                with httpx.Client(base_url=base, timeout=60) as c:
                    while not stop.is_set():
                        p = random.randrange(PARTITIONS)
                        start = random.randrange(max(1, horizon.get(p, 0)))
                        began = time.perf_counter()
                        try:
                            code = c.get(f"/v1/topics/{topic}/compacted",
                                         params={"partition": p, "start": start, "limit": 100}).status_code
                        except httpx.HTTPError:
                            code = 0  # no answer
                        with lock:
                            statuses[code] += 1
                            read_ms.append((time.perf_counter() - began) * 1000)

            threads = [threading.Thread(target=reader, daemon=True) for _ in range(args.readers)]
            ctx = mp.get_context("spawn")
            health_stop, health_out = ctx.Event(), ctx.Queue()
            prober = ctx.Process(target=probe_health, args=(base, health_stop, health_out), daemon=True)
            prober.start()
            for t in threads:
                t.start()
            began = time.monotonic()
            produce(broker.bootstrap, topic, args.records // 10, args.keys, start=args.records)
            client.put(f"/v1/topics/{topic}/compaction", headers=json_headers)
            while time.monotonic() - began < args.seconds:
                rss_peak[0] = max(rss_peak[0], rss_mb(daemon.pid))
                time.sleep(0.2)
            stop.set()
            health_stop.set()
            health_ms: list[float] = health_out.get(timeout=120)
            prober.join(60)
            for t in threads:
                t.join(60)
            wait_compacted(client, topic)
            time.sleep(2)
            rss_after = rss_mb(daemon.pid)

        total = sum(statuses.values())
        print(f"readers={args.readers} seconds={args.seconds:g} requests={total} "
              f"per_second={total / args.seconds:.0f}")
        print("answers=" + " ".join(f"{code}:{n}" for code, n in sorted(statuses.items())))
        print(f"server_errors={sum(n for code, n in statuses.items() if code >= 500)} "
              f"no_answer={statuses.get(0, 0)}")
        print(f"read_ms {pct(read_ms)}")
        print(f"healthz_ms {pct(health_ms)}")
        print(f"daemon_rss_mb before={rss_before:.0f} peak={rss_peak[0]:.0f} after={rss_after:.0f}")
        return 0
    finally:
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
