"""The Iceberg table of a cluster's topic: two real daemons (``clusterName``) on one s3:// root, publishing to the
test S3 server's own Iceberg REST catalog (the same URI and token), in a namespace of their own. Only the topic's
owner commits its table, whichever member is asked to compact it; a member stopped hands the topic over, and the
survivor (the table caught up when it took the topic) commits the next ledger, the earlier snapshot still read.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog.rest import RestCatalog

from compactord.iceberg.table import snapshot_of
from tests.conftest import Kafka
from tests.support.cluster import Root, by_url, member, owner_url, running, settled
from tests.support.daemon import DaemonProcess, compact, wait_state
from tests.support.iceberg import PARTITIONS, committed, ledger_id, table_rows, view_rows
from tests.support.s3_server import ACCESS_KEY, BUCKET, REGION, SECRET_KEY
from tests.support.timeouts import REBALANCE_TIMEOUT_S
from tests.support.waiting import wait_for

from .conftest import Launcher

COMMITTED = "committed to Iceberg table"


@pytest.fixture()
def catalog(s3_server: Any) -> RestCatalog:
    """The REST catalog as a reader elsewhere opens it: its OAuth2 credential, the tables' files on the server."""
    return RestCatalog("reader", uri=s3_server.iceberg_uri, credential=f"{ACCESS_KEY}:{SECRET_KEY}", **{
        "s3.endpoint": s3_server.endpoint, "s3.region": REGION, "s3.access-key-id": ACCESS_KEY,
        "s3.secret-access-key": SECRET_KEY, "s3.force-virtual-addressing": "false"})


def _commits(daemon: DaemonProcess, topic: str) -> list[str]:
    return [line for line in daemon.log_text().splitlines() if f"topic {topic}: " in line and COMMITTED in line]


def test_only_the_owner_commits_and_the_survivor_of_a_stop_commits_next(
        launch: Launcher, s3_server: Any, catalog: RestCatalog, kafka: Kafka, tmp_path: Path) -> None:
    token = tmp_path / "catalog-token"
    token.write_text(s3_server.iceberg_token() + "\n")
    namespace = f"cl_{uuid.uuid4().hex[:8]}"  # the cluster's tables only: no other daemon's catch-up drops them
    root = Root("s3", f"s3://{BUCKET}/iceberg-cluster-{uuid.uuid4().hex[:12]}", s3_server.daemon_conf())
    iceberg = {"icebergCatalogUri": s3_server.iceberg_uri, "icebergCatalogToken": f"file:{token}",
               "icebergNamespace": namespace}
    with running([member(launch, root, "a", **iceberg), member(launch, root, "b", **iceberg)]) as members:
        a, b = members
        topic = kafka.topic(partitions=PARTITIONS, prefix="icecl")
        kafka.produce(topic, [(f"k{i}", f"a{i}", i % PARTITIONS) for i in range(20)])
        owner = by_url(members, owner_url(a, topic))
        other = b if owner is a else a

        # Compacted through the member that does not own the topic: the owner runs it, and only it commits.
        answer = other.http.put(f"/v1/topics/{topic}/compaction")
        assert answer.status_code == 202, answer.text
        assert wait_state(owner, topic, "Succeed", "Failed")["state"] == "Succeed"
        first = ledger_id(owner, topic)
        first_view = view_rows(owner, topic)
        table = committed(owner, catalog, topic, namespace)  # lag 0 on the owner, the table at its ledger
        assert table_rows(table.scan().to_arrow()) == first_view
        assert [f"ledger {first} {COMMITTED}" in line for line in _commits(owner, topic)] == [True]
        assert _commits(other, topic) == []

        # The owner stopped: the survivor takes the topic, and its next switch is committed by it.
        assert owner.stop() == 0
        wait_for(lambda: settled([other]), timeout=REBALANCE_TIMEOUT_S, what="the survivor holds every partition")
        kafka.produce(topic, [("k1", None, 1), ("k2", "b2", 0), ("k21", "b21", 1)])
        compact(other, topic)
        second = ledger_id(other, topic)
        assert second != first
        table = committed(other, catalog, topic, namespace)
        assert table_rows(table.scan().to_arrow()) == view_rows(other, topic)
        assert [f"ledger {second} {COMMITTED}" in line for line in _commits(other, topic)] == [True]
        previous = snapshot_of(table, first)
        assert previous is not None
        assert table_rows(table.scan(snapshot_id=previous.snapshot_id).to_arrow()) == first_view
        assert b"k1" in {key for _, _, key, _ in first_view} - {key for _, _, key, _ in view_rows(other, topic)}
