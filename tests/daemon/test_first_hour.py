"""The first hour of a new user, on one daemon started as README's quick start starts it
(``compactord run --embedded-broker``): the broker's address from ``/v1/info``, ``demo --url`` against
it, the topic list (on the broker or not, a backlog that is never stale after a run), the same 404 for
unknown names everywhere, the lifecycle commands of the CLI, /docs without internet and an OpenAPI
schema of the real bodies, a quiet cancel, and fast, quiet answers without a broker: a second daemon
on a dead port (stopped while its Spark session starts), then this one once its embedded broker is
killed (the last test).

Every CLI call is a subprocess (``run_cli``); the daemon is a subprocess too, and its embedded broker
is stopped by PID at the end also when the daemon had to be killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from compactord import __version__
from tests.conftest import Kafka
from tests.support.daemon import DaemonProcess, wait_state
from tests.support.processes import alive
from tests.support.timeouts import READY_TIMEOUT_S, STOP_TIMEOUT_S
from tests.support.waiting import wait_for

from .conftest import Launcher, assert_error, run_cli
from .test_cli import failed, ok

pytestmark = pytest.mark.slow

DEMO = "stock-ticker"


@pytest.fixture(scope="module")
def daemon(launch: Launcher) -> Iterator[DaemonProcess]:
    # The listing shows what the monitor's last pass saw: it passes every 5 s here (60 s by default).
    quick = launch.prepare("first-hour", compactionMaxConcurrentTasks=2,
                           brokerServiceCompactionMonitorIntervalInSeconds=5)
    quick.args = ("--embedded-broker",)
    try:
        yield quick.start().wait_ready()
    finally:
        quick.stop()
        pid = broker_pid(quick)
        if pid is not None:  # the daemon stops it; this is for a daemon that had to be killed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def broker_pid(daemon: DaemonProcess) -> int | None:
    found = re.search(r"embedded broker \(pid (\d+)\)", daemon.log_text())
    return int(found.group(1)) if found else None


@pytest.fixture(scope="module")
def info(daemon: DaemonProcess) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(ok(run_cli("info", "--json", "--url", daemon.url)))
    return body


@pytest.fixture(scope="module")
def kafka(info: dict[str, Any]) -> Iterator[Kafka]:
    """Topics and records on the daemon's embedded broker (not the test session's)."""
    from kafka import KafkaAdminClient

    bootstrap = info["broker"]["bootstrap"]
    k = Kafka(bootstrap, admin=KafkaAdminClient(bootstrap_servers=bootstrap))
    try:
        yield k
    finally:
        k.close()


def cli(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    # The URL without its scheme, as a user types it: http:// is understood.
    return run_cli(*args, env={"COMPACTORD_URL": f"127.0.0.1:{daemon.port}"})


def listed(daemon: DaemonProcess, topic: str) -> dict[str, str] | None:
    """The topic's row of ``compactord topics`` (None: not listed)."""
    out = ok(cli(daemon, "topics"))
    header, *rows = out.splitlines()
    assert header.split()[:4] == ["TOPIC", "ON_BROKER", "BACKLOG", "LAST"], header
    assert "None" not in out, out
    row = next((r.split() for r in rows if r.split()[0] == topic), None)
    return None if row is None else {"on_broker": row[1], "backlog": row[2], "last": row[3]}


def topic_row(daemon: DaemonProcess, topic: str) -> dict[str, str]:
    row = listed(daemon, topic)
    assert row is not None, f"topic {topic} not listed"
    return row


def listed_as(daemon: DaemonProcess, topic: str, expected: dict[str, str]) -> None:
    """Wait until the listing shows ``expected`` for the topic: what the monitor's next pass measures."""
    wait_for(lambda: listed(daemon, topic) == expected, READY_TIMEOUT_S,
             f"a monitor pass that lists topic {topic} as {expected}", daemon)


# -- 1. the quick start -----------------------------------------------------------------------------


