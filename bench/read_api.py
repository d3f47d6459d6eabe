"""Benchmark: the read API of a compacted topic, through the real daemon over HTTP (loopback only).

Usage (from the repository root, with the project's venv)::

    .venv/bin/python bench/read_api.py                    # 1,000,000 records: 10,000 keys, then distinct keys
    .venv/bin/python bench/read_api.py --records 100000   # a quicker run
    .venv/bin/python bench/read_api.py --only keys        # one variant (keys | distinct)

It starts the bundled broker and a daemon (``compactord run`` as a subprocess, its own ledger root), and
for each variant builds a topic (``--records`` records, 4 partitions, 100-byte values, 2% tombstones;
over ``--keys`` keys, or every key distinct), compacts it through the API, then asks, one request at a
time from one client, ``--requests`` pages ``GET .../compacted?limit=1000`` at random partitions and
starts, and as many ``GET .../compacted/last``, after a few untimed warm-up requests. It prints p50/p99
of each and, last, ``read_p99_ms=<value>``: the worst page p99 of the variants. Targets (see #13): page
p99 < 50 ms, ``/last`` p99 < 15 ms. Figures, not assertions: timings here depend on the machine.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compaction import Workload, produce
from load import daemon_process, rss_mb, wait_compacted

from compactord.embedded import EmbeddedBroker

PARTITIONS = 4
PAGE = 1000


def percentiles(ms: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(ms, n=100) if len(ms) >= 2 else [ms[0]] * 99
    return statistics.median(ms), q[98]


def timed(client: httpx.Client, path: str, params: dict[str, object]) -> tuple[float, httpx.Response]:
    started = time.perf_counter()
    response = client.get(path, params=params)
    return (time.perf_counter() - started) * 1000, response


def measure(client: httpx.Client, topic: str, requests: int, rng: random.Random) -> dict[str, tuple[float, float]]:
    horizon = {p["partition"]: p["offset"] for p in client.get(f"/v1/topics/{topic}/horizon").json()["partitions"]}
    pages: list[float] = []
    lasts: list[float] = []
    entries = 0
    for i in range(requests + 10):
        p = rng.randrange(PARTITIONS)
        start = rng.randrange(max(1, horizon.get(p, 0)))
        ms, response = timed(client, f"/v1/topics/{topic}/compacted", {"partition": p, "start": start, "limit": PAGE})
        if response.status_code != 200:
            raise SystemExit(f"page read answered {response.status_code}: {response.text[:300]}")
        if i >= 10:  # the first ten warm up
            pages.append(ms)
            entries += len(response.json()["entries"])
    for i in range(requests + 10):
        ms, response = timed(client, f"/v1/topics/{topic}/compacted/last", {"partition": rng.randrange(PARTITIONS)})
        if response.status_code != 200:
            raise SystemExit(f"last read answered {response.status_code}: {response.text[:300]}")
        if i >= 10:
            lasts.append(ms)
    print(f"  {topic}: {requests} pages, {entries / max(1, requests):.0f} entries per page on average")
    return {"page": percentiles(pages), "last": percentiles(lasts)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--only", choices=["keys", "distinct"])
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    variants = [("keys", args.keys), ("distinct", 0)]
    variants = [v for v in variants if args.only in (None, v[0])]

    work = Path(tempfile.mkdtemp(prefix="compactord-read-api-"))
    broker = EmbeddedBroker(log_path=work / "tansu.log").start()
    results: dict[str, dict[str, tuple[float, float]]] = {}
    print(f"work directory (ledgers, logs; kept): {work}", flush=True)
    try:
        with daemon_process(work, broker.bootstrap) as (daemon, base), \
                httpx.Client(base_url=base, timeout=120) as client, mp.get_context("spawn").Pool(args.producers) as pool:
            from kafka.admin import KafkaAdminClient, NewTopic

            for name, keys in variants:
                topic = f"read-{name}"
                admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
                admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
                admin.close()
                workload = Workload(keys=keys, partitions=PARTITIONS, value_bytes=100, tombstone_ratio=0.02)
                sent, seconds = produce(pool, args.producers, workload, broker.bootstrap, 0, args.records, topic)
                print(f"{topic}: produced {sent} records in {seconds:.1f} s", flush=True)
                started = time.monotonic()
                client.put(f"/v1/topics/{topic}/compaction", headers={"Content-Type": "application/json"})
                wait_compacted(client, topic)
                print(f"{topic}: compacted in {time.monotonic() - started:.1f} s", flush=True)
                results[name] = measure(client, topic, args.requests, random.Random(args.seed))
            print(f"daemon_rss_mb={rss_mb(daemon.pid):.0f}")
        for name, figures in results.items():
            (p50, p99), (l50, l99) = figures["page"], figures["last"]
            print(f"{name}: page{PAGE}_ms p50={p50:.1f} p99={p99:.1f}  last_ms p50={l50:.1f} p99={l99:.1f}")
        print(f"last_p99_ms={max(f['last'][1] for f in results.values()):.1f}")
        print(f"read_p99_ms={max(f['page'][1] for f in results.values()):.1f}")
        return 0
    finally:
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
