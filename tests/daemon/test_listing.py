"""``GET /v1/topics`` at scale: it answers from what the daemon keeps (the monitor's last pass, the tasks), so
a listing makes no request to the broker and none to the ledger root's store (counted by the daemon's own
counters on an S3 root); it is paged (``limit``, ``after``: every topic once, in name order) and filtered (by
state and by name prefix), and the CLI's ``topics`` follows the pages.

One daemon on an S3 root whose monitor passes once, at its start (interval 3600 s): the topics exist before
it starts, so that pass sees them all, and nothing else asks the broker or the store during the test.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, metric, metric_samples
from tests.support.s3_server import BUCKET
from tests.support.timeouts import READY_TIMEOUT_S, TASK_TIMEOUT_S
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

BIG, SMALL = 30, 2  # records per topic; the broker-wide threshold is 10 messages


@pytest.fixture(scope="module")
def topics(kafka: Any) -> dict[str, int]:
    made = {}
    for prefix, count in (("lsta", BIG), ("lsta", SMALL), ("lsta", BIG), ("lstb", SMALL), ("lstb", BIG)):
        topic = kafka.topic(prefix=prefix)
        kafka.produce(topic, [(f"k{i}", f"v{i}") for i in range(count)])
        made[topic] = count
    return made


@pytest.fixture(scope="module")
def compacted_once(kafka: Any) -> str:
    """A topic of the first pass that one test compacts (by hand: the monitor triggers nothing)."""
    topic = kafka.topic(prefix="lstc")
    kafka.produce(topic, [(f"k{i}", f"v{i}") for i in range(BIG)])
    return topic


@pytest.fixture(scope="module")
def daemon(launch: Any, s3_server: Any, topics: dict[str, int], compacted_once: str) -> DaemonProcess:
    prefix = f"listing-{uuid.uuid4().hex[:12]}"
    started: DaemonProcess = launch("listing", root=f"s3://{BUCKET}/{prefix}",
                                    brokerServiceCompactionMonitorIntervalInSeconds="3600",
                                    compactionThresholdInMessages=10, **s3_server.daemon_conf())
    wait_for(lambda: (metric(started, "compactord_monitor_runs_total", result="ok") or 0) >= 1, 60,
             "the monitor's first pass", started)
    return started


def pages(daemon: DaemonProcess, **query: Any) -> list[list[str]]:
    """Every page of the listing, following next_after until the last."""
    out: list[list[str]] = []
    after = None
    while True:
        params = {**query, **({"after": after} if after is not None else {})}
        response = daemon.http.get("/v1/topics", params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        out.append([t["topic"] for t in body["topics"]])
        after = body["next_after"]
        if after is None:
            return out
        assert after == out[-1][-1], body


def counted(daemon: DaemonProcess) -> tuple[float, dict[str, float]]:
    samples = metric_samples(daemon)
    broker = sum(v for name, _labels, v in samples if name == "compactord_broker_requests_total")
    store = {labels["op"]: v for name, labels, v in samples if name == "compactord_storage_requests_total"}
    return broker, store


def test_a_listing_asks_neither_the_broker_nor_the_store(daemon: DaemonProcess, topics: dict[str, int]) -> None:
    assert daemon.http.get("/v1/topics").status_code == 200
    broker_before, store_before = counted(daemon)
    assert broker_before > 0  # the first pass's, counted
    for _ in range(10):
        body = daemon.http.get("/v1/topics", params={"limit": 2}).json()
        assert len(body["topics"]) == 2 and body["next_after"] is not None
        assert daemon.http.get("/v1/topics").status_code == 200
    broker_after, store_after = counted(daemon)
    assert broker_after == broker_before
    for op in set(store_before) | set(store_after):  # the second scrape's own listing of the quarantine aside
        allowed = 1 if op == "list" else 0
        assert store_after.get(op, 0) - store_before.get(op, 0) <= allowed, (op, store_before, store_after)
    assert (metric(daemon, "compactord_monitor_pass_broker_requests") or 0) > 0
    assert metric(daemon, "compactord_monitor_pass_seconds") is not None


def test_the_pages_cover_every_topic_once_in_order(daemon: DaemonProcess, topics: dict[str, int]) -> None:
    whole = pages(daemon, limit=1000)
    assert len(whole) == 1
    names = whole[0]
    assert names == sorted(names) and set(topics) <= set(names)
    paged = pages(daemon, limit=2)
    assert [t for page in paged for t in page] == names
    assert all(len(page) == 2 for page in paged[:-1]) and 1 <= len(paged[-1]) <= 2
    entry = {t["topic"]: t for t in daemon.http.get("/v1/topics", params={"limit": 1000}).json()["topics"]}
    for topic, count in topics.items():
        backlog = entry[topic]["backlog"]
        assert backlog["records"] == count and backlog["measured_at"] is not None, entry[topic]
        assert backlog["measure_age_ms"] >= 0 and entry[topic]["on_broker"] is True


def test_the_listing_filters_by_prefix_and_state(daemon: DaemonProcess, topics: dict[str, int]) -> None:
    mine = set(topics)
    lsta = {t for t in topics if t.startswith("lsta")}
    [a_prefix] = {t.split("-")[0] for t in lsta}
    assert {t for page in pages(daemon, prefix=a_prefix, limit=1) for t in page} == lsta
    behind = {t for page in pages(daemon, state="behind") for t in page}
    assert behind & mine == {t for t, count in topics.items() if count == BIG}
    assert not {t for page in pages(daemon, state="running") for t in page} & mine
    assert not {t for page in pages(daemon, state="failed") for t in page} & mine
    refused = daemon.http.get("/v1/topics", params={"state": "sleeping"})
    assert refused.status_code == 422 and "running, failed, behind" in refused.json()["message"], refused.text
    assert daemon.http.get("/v1/topics", params={"limit": 0}).status_code == 422
    assert daemon.http.get("/v1/topics", params={"limit": 1001}).status_code == 422


def broker_ops(daemon: DaemonProcess) -> dict[str, float]:
    return {labels["op"]: v for name, labels, v in metric_samples(daemon) if name == "compactord_broker_requests_total"}


def test_a_run_s_row_is_measured_from_the_run_s_own_answer(daemon: DaemonProcess, compacted_once: str) -> None:
    """At a run's end its topic's row shows the backlog after it (none) from what the run's planning was told of
    the log (its id and offsets) and the configs the pass saw: the broker is not asked again (no DescribeConfigs,
    no metadata request or ListOffsets beside the trigger's and the run's own)."""
    def row() -> dict[str, Any]:
        body = daemon.http.get("/v1/topics", params={"prefix": compacted_once}).json()
        [found] = body["topics"]
        return found  # type: ignore[no-any-return]

    before = row()
    assert before["backlog"]["records"] == BIG and before["last_compaction"]["status"] == "NOT_RUN", before
    ops_before = broker_ops(daemon)
    response = daemon.http.put(f"/v1/topics/{compacted_once}/compaction")
    assert response.status_code == 202, response.text
    wait_for(lambda: (r := row())["last_compaction"] is not None and r["last_compaction"]["status"] == "SUCCESS"
             and r["backlog"]["records"] == 0, TASK_TIMEOUT_S, f"topic {compacted_once}'s row after its run", daemon)
    after = row()
    assert after["backlog"]["measured_at"] > before["backlog"]["measured_at"], (before, after)
    ops_after = broker_ops(daemon)
    made = {op: ops_after.get(op, 0) - ops_before.get(op, 0) for op in set(ops_before) | set(ops_after)}
    assert made.get("describe_configs", 0) == 0, made
    # The trigger's check that the topic exists, and the run's planning: one metadata request each.
    assert made.get("metadata", 0) <= 2 and made.get("list_offsets", 0) <= 1, made


WATCHED = 8  # topics of the daemon whose monitor passes every second, each compacted once by its first passes
UNWATCHED = 4  # and topics of its broker that it measures but never compacts (nothing of them on its root)


@pytest.fixture(scope="module")
def passing(launch: Any, s3_server: Any, kafka: Any) -> tuple[DaemonProcess, list[str]]:
    """A daemon on an S3 root whose monitor passes every second over ``WATCHED`` topics of its own, once each
    of them is compacted (its pointer switched, its run recorded) and a pass has seen it so."""
    prefix = f"lstw{uuid.uuid4().hex[:6]}"
    watched = [kafka.topic(prefix=prefix) for _ in range(WATCHED)]
    for topic in watched + [kafka.topic(prefix=f"lstu{uuid.uuid4().hex[:6]}") for _ in range(UNWATCHED)]:
        kafka.produce(topic, [(f"k{i}", f"v{i}") for i in range(BIG)])
    started: DaemonProcess = launch("listing-passes", root=f"s3://{BUCKET}/passes-{uuid.uuid4().hex[:12]}",
                                    brokerServiceCompactionMonitorIntervalInSeconds="1",
                                    compactionTopicsPattern=f"{prefix}-.*", compactionThresholdInMessages=10,
                                    **s3_server.daemon_conf())

    def compacted() -> bool:
        body = started.http.get("/v1/topics", params={"prefix": prefix}).json()
        return len(body["topics"]) == WATCHED and all(
            t["last_compaction"]["status"] == "SUCCESS" and (t["backlog"] or {}).get("records") == 0
            for t in body["topics"])

    wait_for(compacted, TASK_TIMEOUT_S, f"the {WATCHED} topics compacted and seen so by a pass", started)
    return started, watched


def passes(daemon: DaemonProcess) -> float:
    return metric(daemon, "compactord_monitor_runs_total", result="ok") or 0.0


def reads_in_two_passes(daemon: DaemonProcess) -> tuple[dict[str, float], int]:
    """The store's read requests (get, head, list) from the end of a pass to the end of the second after it,
    and the scrapes of ``/metrics`` made meanwhile (each lists the root's quarantine once)."""
    first = passes(daemon)
    wait_for(lambda: passes(daemon) >= first + 1, READY_TIMEOUT_S, "a monitor pass", daemon)
    _broker, before = counted(daemon)
    at, scrapes = passes(daemon), 1

    def two_more() -> bool:
        nonlocal scrapes
        scrapes += 1
        return passes(daemon) >= at + 2

    wait_for(two_more, READY_TIMEOUT_S, "two monitor passes", daemon, interval=0.5)
    _broker, after = counted(daemon)
    return {op: after.get(op, 0) - before.get(op, 0) for op in ("get", "head", "list")}, scrapes + 1


def test_a_pass_asks_the_store_nothing_per_topic(passing: tuple[DaemonProcess, list[str]]) -> None:
    """The topics' pointers, ledgers, policies and last runs are read once, then kept: two passes over
    ``WATCHED`` compacted topics and ``UNWATCHED`` others make no get and no head, and a list of the root's
    folders each; so do they once the daemon restarted (each read once, by its first pass)."""
    daemon, _watched = passing
    for restarted in (False, True):
        if restarted:
            daemon.stop()
            daemon.start().wait_ready()
            wait_for(lambda: passes(daemon) >= 1, READY_TIMEOUT_S, "the restarted daemon's first pass", daemon)
        reads, scrapes = reads_in_two_passes(daemon)
        assert reads["get"] + reads["head"] == 0, (restarted, reads)
        assert reads["list"] <= 4 + scrapes, (restarted, reads, scrapes)  # a list a pass, a third pass begun


def test_a_policy_written_is_the_one_the_passes_use(passing: tuple[DaemonProcess, list[str]], kafka: Any) -> None:
    """A policy this daemon writes is kept as written: the passes after it use it without reading it again."""
    daemon, watched = passing
    held, free = watched[0], watched[1]
    response = daemon.http.put(f"/v1/topics/{held}/policies", json={"thresholdMessages": 1000})
    assert response.status_code == 200, response.text
    for topic in (held, free):
        kafka.produce(topic, [(f"k{i}", f"again{i}") for i in range(BIG)])

    def rows() -> dict[str, Any]:
        return {t["topic"]: t for t in daemon.http.get("/v1/topics", params={"limit": 1000}).json()["topics"]}

    finished = rows()[free]["last_compaction"]["finished_at"]
    wait_for(lambda: rows()[free]["last_compaction"]["finished_at"] != finished and
             rows()[free]["backlog"]["records"] == 0, TASK_TIMEOUT_S, f"topic {free} compacted again", daemon)
    at = passes(daemon)
    wait_for(lambda: passes(daemon) >= at + 2, READY_TIMEOUT_S, "two monitor passes", daemon)
    row = rows()[held]
    assert row["backlog"]["records"] == BIG and row["current_task"] is None, row
    assert row["behind"] is False, row