def test_info_names_the_embedded_broker_printed_at_start(daemon: DaemonProcess, info: dict[str, Any]) -> None:
    bootstrap = info["broker"]["bootstrap"]
    assert info["broker"]["embedded"] is True
    assert re.fullmatch(r"127\.0\.0\.1:\d+", bootstrap), bootstrap
    assert (info["version"], info["spark_master"]) == (__version__, "local[2]")
    assert info["ledger_root"] == str(daemon.root.resolve())
    assert f"embedded broker at {bootstrap}: produce there" in daemon.log_text()
    table = ok(cli(daemon, "info"))
    assert f"broker        {bootstrap} (embedded)" in table and __version__ in table
    # the trial's Kafka listener, on loopback: any Kafka client reads the compacted views there
    assert re.fullmatch(r"PLAINTEXT://127\.0\.0\.1:\d+", info["kafka_listeners"]), info
    assert f"kafka listener {info['kafka_listeners']}" in table


def test_quick_start_demo_then_topics_status_read(daemon: DaemonProcess, info: dict[str, Any]) -> None:
    demo = ok(run_cli("demo", "--url", daemon.url, "--ticks", "600"))
    assert f"its broker at {info['broker']['bootstrap']}" in demo
    assert re.search(r"compaction \S+: Succeed", demo), demo
    assert "latest price per symbol" in demo and "TSLA: (deleted: tombstone)" in demo

    # the demo left 3 ticks and a tombstone after the horizon: the listing shows them once the monitor's next
    # pass has measured them
    listed_as(daemon, DEMO, {"on_broker": "yes", "backlog": "4", "last": "SUCCESS"})
    status = ok(cli(daemon, "status", DEMO))
    assert "status    SUCCESS" in status and "None" not in status
    rows = [line.split() for line in ok(cli(daemon, "read", DEMO, "--partition", "0")).splitlines()[1:]]
    assert {row[2] for row in rows} == {"AAPL", "GOOG", "NVDA"}  # the demo's symbols of partition 0

    # a compaction takes the backlog to 0, and the listing says so right after it (not a monitor later)
    assert "status    SUCCESS" in ok(cli(daemon, "compact", DEMO, "--wait"))
    assert topic_row(daemon, DEMO)["backlog"] == "0"

    # the same view through the trial's Kafka listener, with a Kafka client
    listener = info["kafka_listeners"].removeprefix("PLAINTEXT://")
    consumer = Consumer({"bootstrap.servers": listener, "group.id": "unused", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(DEMO, 0, 0)])
        read: list[tuple[str, bool]] = []  # (key, live): a tombstone the ledger keeps comes too
        while True:
            message = consumer.poll(READY_TIMEOUT_S)
            assert message is not None, "no end of partition through the listener"
            if message.error() is not None:
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                break
            read.append((message.key().decode(), message.value() is not None))
    finally:
        consumer.close()
    view = [line.split() for line in ok(cli(daemon, "read", DEMO, "--partition", "0")).splitlines()[1:]]
    assert {key for key, live in read if live} == {row[2] for row in view}
    assert len(read) == len({key for key, _ in read})  # one record a symbol


# -- 3. an honest topic list, one answer for unknown names ------------------------------------------


def test_backlog_before_a_first_compaction_and_a_topic_the_broker_lost(daemon: DaemonProcess,
                                                                     kafka: Kafka) -> None:
    fresh = kafka.topic(prefix="fh")
    kafka.produce(fresh, [(f"k{i % 3}", f"v{i}") for i in range(7)])
    listed_as(daemon, fresh, {"on_broker": "yes", "backlog": "7", "last": "NOT_RUN"})

    lost = kafka.topic(prefix="fh")
    kafka.produce(lost, [("k", "v")])
    ok(cli(daemon, "compact", lost, "--wait"))
    kafka.admin.delete_topics([lost])
    wait_for(lambda: lost not in kafka.admin.list_topics(), 30, f"topic {lost} to be deleted", interval=0.2)
    listed_as(daemon, lost, {"on_broker": "no", "backlog": "0", "last": "SUCCESS"})
    assert {"topic": lost, "on_broker": False} == {
        k: v for t in json.loads(ok(cli(daemon, "topics", "--json")))["topics"] if t["topic"] == lost
        for k, v in t.items() if k in ("topic", "on_broker")}
    # its ledger is still read, whatever the broker says
    assert ok(cli(daemon, "read", lost)).splitlines()[1].split()[2:] == ["k", "v"]


