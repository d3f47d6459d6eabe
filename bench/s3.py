"""Benchmark: the same workload compacted to a local ledger root and to an S3 root, side by side in one run.

Usage (from the repository root, with the project's venv)::

    .venv/bin/python bench/s3.py                      # 1,000,000 records, 10,000 keys, 3 runs each
    .venv/bin/python bench/s3.py --quick              # smoke run: 200,000 records, 1 run each
    .venv/bin/python bench/s3.py --records 500000 --runs 5

It starts the bundled broker, a SeaweedFS (``weed mini``, as the tests' ``S3Server`` starts it) and two daemons
(``compactord run`` as subprocesses, as ``read_api.py`` starts one): one on a local root, one on
``s3://<bucket>/bench``. It builds one topic (``--records`` records over ``--keys`` keys, 4 partitions,
100-byte values, 2% tombstones), then ``--runs`` times, alternating, a full compaction (``rebuild=true``) by
each daemon; then ``--runs`` times 10% more records and an incremental compaction by the S3 daemon; then the
read API of the S3 daemon (``read_api.measure``: pages of 1,000 and ``/last``). A run's time is its task's
``finished_at - started_at``; its requests are its history record's ``storage_requests`` (the driver's and its reading tasks').

It prints, side by side: each run's seconds and requests by operation, the S3 server's CPU seconds (its
``/proc/<pid>/stat``) during the full runs, the incremental runs and the reads, the daemon's GETs per read,
and last ``s3/local_full=<ratio>`` (target <= 1.3), ``s3_incremental/full=<ratio>`` (target <= 0.3),
``s3_page_p99_ms=`` (target < 50) and ``s3_last_p99_ms=`` (target < 15). Figures, not assertions.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import daemon_process, wait_compacted
from read_api import PAGE, PARTITIONS, measure
from workload import Workload, produce

from compactord.embedded import EmbeddedBroker
from tests.support.s3_server import ACCESS_KEY, BUCKET, REGION, SECRET_KEY, S3Server

TOPIC = "bench-s3"


def cpu_seconds(pid: int) -> float:
    """The user and system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def compaction(client: httpx.Client, rebuild: bool) -> tuple[float, dict[str, int]]:
    """Run one compaction of ``TOPIC`` through the API: (its seconds, its requests to the store by operation)."""
    response = client.put(f"/v1/topics/{TOPIC}/compaction", params={"rebuild": "true"} if rebuild else {})
    if response.status_code != 202:
        raise SystemExit(f"the compaction was refused: {response.status_code} {response.text[:300]}")
    task_id = response.json()["task_id"]
    wait_compacted(client, TOPIC)
    run = client.get(f"/v1/topics/{TOPIC}/history", params={"limit": 1}).json()["runs"][0]
    if run["task_id"] != task_id:
        raise SystemExit(f"the history's last run is {run['task_id']}, not {task_id}")
    took = datetime.fromisoformat(run["finished_at"]) - datetime.fromisoformat(run["started_at"])
    return took.total_seconds(), run["storage_requests"]


