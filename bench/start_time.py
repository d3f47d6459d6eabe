"""Benchmark: how long a daemon on an S3 root of many topics takes from its start to its first served read.

Usage (from the repository root, with the project's venv)::

    .venv/bin/python bench/start_time.py                          # 300 and 1,000 topics, 3 starts each
    .venv/bin/python bench/start_time.py --topics 1000 --runs 1
    .venv/bin/python bench/start_time.py --compare /tmp/base      # also the daemon of another checkout

It starts the bundled broker and a SeaweedFS (``weed mini``, as the tests' ``S3Server`` starts it), and builds
one root per topic count under ``s3://<bucket>/start-<N>``: N topics with a finalized (empty) ledger each,
written through the ledger store directly (``allocate_ledger``, ``finalize_ledger``, ``switch``), not compacted.
Then, ``--runs`` times for each root and each daemon (this checkout's, and ``--compare``'s: another checkout, a
``git archive`` of a base commit, run with its own code on the same roots), alternating, it starts
``compactord run`` as a subprocess (Spark ``local[1]``, no topic monitored) and polls, from the moment it
started the process: ``/healthz`` until 200, then ``GET /v1/topics/<t>/compaction`` of the last topic until it
answers 200 with its ledger (status SUCCESS). It stops the daemon (SIGTERM) before the next start.

It prints a table: per daemon and topic count, the median seconds to ``/healthz`` and to the first read, and the
store's requests the daemon made by then (``compactord_storage_requests_total``, read right after the first
read). Figures, not assertions; the target of #40 is a first read within 10 s with 1,000 topics.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from load import stop_daemon

from compactord.embedded import EmbeddedBroker, free_port
from compactord.ledger.store import LedgerStore
from compactord.model import LedgerManifest, StrategySettings
from tests.support.s3_server import ACCESS_KEY, BUCKET, REGION, SECRET_KEY, S3Server

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 600.0


def topic_name(n: int) -> str:
    return f"start-topic-{n:05d}"


def build_root(s3: S3Server, prefix: str, topics: int) -> float:
    """``topics`` topics under ``s3://BUCKET/prefix``, a finalized ledger each; the seconds it took."""
    started = time.monotonic()
    store = LedgerStore(f"s3://{BUCKET}/{prefix}", s3.store(prefix), recovery_per_second=0).open()

    def write(n: int) -> None:
        topic = topic_name(n)
        ledger_id, _ = store.allocate_ledger(topic)
        store.finalize_ledger(topic, ledger_id, LedgerManifest(ledger_id, topic, horizon={},
                                                               strategy=StrategySettings(), files=[]))
        store.switch(topic, ledger_id)

    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(write, range(topics)))
    finally:
        store.close()
    return time.monotonic() - started


def storage_requests(client: httpx.Client) -> int:
    """The daemon's requests to its store so far, every operation."""
    total = 0.0
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("compactord_storage_requests_total{"):
            total += float(line.split()[-1])
    return int(total)


def one_start(source: Path, work: Path, conf: dict[str, str], topic: str) -> tuple[float, float, int]:
    """Start the daemon of checkout ``source``: (seconds to /healthz, seconds to the first read, requests by then)."""
    port = free_port()
    conf_file = work / "broker.conf"
    conf_file.write_text("".join(f"{k}={v}\n" for k, v in {**conf, "httpPort": str(port)}.items()))
    env = {**os.environ, "PYTHONPATH": str(source)}
    base = f"http://127.0.0.1:{port}"
    with open(work / "daemon.log", "ab") as log:
        started = time.monotonic()
        daemon = subprocess.Popen([sys.executable, "-m", "compactord", "run", "--config", str(conf_file)],
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=source, env=env)
        try:
            healthy = read = None
            with httpx.Client(base_url=base, timeout=60) as client:
                while read is None:
                    if time.monotonic() - started > START_TIMEOUT_S or daemon.poll() is not None:
                        raise SystemExit(f"the daemon did not serve a read; see {work / 'daemon.log'}")
                    try:
                        if healthy is None:
                            if client.get("/healthz").status_code == 200:
                                healthy = time.monotonic() - started
                        else:
                            answer = client.get(f"/v1/topics/{topic}/compaction")
                            if answer.status_code == 200 and answer.json().get("status") == "SUCCESS":
                                read = time.monotonic() - started
                    except httpx.HTTPError:
                        pass
                    if read is None:
                        time.sleep(0.05)
                requests = storage_requests(client)
            assert healthy is not None
            return healthy, read, requests
        finally:
            stop_daemon(daemon)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", default="300,1000", help="topic counts, comma-separated (default 300,1000)")
    parser.add_argument("--runs", type=int, default=3, help="starts per daemon and topic count")
    parser.add_argument("--compare", type=Path, action="append", default=[],
                        help="another checkout whose daemon starts on the same roots (repeatable)")
    args = parser.parse_args()
    counts = [int(n) for n in args.topics.split(",")]
    sources = [REPO, *(p.resolve() for p in args.compare)]

    work = Path(tempfile.mkdtemp(prefix="compactord-start-bench-"))
    print(f"work directory (logs; kept): {work}", flush=True)
    broker = EmbeddedBroker(log_path=work / "tansu.log").start()
    s3 = S3Server(work / "seaweedfs").start()
    results: dict[tuple[str, int], list[tuple[float, float, int]]] = {}
    try:
        for n in counts:
            took = build_root(s3, f"start-{n}", n)
            print(f"{n} topics: root built in {took:.1f} s", flush=True)
        for n in counts:
            conf = {"kafkaBootstrapServers": broker.bootstrap, "compactedLedgerRoot": f"s3://{BUCKET}/start-{n}",
                    "sparkMaster": "local[1]", "compactionTopicsPattern": "(?!)", "s3Region": REGION,
                    "s3Endpoint": s3.endpoint, "s3AccessKeyId": ACCESS_KEY, "s3SecretAccessKey": SECRET_KEY}
            for run in range(args.runs):
                for source in sources:  # alternating: the machine's load falls on each alike
                    folder = work / f"{source.name}-{n}"
                    folder.mkdir(exist_ok=True)
                    measured = one_start(source, folder, conf, topic_name(n - 1))
                    results.setdefault((str(source), n), []).append(measured)
                    print(f"{source} {n} topics, start {run + 1}: /healthz {measured[0]:.1f} s, first read "
                          f"{measured[1]:.1f} s, {measured[2]} store requests by then", flush=True)
    finally:
        with contextlib.suppress(Exception):
            s3.stop()
        broker.stop()

    print()
    print("| daemon | topics | /healthz s | first read s | store requests by the first read |")
    print("|---|---:|---:|---:|---:|")
    for (source, n), measured in results.items():
        healthz, read, requests = (statistics.median(m[i] for m in measured) for i in range(3))
        print(f"| {source} | {n:,} | {healthz:.1f} | {read:.1f} | {requests:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