def test_unknown_names_answer_404_topic_not_found_everywhere(daemon: DaemonProcess, kafka: Kafka) -> None:
    name = "fh-nowhere"
    http = daemon.http
    for method, path in [("GET", "compaction"), ("PUT", "compaction"), ("GET", "horizon"),
                         ("GET", "compacted?partition=0"), ("GET", "compacted/last?partition=0"),
                         ("GET", "policies"), ("DELETE", "policies"), ("POST", "unload"), ("POST", "load")]:
        body = assert_error(http.request(method, f"/v1/topics/{name}/{path}"), 404, "topic_not_found")
        assert name in body["message"], (method, path, body)
    response = http.put(f"/v1/topics/{name}/policies", json={"thresholdMessages": 1})
    assert_error(response, 404, "topic_not_found")
    # the DELETE hook too: there is nothing to delete
    assert_error(http.delete(f"/v1/topics/{name}"), 404, "topic_not_found")
    assert not (daemon.root / name).exists()
    # a topic the broker has but that was never compacted: not_compacted, as before
    never = kafka.topic(prefix="fh")
    assert_error(http.get(f"/v1/topics/{never}/horizon"), 404, "not_compacted")
    failed(cli(daemon, "status", name), "404", "topic_not_found", name)


# -- 6. the CLI covers the API ------------------------------------------------------------------------


def test_policies_unload_load_tasks_and_delete_through_the_cli(daemon: DaemonProcess, kafka: Kafka) -> None:
    topic = kafka.topic(prefix="fh")
    kafka.produce(topic, [("k", "v")])
    ok(cli(daemon, "compact", topic, "--wait"))

    out = ok(cli(daemon, "policies", topic, "--set", "thresholdMessages=5", "--set", "strategy=first-value"))
    assert re.search(r"thresholdMessages\s+5\s+5", out) and re.search(r"strategy\s+first-value\s+first-value", out)
    ok(cli(daemon, "policies", topic, "--set", "thresholdMessages=null"))  # drops one, keeps the other
    body = json.loads(ok(cli(daemon, "policies", topic, "--json")))
    assert (body["policies"]["thresholdMessages"], body["policies"]["strategy"]) == (None, "first-value")
    assert json.loads(ok(cli(daemon, "policies", topic, "--delete", "--json")))["policies"]["strategy"] is None
    failed(cli(daemon, "policies", topic, "--set", "thresholdMessages"), "KEY=VALUE")

    assert "unloaded  yes" in ok(cli(daemon, "unload", topic))
    assert json.loads(ok(cli(daemon, "load", topic, "--json"))) == {"topic": topic, "unloaded": False}
    rows = ok(cli(daemon, "tasks", "--topic", topic)).splitlines()[1:]
    assert rows and all(row.split()[0] == topic for row in rows)

    refused = cli(daemon, "delete-topic", topic)
    assert refused.returncode == 2 and "--yes" in refused.stderr, refused.stderr
    assert (daemon.root / topic).exists()
    assert "deleted   yes" in ok(cli(daemon, "delete-topic", topic, "--yes"))
    assert not (daemon.root / topic).exists()


