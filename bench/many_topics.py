"""Benchmark: a daemon watching many small topics: the listing's latency, the monitor pass's cost, the RSS.

Usage (from the repository root, with the project's venv)::

    .venv/bin/python bench/many_topics.py                    # 1,000 topics of 300 records, a local root
    .venv/bin/python bench/many_topics.py --topics 300 --s3  # on the S3 test server's bucket instead

It starts the bundled broker, creates ``--topics`` topics of one partition with ``--records`` records each,
then starts ``compactord run`` (its monitor every ``--interval`` s over every topic: pattern ``.*``, thresholds
off, so nothing is compacted), waits for two monitor passes, and measures: ``GET /v1/topics`` (every topic,
``limit=1000`` pages followed to the last; ``--listings`` times) p50 and p99, and a page of 100; the last
pass's wall and CPU seconds, broker requests and topics (``compactord_monitor_pass_*``); the daemon's RSS. It
prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import daemon_process, rss_mb  # noqa: E402

from compactord.embedded import EmbeddedBroker  # noqa: E402
from tests.support.s3_server import ACCESS_KEY, BUCKET, REGION, SECRET_KEY, S3Server  # noqa: E402


def metrics(client: httpx.Client) -> dict[str, float]:
    out = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("compactord_") and "{" not in line:
            name, _, value = line.partition(" ")
            out[name] = float(value)
    return out


def make_topics(bootstrap: str, count: int, records: int) -> list[str]:
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    names = [f"many-{i:05d}" for i in range(count)]
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    for start in range(0, count, 100):
        admin.create_topics([NewTopic(n, 1, 1) for n in names[start:start + 100]])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    for name in names:
        for i in range(records):
            producer.send(name, key=f"k{i % 50}".encode(), value=b"v" * 100)
    producer.flush()
    producer.close()
    return names


def listing(client: httpx.Client, limit: int, follow: bool) -> tuple[float, int]:
    started = time.perf_counter()
    body = client.get("/v1/topics", params={"limit": limit}).json()
    seen = len(body["topics"])
    while follow and body.get("next_after"):
        body = client.get("/v1/topics", params={"limit": limit, "after": body["next_after"]}).json()
        seen += len(body["topics"])
    return time.perf_counter() - started, seen


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--records", type=int, default=300, help="records per topic")
    parser.add_argument("--listings", type=int, default=50)
    parser.add_argument("--interval", type=int, default=10, help="the monitor's interval, seconds")
    parser.add_argument("--s3", action="store_true", help="the ledger root on the S3 test server")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="compactord-many-topics-"))
    print(f"work directory (logs; kept): {work}", flush=True)
    broker = EmbeddedBroker(log_path=work / "tansu.log").start()
    with contextlib.ExitStack() as stack:
        stack.callback(broker.stop)
        conf = {"compactionTopicsPattern": "many-.*", "brokerServiceCompactionMonitorIntervalInSeconds":
                str(args.interval), "compactionThresholdInMessages": "0"}
        if args.s3:
            s3 = S3Server(work / "seaweedfs").start()
            stack.callback(s3.stop)
            conf.update({"compactedLedgerRoot": f"s3://{BUCKET}/many", "s3Region": REGION, "s3Endpoint": s3.endpoint,
                         "s3AccessKeyId": ACCESS_KEY, "s3SecretAccessKey": SECRET_KEY})
        started = time.monotonic()
        make_topics(broker.bootstrap, args.topics, args.records)
        print(f"{args.topics} topics of {args.records} records made in {time.monotonic() - started:.1f} s", flush=True)
        (work / "daemon").mkdir()
        daemon, base = stack.enter_context(daemon_process(work / "daemon", broker.bootstrap, conf))
        client = stack.enter_context(httpx.Client(base_url=base, timeout=300))
        deadline = time.monotonic() + 600
        while metrics(client).get("compactord_monitor_runs_total", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        whole, seen = [], 0
        for _ in range(args.listings):
            took, seen = listing(client, 1000, follow=True)
            whole.append(took)
        page = [listing(client, 100, follow=False)[0] for _ in range(args.listings)]
        m = metrics(client)
        rows = [
            ("topics listed", f"{seen}"),
            ("GET /v1/topics, every topic (pages of 1,000) p50 / p99",
             f"{statistics.median(whole) * 1000:.1f} / {pct(whole, 0.99) * 1000:.1f} ms"),
            ("GET /v1/topics?limit=100 p50 / p99",
             f"{statistics.median(page) * 1000:.1f} / {pct(page, 0.99) * 1000:.1f} ms"),
            ("monitor pass: wall / CPU", (f"{m.get('compactord_monitor_pass_seconds', 0):.2f} s / "
                                          f"{m.get('compactord_monitor_pass_cpu_seconds', 0):.2f} s")),
            ("monitor pass: broker requests / topics", (f"{m.get('compactord_monitor_pass_broker_requests', 0):.0f} / "
                                                        f"{m.get('compactord_monitor_pass_topics', 0):.0f}")),
            ("daemon RSS", f"{rss_mb(daemon.pid):.0f} MB"),
        ]
        print(f"\n{args.topics} topics, {args.records} records each, {'S3' if args.s3 else 'local'} root")
        print("| figure | value |\n|---|---|")
        for name, value in rows:
            print(f"| {name} | {value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
