"""Several daemons, one cluster (``clusterName``): real daemon processes sharing one ledger root (a local folder,
and an S3 bucket's prefix on the test S3 server), their
membership through the test broker's group coordinator. Each topic has one owner; a request that changes a topic,
sent to any member, is carried out by its owner; every member serves the same view; a member killed with SIGKILL
or stopped with SIGTERM hands its topics to the others, whose next compactions succeed. A daemon that is not the
cluster's refuses its root.

Tansu holds each JoinGroup for half the session timeout: a first assignment takes ~3 s and a dead member is
replaced in ~11 s with a 6 s session; the waits below are bounded by ``REBALANCE_TIMEOUT_S``, never timed.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from compactord.api import models
from compactord.cluster import coordination_topic
from tests.conftest import Kafka
from tests.daemon.conftest import Launcher
from tests.support.cluster import Root, by_url, cluster_of, member, owner_url, running, settled, view
from tests.support.daemon import DaemonProcess, wait_state
from tests.support.s3_server import BUCKET
from tests.support.timeouts import REBALANCE_TIMEOUT_S, STOP_TIMEOUT_S
from tests.support.waiting import wait_for

TOPICS = 8


@pytest.fixture(scope="module", params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Root:
    if request.param == "local":
        return Root("local", tmp_path_factory.mktemp("cluster-root") / "ledgers", {})
    s3_server = request.getfixturevalue("s3_server")
    return Root("s3", f"s3://{BUCKET}/cluster-{uuid.uuid4().hex[:12]}", s3_server.daemon_conf())


@pytest.fixture(scope="module")
def members(launch: Launcher, root: Root) -> Iterator[list[DaemonProcess]]:
    with running([member(launch, root, "a"), member(launch, root, "b")]) as daemons:
        yield daemons


@pytest.fixture(scope="module")
def topics(kafka: Kafka, members: list[DaemonProcess]) -> list[str]:
    names = [kafka.topic(prefix="cl") for _ in range(TOPICS)]
    for n, topic in enumerate(names):
        kafka.produce(topic, [(f"k{i % 5}".encode(), f"v{n}-{i}".encode()) for i in range(40)])
    return names


def test_each_topic_is_owned_by_one_member_and_compacted_there_whichever_member_is_asked(
        members: list[DaemonProcess], topics: list[str]) -> None:
    a, b = members
    models.Cluster.model_validate(cluster_of(a))  # the document's model, every key of it
    assert {m["url"] for m in cluster_of(a)["members"]} == {a.url, b.url}
    assert cluster_of(a)["members"] == cluster_of(b)["members"]
    for n, topic in enumerate(topics):
        owner = by_url(members, owner_url(a, topic))
        other = b if owner is a else a
        asked = other if n % 2 == 0 else owner  # half through the member that does not own the topic
        answer = asked.client().put(f"/v1/topics/{topic}/compaction")
        assert answer.status_code == 202, answer.text
        assert wait_state(owner, topic, "Succeed", "Failed")["state"] == "Succeed"
        # The run is the owner's: the other member has no task of it.
        assert owner.client().get("/v1/tasks", params={"topic": topic}).json()["tasks"] != []
        assert other.client().get("/v1/tasks", params={"topic": topic}).json()["tasks"] == []
        assert topic in cluster_of(owner)["owned_topics"] and topic not in cluster_of(other)["owned_topics"]
        # Every member serves the same view: one record per key, the last of each.
        assert view(a, topic) == view(b, topic)
        assert len(view(a, topic)) == 5


def test_the_coordination_topic_is_never_listed_or_compacted(root: Root, members: list[DaemonProcess]) -> None:
    listing = members[0].client().get("/v1/topics", params={"limit": 1000})
    assert listing.status_code == 200, listing.text
    names = {t["topic"] for t in listing.json()["topics"]}
    assert names and coordination_topic(root.cluster) not in names
    # Each topic's owner, as every member lists it.
    for row in listing.json()["topics"]:
        assert row["owner"] == owner_url(members[0], row["topic"]), row


def test_a_daemon_that_is_not_the_cluster_s_refuses_its_root(launch: Launcher, root: Root,
                                                             members: list[DaemonProcess]) -> None:
    for name, conf in (("single", {}), ("other", {"clusterName": "another"})):
        stranger = launch.prepare(f"{root.kind}-{name}", root=root.location, **conf, **root.conf).start()
        assert stranger.wait_exit(STOP_TIMEOUT_S) == 2, stranger.log_tail()
        assert "ledger root" in stranger.log_text() and root.cluster in stranger.log_text(), stranger.log_tail()


def test_a_member_killed_hands_its_topics_to_the_survivor_whose_compactions_succeed(
        kafka: Kafka, members: list[DaemonProcess], topics: list[str]) -> None:
    a, b = members
    b_topics = [t for t in topics if owner_url(a, t) == b.url]
    assert b_topics, "the partitions are split: b owns some of the topics"
    before = {t: view(a, t) for t in topics}
    b.kill_group()  # SIGKILL: no leave, the group waits out b's session
    b.process.wait(10)  # type: ignore[union-attr]
    wait_for(lambda: settled([a]), timeout=REBALANCE_TIMEOUT_S, what="the survivor holds every partition")
    assert {t: view(a, t) for t in topics} == before  # the view changed only by a committed switch: not at all
    for topic in b_topics:
        kafka.produce(topic, [(b"k-new", b"after the failover")])
        answer = a.client().put(f"/v1/topics/{topic}/compaction")
        assert answer.status_code == 202, answer.text
        assert wait_state(a, topic, "Succeed", "Failed")["state"] == "Succeed"
        assert "k-new" in {e[2] for e in view(a, topic)}
    # b comes back as an ordinary member, and the partitions are shared again.
    b.start().wait_ready()
    wait_for(lambda: settled(members), timeout=REBALANCE_TIMEOUT_S, what="b rejoined")


def test_a_member_stopped_hands_its_topics_over_and_reads_go_on(members: list[DaemonProcess],
                                                                topics: list[str]) -> None:
    a, b = members
    wait_for(lambda: settled(members), timeout=REBALANCE_TIMEOUT_S, what="two members")
    before = {t: view(b, t) for t in topics}
    assert a.stop() == 0  # SIGTERM: a leaves the group, and b takes its partitions at once
    wait_for(lambda: settled([b]), timeout=REBALANCE_TIMEOUT_S, what="b holds every partition")
    assert {t: view(b, t) for t in topics} == before
    for topic in topics:
        answer = b.client().put(f"/v1/topics/{topic}/compaction")
        assert answer.status_code == 202, answer.text
        assert wait_state(b, topic, "Succeed", "Failed")["state"] == "Succeed"
