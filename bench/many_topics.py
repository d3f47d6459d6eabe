"""Benchmark: a daemon watching many small topics: the listing's latency, the monitor pass's cost, the RSS, and
the time a restarted daemon takes to serve reads with a ledger for every topic.

Usage (from the repository root, with the project's venv)::

    .venv/bin/python bench/many_topics.py                    # 1,000 topics of 300 records, a local root
    .venv/bin/python bench/many_topics.py --topics 300 --s3  # on the S3 test server's bucket instead

It starts the bundled broker, creates ``--topics`` topics of one partition with ``--records`` records each,
then starts ``compactord run`` (its monitor every ``--interval`` s over every topic, pattern ``many-.*``, with
``compactionThresholdInMessages=1``: the first pass compacts every topic once; the thresholds are not reached
again, nothing more is compacted), waits until every topic is compacted, no task runs or waits (at most 900 s) and two more
passes ended, and measures: ``GET /v1/topics`` (every topic, ``limit=1000`` pages followed to the last; ``--listings`` times) p50
and p99, and a page of 100; the last pass's wall and CPU seconds, broker requests and topics
(``compactord_monitor_pass_*``), and the store requests between two passes; the daemon's RSS; the full rebuilds
taken for a recreated topic (``compactord_recreated_rebuilds``) and the compactions the monitor started on a view
that took a topic as recreated (its log's lines), none expected: no topic is recreated. It then stops the
daemon and starts another on the same root: the seconds from its start to ``/readyz`` saying it serves reads,
and to its first pass's end, and once no task is left (at most 900 s), the same two counts. It prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
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
    """Each ``compactord_`` sample, summed over its labels (``compactord_monitor_runs_total``: every result)."""
    out: dict[str, float] = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("compactord_"):
            name, _, value = line.rpartition(" ")
            name = name.split("{", 1)[0]
            out[name] = out.get(name, 0.0) + float(value)
    return out


def wait_metric(client: httpx.Client, name: str, at_least: float, what: str, timeout: float = 1800) -> None:
    deadline = time.monotonic() + timeout
    while metrics(client).get(name, 0) < at_least:
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


def make_topics(bootstrap: str, count: int, records: int, prefix: str = "many", keys: int = 50) -> list[str]:
    """``count`` topics of one partition named ``prefix-NNNNN``, each with ``records`` records of ``keys`` keys."""
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    names = [f"{prefix}-{i:05d}" for i in range(count)]
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    for start in range(0, count, 100):
        admin.create_topics([NewTopic(n, 1, 1) for n in names[start:start + 100]])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    for name in names:
        for i in range(records):
            producer.send(name, key=f"k{i % keys}".encode(), value=b"v" * 100)
    producer.flush()
    producer.close()
    return names


def idle(client: httpx.Client, timeout: float = 900) -> bool:
    """Wait until no task runs or waits (False: some still did after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while (lambda m: m.get("compactord_running_tasks", 0) + m.get("compactord_pending_tasks", 0))(metrics(client)):
        if time.monotonic() > deadline:
            print(f"tasks still running or waiting after {timeout:.0f} s", flush=True)
            return False
        time.sleep(1)
    return True


def recreated(m: dict[str, float], daemon_log: Path) -> str:
    """The "recreated" full rebuilds, and the compactions the monitor started on a view that took the topic as
    recreated (whatever reason came first: a recreated topic's whole log is its backlog)."""
    started = sum("compacting topic" in line and "the topic was recreated" in line
                  for line in daemon_log.read_text(errors="replace").splitlines())
    return f"{m.get('compactord_recreated_rebuilds_total', 0):.0f} / {started}"


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
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped bench stops its daemon and broker too

    work = Path(tempfile.mkdtemp(prefix="compactord-many-topics-"))
    print(f"work directory (logs; kept): {work}", flush=True)
    broker = EmbeddedBroker(log_path=work / "tansu.log").start()
    with contextlib.ExitStack() as stack:
        stack.callback(broker.stop)
        conf = {"compactionTopicsPattern": "many-.*", "brokerServiceCompactionMonitorIntervalInSeconds":
                str(args.interval), "compactionThresholdInMessages": "1",
                "compactedLedgerRoot": str(work / "ledgers")}
        if args.s3:
            s3 = S3Server(work / "seaweedfs").start()
            stack.callback(s3.stop)
            conf.update({"compactedLedgerRoot": f"s3://{BUCKET}/many", "s3Region": REGION, "s3Endpoint": s3.endpoint,
                         "s3AccessKeyId": ACCESS_KEY, "s3SecretAccessKey": SECRET_KEY})
        started = time.monotonic()
        make_topics(broker.bootstrap, args.topics, args.records)
        print(f"{args.topics} topics of {args.records} records made in {time.monotonic() - started:.1f} s", flush=True)

        (work / "first").mkdir()
        with daemon_process(work / "first", broker.bootstrap, conf) as (daemon, base), \
                httpx.Client(base_url=base, timeout=300) as client:
            started = time.monotonic()
            wait_metric(client, "compactord_compactions_total", args.topics, "every topic compacted once")
            compacted_s = time.monotonic() - started
            print(f"every topic compacted once in {compacted_s:.1f} s", flush=True)
            idle(client)  # the figures are of a daemon with nothing to compact
            settled_s = time.monotonic() - started
            print(f"no task running or waiting {settled_s:.1f} s after the start", flush=True)
            passes = metrics(client).get("compactord_monitor_runs_total", 0)
            wait_metric(client, "compactord_monitor_runs_total", passes + 2, "two passes after the compactions")
            before = metrics(client)
            wait_metric(client, "compactord_monitor_runs_total", before["compactord_monitor_runs_total"] + 1,
                        "one more pass")
            after = metrics(client)
            whole, seen = [], 0
            for _ in range(args.listings):
                took, seen = listing(client, 1000, follow=True)
                whole.append(took)
            page = [listing(client, 100, follow=False)[0] for _ in range(args.listings)]
            m = metrics(client)
            rss = rss_mb(daemon.pid)

        (work / "second").mkdir()
        started = time.monotonic()
        with daemon_process(work / "second", broker.bootstrap, conf, ready_for="reads") as (daemon, base), \
                httpx.Client(base_url=base, timeout=300) as client:
            reads_s = time.monotonic() - started
            wait_metric(client, "compactord_monitor_runs_total", 1, "the restarted daemon's first pass")
            first_pass_s = time.monotonic() - started
            restarted = metrics(client)
            rss_restarted = rss_mb(daemon.pid)
            idle(client)
            restarted_idle = metrics(client)

        requests = {op: after.get(op, 0) - before.get(op, 0) for op in ("compactord_storage_requests_total",)}
        rows = [
            ("topics listed", f"{seen}"),
            ("every topic compacted once (due at once) / no task left", f"{compacted_s:.1f} s / {settled_s:.1f} s"),
            ("GET /v1/topics?limit=100 p50 / p99",
             f"{statistics.median(page) * 1000:.1f} / {pct(page, 0.99) * 1000:.1f} ms"),
            ("GET /v1/topics, every topic (pages of 1,000) p50 / p99",
             f"{statistics.median(whole) * 1000:.1f} / {pct(whole, 0.99) * 1000:.1f} ms"),
            ("monitor pass: wall / CPU", (f"{m.get('compactord_monitor_pass_seconds', 0):.2f} s / "
                                         f"{m.get('compactord_monitor_pass_cpu_seconds', 0):.2f} s")),
            ("monitor pass: broker requests / topics", (f"{m.get('compactord_monitor_pass_broker_requests', 0):.0f} / "
                                                        f"{m.get('compactord_monitor_pass_topics', 0):.0f}")),
            ("store requests in one pass (S3; a local root's are not counted)",
             f"{requests['compactord_storage_requests_total']:.0f}"),
            ("daemon RSS", f"{rss:.0f} MB"),
            ('"recreated" full rebuilds / compactions started on a view taking the topic as recreated',
             recreated(m, work / "first" / "daemon.log")),
            ("restart: start to serving reads / to its first pass's end", f"{reads_s:.1f} s / {first_pass_s:.1f} s"),
            ("restart: first pass wall / CPU / store requests",
             (f"{restarted.get('compactord_monitor_pass_seconds', 0):.2f} s / "
             f"{restarted.get('compactord_monitor_pass_cpu_seconds', 0):.2f} s / "
             f"{restarted.get('compactord_storage_requests_total', 0):.0f} (all since its start)")),
            ("restart: daemon RSS after its first pass", f"{rss_restarted:.0f} MB"),
            ('restart: "recreated" full rebuilds / compactions so started, once no task is left',
             recreated(restarted_idle, work / "second" / "daemon.log")),
        ]
        print(f"\n{args.topics} topics, {args.records} records each, {'S3' if args.s3 else 'local'} root")
        print("| figure | value |\n|---|---|")
        for name, value in rows:
            print(f"| {name} | {value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