def store_gets(client: httpx.Client) -> float:
    """The daemon's GETs to its store so far (``compactord_storage_requests_total{op="get"}``)."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith('compactord_storage_requests_total{op="get"}'):
            return float(line.split()[-1])
    return 0.0


def requests_line(counts: list[dict[str, int]]) -> str:
    ops = sorted({op for c in counts for op in c})
    return " ".join(f"{op}={statistics.median(c.get(op, 0) for c in counts):.0f}" for op in ops) or "none"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=300, help="page and /last reads timed on the S3 root")
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="200,000 records, 1 run each, 100 reads")
    args = parser.parse_args()
    if args.quick:
        args.records, args.runs, args.requests = 200_000, 1, 100

    work = Path(tempfile.mkdtemp(prefix="compactord-s3-bench-"))
    print(f"work directory (ledgers, logs; kept): {work}", flush=True)
    broker = EmbeddedBroker(log_path=work / "tansu.log").start()
    s3 = S3Server(work / "seaweedfs").start()
    assert s3.process is not None
    s3_conf = {"compactedLedgerRoot": f"s3://{BUCKET}/bench", "s3Region": REGION, "s3Endpoint": s3.endpoint,
               "s3AccessKeyId": ACCESS_KEY, "s3SecretAccessKey": SECRET_KEY}
    (work / "local").mkdir()
    (work / "s3").mkdir()
    try:
        with contextlib.ExitStack() as stack:
            pool = stack.enter_context(mp.get_context("spawn").Pool(args.producers))
            _, local_base = stack.enter_context(daemon_process(work / "local", broker.bootstrap))
            _, s3_base = stack.enter_context(daemon_process(work / "s3", broker.bootstrap, s3_conf))
            local = stack.enter_context(httpx.Client(base_url=local_base, timeout=120))
            remote = stack.enter_context(httpx.Client(base_url=s3_base, timeout=120))
            from kafka.admin import KafkaAdminClient, NewTopic

            admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
            admin.close()
            workload = Workload(keys=args.keys, partitions=PARTITIONS, value_bytes=100, tombstone_ratio=0.02)
            sent, seconds = produce(pool, args.producers, workload, broker.bootstrap, 0, args.records, TOPIC)
            print(f"{TOPIC}: produced {sent} records in {seconds:.1f} s", flush=True)
            for client in (local, remote):  # untimed: warms each daemon's Spark and reader paths
                compaction(client, rebuild=True)

            full: dict[str, list[float]] = {"local": [], "s3": []}
            full_requests: list[dict[str, int]] = []
            s3_cpu = {"full": 0.0, "incremental": 0.0, "reads": 0.0}
            for run in range(args.runs):
                took, _ = compaction(local, rebuild=True)
                full["local"].append(took)
                cpu = cpu_seconds(s3.process.pid)
                took, requests = compaction(remote, rebuild=True)
                s3_cpu["full"] += cpu_seconds(s3.process.pid) - cpu
                full["s3"].append(took)
                full_requests.append(requests)
                print(f"run {run + 1}: full local {full['local'][-1]:.2f} s, S3 {took:.2f} s; S3 requests {requests}",
                      flush=True)

            incremental: list[float] = []
            incremental_requests: list[dict[str, int]] = []
            step = max(1, args.records // 10)
            for run in range(args.runs):
                lo = args.records + run * step
                produce(pool, args.producers, workload, broker.bootstrap, lo, lo + step, TOPIC)
                cpu = cpu_seconds(s3.process.pid)
                took, requests = compaction(remote, rebuild=False)
                s3_cpu["incremental"] += cpu_seconds(s3.process.pid) - cpu
                incremental.append(took)
                incremental_requests.append(requests)
                print(f"run {run + 1}: incremental S3 {took:.2f} s; requests {requests}", flush=True)

            cpu, gets = cpu_seconds(s3.process.pid), store_gets(remote)
            reads = measure(remote, TOPIC, args.requests, random.Random(7))
            s3_cpu["reads"] = cpu_seconds(s3.process.pid) - cpu
            reads_made = 2 * (args.requests + 10)  # ``measure``: pages, then as many /last, ten of each untimed
            gets_per_read = (store_gets(remote) - gets) / reads_made

        local_full, s3_full, s3_incremental = (statistics.median(xs) for xs in (full["local"], full["s3"], incremental))
        (page50, page99), (last50, last99) = reads["page"], reads["last"]
        print(f"full compaction s: local {local_full:.2f}, S3 {s3_full:.2f} (medians of {args.runs})")
        print(f"incremental compaction s on S3: {s3_incremental:.2f}")
        print(f"S3 requests per full compaction: {requests_line(full_requests)}")
        print(f"S3 requests per incremental compaction: {requests_line(incremental_requests)}")
        print(f"S3 reads: page{PAGE}_ms p50={page50:.1f} p99={page99:.1f}  last_ms p50={last50:.1f} p99={last99:.1f}"
              f"  store GETs per read {gets_per_read:.2f}")
        print(f"S3 server CPU s: full runs {s3_cpu['full']:.1f}, incremental runs {s3_cpu['incremental']:.1f}, "
              f"reads {s3_cpu['reads']:.1f}")
        print(f"s3/local_full={s3_full / local_full:.2f}")
        print(f"s3_incremental/full={s3_incremental / s3_full:.2f}")
        print(f"s3_page_p99_ms={page99:.1f}")
        print(f"s3_last_p99_ms={last99:.1f}")
        return 0
    finally:
        s3.stop()
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