def test_a_closed_stdout_ends_the_cli_quietly(daemon: DaemonProcess, kafka: Kafka) -> None:
    import sys

    topic = kafka.topic(prefix="fh")
    kafka.produce(topic, [(f"key-{i:05d}", "x" * 40) for i in range(3000)])  # ~200 kB of table: more than a pipe holds
    ok(cli(daemon, "compact", topic, "--wait"))
    # ``compactord read T | head -c 1``: the reader goes away after the first byte
    reader = subprocess.Popen(["head", "-c", "1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    assert reader.stdin is not None
    with reader.stdin:
        result = subprocess.run(
            [sys.executable, "-m", "compactord", "read", topic, "--url", daemon.url, "--limit", "3000"],
            stdout=reader.stdin, stderr=subprocess.PIPE, text=True, timeout=120, check=False,
            env={k: v for k, v in os.environ.items() if not k.startswith("COMPACTORD_")})
    reader.wait(30)
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr
    assert result.returncode == 141, result.stderr  # as a process that SIGPIPE ended


# -- 2. docs that work where the daemon runs --------------------------------------------------------


def test_docs_load_everything_from_the_daemon(daemon: DaemonProcess) -> None:
    html = daemon.http.get("/docs")
    assert html.status_code == 200 and "SwaggerUIBundle" in html.text
    assert not re.search(r"https?://", html.text), html.text  # no CDN, no online validator
    assets = re.findall(r'(?:src|href)="([^"]+)"', html.text)
    assert len(assets) == 3 and all(a.startswith("/static/swagger-ui/") for a in assets), assets
    for asset in assets:
        response = daemon.http.get(asset)
        assert response.status_code == 200 and len(response.content) > 500, asset
    bundle = daemon.http.get("/static/swagger-ui/swagger-ui-bundle.js")
    assert bundle.headers["content-type"].startswith("text/javascript") and b"SwaggerUIBundle" in bundle.content
    assert_error(daemon.http.get("/static/swagger-ui/LICENSE"), 404, "not_found")  # only what /docs loads


def test_openapi_describes_the_real_bodies_with_unique_operation_ids(daemon: DaemonProcess) -> None:
    schema = daemon.http.get("/openapi.json").json()
    components = schema["components"]["schemas"]
    assert "HTTPValidationError" not in components
    assert components["Error"]["properties"].keys() == {"error", "message"}
    assert components["Conflict"]["properties"].keys() == {"error", "message", "task"}
    assert {"task_id", "state", "status", "progress"} <= components["Task"]["properties"].keys()
    assert {"partition", "offset", "key", "value", "headers"} <= components["Entry"]["properties"].keys()
    assert {"topic", "on_broker", "backlog", "last_compaction"} <= components["Topic"]["properties"].keys()
    trigger = schema["paths"]["/v1/topics/{topic}/compaction"]["put"]["responses"]
    ref = lambda status: trigger[status]["content"]["application/json"]["schema"]["$ref"]  # noqa: E731
    assert (ref("202"), ref("409"), ref("404"), ref("422"), ref("503")) == tuple(
        f"#/components/schemas/{name}" for name in ("Task", "Conflict", "Error", "Error", "Error"))
    ids = [op["operationId"] for ops in schema["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids)), sorted(ids)
    assert "Duplicate Operation ID" not in daemon.log_text()
    assert daemon.http.head("/healthz").status_code == 200 and daemon.http.head("/readyz").status_code == 200


# -- 4. a cancel is one quiet line ------------------------------------------------------------------


def test_a_cancel_during_the_spark_job_logs_one_info_line(daemon: DaemonProcess, kafka: Kafka) -> None:
    topic = kafka.topic(partitions=2, prefix="fh")
    with kafka.producer() as producer:
        for i in range(CANCEL_RECORDS):
            producer.send(topic, key=b"k%d" % (i % 5000), value=b"v" * 30, partition=i % 2)
        producer.flush()
    # A read budget of ~2 s of the topic, so that the cancel comes while the tasks read, however fast the run.
    ok(cli(daemon, "policies", topic, "--set", f"maxReadBytesPerSecond={CANCEL_RECORDS * 35 // 2}"))
    mark = len(daemon.log_text())
    task = json.loads(ok(cli(daemon, "compact", topic, "--json")))
    # the Spark job is reading: the executors report progress
    wait_for(lambda: daemon.http.get(f"/v1/topics/{topic}/compaction").json()["progress"]["records_read"] > 0,
             120, "the Spark job to read records", daemon, interval=0.05)
    started = time.monotonic()
    cancelled = json.loads(ok(cli(daemon, "cancel", topic, "--json")))
    print(f"cancel answered in {time.monotonic() - started:.2f}s; state {cancelled['state']}")
    assert cancelled["task_id"] == task["task_id"]
    wait_state(daemon, topic, "Cancelled")
    # the next run succeeds: the cancelled job's executors are done (and have logged whatever they log)
    assert "status    SUCCESS" in ok(cli(daemon, "compact", topic, "--wait"))
    log = daemon.log_text()[mark:]
    lines = [line for line in log.splitlines() if task["task_id"] in line]
    cancel_lines = [line for line in lines if "cancel" in line]
    assert len(cancel_lines) == 1, "\n".join(lines)
    assert re.search(rf"INFO .*topic {topic}.*task {task['task_id']}.*cancelled in (Running|Creating_Raw_Reader)"
                     r".*stopped in \d+\.\ds", cancel_lines[0]), cancel_lines[0]
    for noise in ("Traceback", "ERROR Executor", "BrokenPipeError", "WARN TaskSetManager", "ERROR TaskSetManager"):
        assert noise not in log, f"{noise} in the log of a cancel:\n{log[-4000:]}"


CANCEL_RECORDS = 200_000


# -- 5. without a broker: fast, quiet answers (last: it kills the embedded broker) -----------------


def test_a_daemon_on_a_dead_port_answers_503_at_once_and_stops_while_spark_starts(launch: Launcher) -> None:
    from compactord.embedded import free_port

    dead = launch.prepare("dead-port", kafkaBootstrapServers=f"127.0.0.1:{free_port()}").start()
    wait_for(lambda: _get(dead, "/healthz") == 200, 60, "the API to answer", dead)
    # known down from the first ping: a refused connection is not retried for the bootstrap timeout
    wait_for(lambda: "the broker does not answer" in dead.http.get("/readyz").json()["problems"], 30,
             "the daemon to see no broker", dead, interval=0.05)
    started = time.monotonic()
    response = dead.http.put("/v1/topics/anything/compaction")
    print(f"503 from a daemon on a dead port: {time.monotonic() - started:.3f}s")
    assert_error(response, 503, "broker_unavailable")
    assert_error(dead.http.get("/v1/topics"), 503, "broker_unavailable")
    spark_up = "Spark session up" in dead.log_text()
    started = time.monotonic()
    assert dead.stop() == 0, dead.log_tail()
    print(f"SIGTERM to exit while Spark {'was up' if spark_up else 'started'}: {time.monotonic() - started:.2f}s")
    log = dead.log_text()
    if not spark_up:  # SIGTERM came while the JVM started: not waited for
        assert "the Spark session is still starting: not waited for" in log, log
    assert log.count("broker unavailable") == 1, log
    assert "kafka.net" not in log and "Traceback" not in log, log


def test_the_embedded_broker_ends_with_a_daemon_killed_with_sigkill(launch: Launcher) -> None:
    """Its topics are in its memory: a broker that outlived its daemon would hold them where the next
    daemon, which starts a broker of its own, never looks."""
    killed = launch.prepare("embedded-kill")
    killed.args = ("--embedded-broker",)
    killed.start()
    pid = None
    try:
        pid = wait_for(lambda: broker_pid(killed), 60, "the embedded broker to start", killed)
        assert alive(pid)
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait_exit(STOP_TIMEOUT_S)
        wait_for(lambda: not alive(pid), 10, f"the embedded broker (pid {pid}) to end with its daemon")
    finally:
        killed.stop()
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGKILL)


def _get(daemon: DaemonProcess, path: str) -> int | None:
    import httpx

    try:
        return httpx.get(daemon.url + path, timeout=5).status_code
    except httpx.HTTPError:
        return None


def test_without_its_broker_the_daemon_answers_503_at_once_and_stops_quickly(daemon: DaemonProcess) -> None:
    pid = broker_pid(daemon)
    assert pid is not None, daemon.log_tail()
    mark = len(daemon.log_text())
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: "the broker does not answer" in daemon.http.get("/readyz").json()["problems"], 60,
             "the daemon to see its broker gone", daemon, interval=0.1)
    started = time.monotonic()
    response = daemon.http.put(f"/v1/topics/{DEMO}/compaction")
    print(f"503 after the broker is known down: {time.monotonic() - started:.3f}s")
    assert_error(response, 503, "broker_unavailable")
    failed(cli(daemon, "topics"), "503", "broker_unavailable")
    for _ in range(10):  # requests that need the broker: 503 each, and no log line each
        assert_error(daemon.http.get("/v1/topics"), 503, "broker_unavailable")
    # reads of a ledger need no broker
    assert daemon.http.get(f"/v1/topics/{DEMO}/horizon").status_code == 200
    time.sleep(WATCH_S)  # the probe pings again meanwhile (with backoff): no line per ping
    log = daemon.log_text()[mark:]
    noisy = [line for line in log.splitlines() if "kafka" in line or "broker" in line]
    assert len(noisy) <= 2, "\n".join(noisy)
    assert "Traceback" not in log

    started = time.monotonic()
    assert daemon.stop() == 0
    print(f"SIGTERM to exit without a broker: {time.monotonic() - started:.2f}s")


WATCH_S = 8.0
