"""A cluster of real daemons (``clusterName``) sharing one ledger root, as the daemon tier's cluster tests drive it:
the members' configs, their view of the group (``GET /v1/cluster``), who owns a topic, and the view a member serves.

``settled`` is the one condition the tests wait for after a member joins, leaves or dies: every member sees all
of them in one generation, and every coordination partition is held once.
"""

from __future__ import annotations

import contextlib
import uuid
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tests.support.daemon import DaemonProcess
from tests.support.timeouts import REBALANCE_TIMEOUT_S
from tests.support.waiting import wait_for

if TYPE_CHECKING:
    from tests.daemon.conftest import Launcher

__all__ = ["PARTITIONS", "TOKEN", "Root", "by_url", "cluster_of", "member", "owner_url", "partition_of", "running",
           "settled", "view"]

PARTITIONS = 8  # the clusterCoordinationPartitions of the tests' clusters
TOKEN = "cluster-shared-token"  # every member's httpAuthToken: a forwarded request carries the caller's


def partition_of(topic: str, partitions: int = PARTITIONS) -> int:
    return zlib.crc32(topic.encode()) % partitions


def cluster_of(daemon: DaemonProcess) -> dict[str, Any]:
    answer = daemon.client().get("/v1/cluster")
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def settled(daemons: list[DaemonProcess], partitions: int = PARTITIONS) -> bool:
    """Every member sees all of them, in one generation, and every coordination partition is held once."""
    views = [cluster_of(d) for d in daemons]
    if any(len(v["members"]) != len(daemons) or v["unowned_partitions"] != 0 for v in views):
        return False
    if len({v["generation"] for v in views}) != 1:
        return False
    held = [p for m in views[0]["members"] for p in m["partitions"]]
    return sorted(held) == list(range(partitions))


def owner_url(daemon: DaemonProcess, topic: str, partitions: int = PARTITIONS) -> str:
    part = partition_of(topic, partitions)
    [url] = [m["url"] for m in cluster_of(daemon)["members"] if part in m["partitions"]]
    return url


def by_url(daemons: list[DaemonProcess], url: str) -> DaemonProcess:
    [daemon] = [d for d in daemons if d.url == url]
    return daemon


def view(daemon: DaemonProcess, topic: str) -> list[tuple[Any, ...]]:
    """The compacted view the member serves of the topic's partition 0: (partition, offset, key, value) entries."""
    answer = daemon.client().get(f"/v1/topics/{topic}/compacted", params={"partition": 0, "limit": 1000, "encoding": "utf8"})
    assert answer.status_code == 200, answer.text
    return [(e["partition"], e["offset"], e["key"], e["value"]) for e in answer.json()["entries"]]


class Root:
    """Where the members' ledgers are: ``kind`` local or s3; ``conf``: the keys every daemon on it is given."""

    def __init__(self, kind: str, location: Any, conf: dict[str, str]) -> None:
        self.kind, self.location, self.conf = kind, location, conf
        self.cluster = f"cl-{kind}-{uuid.uuid4().hex[:6]}"  # a group of its own for each root


def member(launch: Launcher, root: Root, name: str, *, pauses: str | None = None, **conf: object) -> DaemonProcess:
    """A member's config (not started): the root's cluster, ``PARTITIONS`` coordination partitions, a 6 s session,
    the shared ``TOKEN``, and its own URL advertised; ``conf`` adds broker.conf keys."""
    values: dict[str, object] = {"clusterName": root.cluster, "clusterCoordinationPartitions": PARTITIONS,
                                 "clusterSessionTimeoutMs": 6000, "compactionDriverRunMaxRecords": 100000,
                                 **root.conf, **conf}
    daemon = launch.prepare(f"{root.kind}-{name}", root=root.location, token=TOKEN, pauses=pauses, **values)
    # Each member is reached at its own port: the URL it advertises to the others.
    with daemon.config.open("a") as written:
        written.write(f"clusterAdvertisedUrl={daemon.url}\n")
    return daemon


@contextlib.contextmanager
def running(daemons: list[DaemonProcess], partitions: int = PARTITIONS) -> Iterator[list[DaemonProcess]]:
    """Start the members, wait until each is ready and the group has settled; stop them all at the end (also
    when a test fails)."""
    try:
        for daemon in daemons:
            daemon.start()
        for daemon in daemons:
            daemon.wait_ready()
        wait_for(lambda: settled(daemons, partitions), timeout=REBALANCE_TIMEOUT_S,
                 what=f"{len(daemons)} members share the partitions")
        yield daemons
    finally:
        for daemon in daemons:
            daemon.stop()
