"""Benchmark: a cluster of daemons (``clusterName``) on one local root: the time to settle, a SIGKILL failover and a
SIGTERM handover, with many tiny topics.

Usage (from the repository root, with the project's venv)::

    .venv/bin/python bench/cluster.py                        # 3 daemons, 300 topics of 10 records
    .venv/bin/python bench/cluster.py --daemons 3 --topics 100

It starts the bundled broker, creates ``--topics`` topics of one partition with ``--records`` records each (pattern
``bench-.*``, watched by every member; no threshold is set, so nothing is compacted but what the bench triggers),
then ``--daemons`` members of one cluster (``sparkMaster=local[1]`` each, the default 32 coordination partitions and
6 s session) on one local root, started together, and measures:

1. **start**: from the processes' start to every member ready for compactions, to the group settled (every member
   sees all of them in one generation, every coordination partition held once), and to every topic taken (the
   members' ``owned_topics`` add up to every topic);
2. **SIGKILL failover**: a topic of one member is compacted and given one record more, then that member's process
   group is killed; from the kill to the survivors holding every partition (and every topic), and to a trigger of
   the dead member's topic, sent to a survivor every half second (503 ``no_owner`` meanwhile), accepted and then
   succeeding on its new owner; then the member is started again, and the time to settle once more;
3. **SIGTERM handover**: a topic of another member is compacted and given one record more, and that member is
   stopped (it hands its topics over and leaves the group); from the SIGTERM to its exit, to the survivors
   holding every partition and topic, and to a trigger of its topic accepted and succeeding.

It prints a table. The daemons' logs stay in the work directory it names.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from many_topics import make_topics  # noqa: E402

from compactord.embedded import EmbeddedBroker, free_port  # noqa: E402
from tests.support.cluster import cluster_of, partition_of, settled  # noqa: E402
from tests.support.daemon import DaemonProcess, write_conf  # noqa: E402

PARTITIONS = 32  # clusterCoordinationPartitions' default
TOKEN = "bench-cluster-token"
TIMEOUT_S = 900.0


def produce_one(bootstrap: str, topic: str) -> None:
    """A record more, so that the next run has something to compact."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap)
    producer.send(topic, key=b"k-after", value=b"after")
    producer.flush()
    producer.close()


def member(work: Path, bootstrap: str, cluster: str, name: str) -> DaemonProcess:
    folder = work / name
    folder.mkdir()
    port = free_port()
    token = folder / "token"
    token.write_text(TOKEN + "\n")
    config = write_conf(folder / "broker.conf", {
        "kafkaBootstrapServers": bootstrap, "compactedLedgerRoot": work / "ledgers", "httpPort": port,
        "httpAuthToken": f"file:{token}", "sparkMaster": "local[1]", "spark.driver.memory": "1g",
        "compactionTopicsPattern": "bench-.*", "brokerServiceCompactionThresholdInBytes": 0,
        "clusterName": cluster, "clusterAdvertisedUrl": f"http://127.0.0.1:{port}",
    })
    return DaemonProcess(config, folder / "daemon.log", port, work / "ledgers", token=TOKEN, workdir=folder)


