"""Benchmark: the daemon's first compaction once it is ready, against warm ones, through its HTTP API.

Usage (from the repository root, with the project's venv)::

    .venv/bin/python bench/first_run.py                  # 1,000,000 records, 10,000 keys, 4 partitions
    .venv/bin/python bench/first_run.py --pause 70       # also a run after 70 s idle (Spark stops idle workers)

It starts the bundled broker, writes the workload (``workload.py``), starts ``compactord run`` on it and
times, from the first ``/readyz`` that says ``"compactions": true``: the first full compaction
(``PUT /v1/topics/bench/compaction?rebuild=true``, until its status is SUCCESS), then ``--runs`` more (warm),
then with ``--pause S`` one after S seconds of idleness. Each is timed from the request to the status poll
(every 10 ms) that saw it end. The last lines are ``ready_s=<seconds from start to ready>``,
``first/warm=<ratio>`` (the target: at most 1.5) and with ``--pause``, ``after_pause/warm=<ratio>``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from workload import TOPIC, Workload, produce, release_scratch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(http: httpx.Client, daemon: subprocess.Popen[bytes], limit_s: float = 300) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise SystemExit(f"the daemon exited with {daemon.returncode} before it was ready")
        try:
            body = http.get("/readyz").json()
            if body.get("compactions"):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.05)
    raise SystemExit(f"the daemon was not ready for compactions within {limit_s:.0f} s")


def timed_compaction(http: httpx.Client) -> float:
    t0 = time.monotonic()
    answer = http.put(f"/v1/topics/{TOPIC}/compaction", params={"rebuild": "true"}, json={})
    answer.raise_for_status()
    task_id = answer.json()["task_id"]
    while True:
        status = http.get(f"/v1/topics/{TOPIC}/compaction").json()
        if status.get("task_id") == task_id and status["status"] != "RUNNING":
            elapsed = time.monotonic() - t0
            if status["status"] != "SUCCESS":
                raise SystemExit(f"the compaction ended {status['state']}: {status.get('last_error')}")
            return elapsed
        time.sleep(0.01)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5, help="warm runs after the first (the median is reported)")
    ap.add_argument("--pause", type=float, default=0, metavar="S", help="then one run after S seconds idle")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a broker.conf line")
    ap.add_argument("--keep-logs", action="store_true", help="keep the daemon's log and the scratch folder (printed)")
    args = ap.parse_args(argv)
    if args.records < 1 or args.keys < 1 or args.partitions < 1 or args.runs < 1 or args.pause < 0:
        ap.error("--records, --keys, --partitions and --runs must be positive, --pause at least 0")

    from compactord.embedded import EmbeddedBroker

    tmp = Path(tempfile.mkdtemp(prefix="compactord-first-run-"))
    broker = EmbeddedBroker(log_path=tmp / "tansu.log")
    daemon: subprocess.Popen[bytes] | None = None
    try:
        broker.start()
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        admin.create_topics([NewTopic(TOPIC, args.partitions, 1)])
        admin.close()
        workload = Workload(keys=args.keys, partitions=args.partitions, value_bytes=100, tombstone_ratio=0.02)
        with mp.get_context("spawn").Pool(min(args.partitions, 8)) as pool:
            sent, seconds = produce(pool, min(args.partitions, 8), workload, broker.bootstrap, 0, args.records)
        print(f"workload: {sent:,} records in {seconds:.1f} s, {args.keys:,} keys, {args.partitions} partitions",
              flush=True)

        port = _free_port()
        conf = tmp / "broker.conf"
        conf.write_text("\n".join([f"kafkaBootstrapServers={broker.bootstrap}", f"httpPort={port}",
                                   f"compactedLedgerRoot={tmp / 'ledgers'}",
                                   "brokerServiceCompactionThresholdInBytes=0", *args.conf]) + "\n")
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
        log = (tmp / "daemon.log").open("wb")
        started = time.monotonic()
        daemon = subprocess.Popen([sys.executable, "-m", "compactord", "run", "--config", str(conf)],
                                  stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            wait_ready(http, daemon)
            ready_s = time.monotonic() - started
            print(f"ready for compactions {ready_s:.1f} s after start", flush=True)
            first = timed_compaction(http)
            print(f"first compaction: {first:.2f} s", flush=True)
            warm = [timed_compaction(http) for _ in range(args.runs)]
            print(f"warm compactions: {', '.join(f'{t:.2f}' for t in warm)} s", flush=True)
            after_pause = None
            if args.pause:
                time.sleep(args.pause)
                after_pause = timed_compaction(http)
                print(f"after {args.pause:.0f} s idle: {after_pause:.2f} s", flush=True)
        warm_m = statistics.median(warm)
        print()
        print(f"ready_s={ready_s:.1f}")
        print(f"first/warm={first / warm_m:.2f}")
        if after_pause is not None:
            print(f"after_pause/warm={after_pause / warm_m:.2f}")
        return 0
    finally:
        if daemon is not None and daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGTERM)
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
        broker.stop()
        release_scratch(tmp, args.keep_logs)


if __name__ == "__main__":
    sys.exit(main())