def wait(predicate: Callable[[], object], what: str, daemons: list[DaemonProcess]) -> float:
    """Poll ``predicate`` (an HTTP error counts as not yet) until true; the monotonic time it was first seen true."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            if predicate():
                return time.monotonic()
        except (httpx.HTTPError, AssertionError, ValueError):
            pass
        for daemon in daemons:
            if daemon.process is not None and daemon.process.poll() is not None:
                raise SystemExit(f"a member exited while waiting for {what}; see {daemon.log_path}")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {TIMEOUT_S:.0f} s waiting for {what}")
        time.sleep(0.1)


def ready(daemon: DaemonProcess) -> bool:
    with httpx.Client(base_url=daemon.url, timeout=5) as client:
        return bool(client.get("/readyz").json().get("compactions"))


def all_taken(daemons: list[DaemonProcess], topics: list[str]) -> bool:
    taken = [t for d in daemons for t in cluster_of(d)["owned_topics"]]
    return sorted(taken) == sorted(topics)


def owner_of(daemons: list[DaemonProcess], topic: str) -> DaemonProcess:
    part = partition_of(topic, PARTITIONS)
    [url] = [m["url"] for m in cluster_of(daemons[0])["members"] if part in m["partitions"]]
    [owner] = [d for d in daemons if d.url == url]
    return owner


class Trigger:
    """A trigger of ``topic`` sent to ``asked`` every half second until accepted (202; 503 ``no_owner`` while the
    topic has no owner), then its run watched on the owner until it succeeds: ``poll()`` is one step, true at the
    end; ``accepted`` and ``done`` are the monotonic times each was first seen."""

    def __init__(self, asked: DaemonProcess, members: list[DaemonProcess], topic: str) -> None:
        self.asked, self.members, self.topic = asked, members, topic
        self.task_id: str | None = None
        self.accepted: float | None = None
        self.done: float | None = None
        self._sent = 0.0

    def poll(self) -> bool:
        if self.done is not None:
            return True
        if self.task_id is None:
            if time.monotonic() - self._sent < 0.5:
                return False
            self._sent = time.monotonic()
            with self.asked.client() as client:
                answer = client.put(f"/v1/topics/{self.topic}/compaction")
            if answer.status_code == 202:
                self.accepted, self.task_id = time.monotonic(), answer.json()["task_id"]
            elif answer.status_code not in (503, 409):
                raise SystemExit(f"a trigger of {self.topic} answered {answer.status_code}: {answer.text}")
            return False
        with owner_of(self.members, self.topic).client() as client:
            body = client.get(f"/v1/topics/{self.topic}/compaction").json()
        if body["task_id"] != self.task_id:
            return False
        if body["state"] in ("Failed", "Cancelled"):
            raise SystemExit(f"the run of {self.topic} ended {body['state']}: {body['last_error']}")
        if body["state"] == "Succeed":
            self.done = time.monotonic()
        return self.done is not None


def watch(conditions: dict[str, Callable[[], object]], daemons: list[DaemonProcess]) -> dict[str, float]:
    """Poll every condition until each has been true once: the monotonic time each was first seen true."""
    seen: dict[str, float] = {}

    def step() -> bool:
        for name, predicate in conditions.items():
            if name not in seen and predicate():
                seen[name] = time.monotonic()
        return len(seen) == len(conditions)

    wait(step, " and ".join(conditions), daemons)
    return seen


def compact(daemons: list[DaemonProcess], topic: str) -> None:
    trigger = Trigger(daemons[0], daemons, topic)
    wait(trigger.poll, f"a compaction of {topic}", daemons)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--daemons", type=int, default=3)
    parser.add_argument("--topics", type=int, default=300)
    parser.add_argument("--records", type=int, default=10, help="records per topic")
    args = parser.parse_args()
    if args.daemons < 3:
        parser.error("--daemons: at least 3 (a failover and a handover, one after the other, need two survivors)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped bench stops its daemons and broker too

    work = Path(tempfile.mkdtemp(prefix="compactord-cluster-"))
    print(f"work directory (logs; kept): {work}", flush=True)
    broker = EmbeddedBroker(log_path=work / "tansu.log").start()
    daemons: list[DaemonProcess] = []
    with contextlib.ExitStack() as stack:
        stack.callback(broker.stop)
        stack.callback(lambda: [d.stop() for d in daemons if d.process is not None])
        started = time.monotonic()
        topics = make_topics(broker.bootstrap, args.topics, args.records, prefix="bench", keys=5)
        print(f"{args.topics} topics of {args.records} records made in {time.monotonic() - started:.1f} s", flush=True)
        cluster = f"bench-{uuid.uuid4().hex[:6]}"
        daemons.extend(member(work, broker.bootstrap, cluster, f"m{n}") for n in range(args.daemons))

        # 1. start
        t0 = time.monotonic()
        for daemon in daemons:
            daemon.start()
        conditions: dict[str, Callable[[], object]] = {d.url: (lambda d=d: ready(d)) for d in daemons}  # type: ignore[misc]
        conditions.update(settled=lambda: settled(daemons, PARTITIONS), taken=lambda: all_taken(daemons, topics))
        seen = watch(conditions, daemons)
        t_ready, t_settled, t_taken = max(seen[d.url] for d in daemons), seen["settled"], seen["taken"]
        print(f"start: ready {t_ready - t0:.1f} s, settled {t_settled - t0:.1f} s, taken {t_taken - t0:.1f} s",
              flush=True)

        # 2. SIGKILL failover
        victim = daemons[-1]
        survivors = daemons[:-1]
        [topic] = [t for t in topics if owner_of(daemons, t) is victim][:1]
        compact(daemons, topic)
        produce_one(broker.bootstrap, topic)
        t_kill = time.monotonic()
        victim.kill_group()
        assert victim.process is not None
        victim.process.wait(30)
        trigger = Trigger(survivors[0], survivors, topic)
        seen = watch({"partitions": lambda: settled(survivors, PARTITIONS),
                      "topics": lambda: all_taken(survivors, topics), "trigger": trigger.poll}, survivors)
        assert trigger.accepted is not None
        t_held, t_held_topics, accepted, done = seen["partitions"], seen["topics"], trigger.accepted, seen["trigger"]
        kill = (t_held - t_kill, t_held_topics - t_kill, accepted - t_kill, done - t_kill)
        print(f"SIGKILL: partitions held {kill[0]:.1f} s, topics {kill[1]:.1f} s, trigger accepted {kill[2]:.1f} s, "
              f"succeeded {kill[3]:.1f} s", flush=True)
        t_back = time.monotonic()
        victim.start()
        t_rejoined = wait(lambda: settled(daemons, PARTITIONS) and all_taken(daemons, topics), "the member to rejoin",
                          daemons)
        print(f"restart of the killed member: settled {t_rejoined - t_back:.1f} s", flush=True)

        # 3. SIGTERM handover
        leaving = daemons[0]
        survivors = daemons[1:]
        [topic] = [t for t in topics if owner_of(daemons, t) is leaving][:1]
        compact(daemons, topic)
        produce_one(broker.bootstrap, topic)
        t_term = time.monotonic()
        stopping = threading.Thread(target=lambda: codes.append(leaving.stop()), name="stopping")
        codes: list[int | None] = []
        stopping.start()
        trigger = Trigger(survivors[0], survivors, topic)
        seen = watch({"exit": lambda: not stopping.is_alive(), "partitions": lambda: settled(survivors, PARTITIONS),
                      "topics": lambda: all_taken(survivors, topics), "trigger": trigger.poll}, survivors)
        [code] = codes
        assert trigger.accepted is not None
        t_exit, t_held, t_held_topics = seen["exit"], seen["partitions"], seen["topics"]
        accepted, done = trigger.accepted, seen["trigger"]
        term = (t_exit - t_term, t_held - t_term, t_held_topics - t_term, accepted - t_term, done - t_term)
        print(f"SIGTERM (exit {code}): exited {term[0]:.1f} s, partitions held {term[1]:.1f} s, topics "
              f"{term[2]:.1f} s, trigger accepted {term[3]:.1f} s, succeeded {term[4]:.1f} s", flush=True)

        rebalance = cluster_of(survivors[0])["last_rebalance_seconds"]
        rows = [
            ("start to every member ready / group settled / every topic taken",
             f"{t_ready - t0:.1f} / {t_settled - t0:.1f} / {t_taken - t0:.1f} s"),
            ("SIGKILL to the survivors holding every partition / every topic",
             f"{kill[0]:.1f} / {kill[1]:.1f} s"),
            ("SIGKILL to a trigger of the dead member's topic accepted / succeeded",
             f"{kill[2]:.1f} / {kill[3]:.1f} s"),
            ("killed member restarted to the group settled again", f"{t_rejoined - t_back:.1f} s"),
            ("SIGTERM to the member's exit", f"{term[0]:.1f} s"),
            ("SIGTERM to the survivors holding every partition / every topic", f"{term[1]:.1f} / {term[2]:.1f} s"),
            ("SIGTERM to a trigger of its topic accepted / succeeded", f"{term[3]:.1f} / {term[4]:.1f} s"),
            ("the last rebalance, as a survivor reports it", f"{rebalance:.1f} s" if rebalance is not None else "-"),
        ]
        print(f"\n{args.daemons} daemons (local[1] Spark each), {args.topics} topics of {args.records} records, "
              f"{PARTITIONS} coordination partitions, a 6 s session, a local root")
        print("| figure | value |\n|---|---|")
        for name, value in rows:
            print(f"| {name} | {value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
