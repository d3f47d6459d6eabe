"""The periodic sweep in a running daemon on an S3 root: a ledger no pointer names is removed once older than
``storageSweepMinAgeSeconds``, by a pass of the daemon's own timer; the current ledger and its reads stay."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from compactord.ledger.pointer import read_pointer
from tests.daemon.conftest import metric
from tests.support.daemon import compact
from tests.support.s3_server import BUCKET

SWEEP_S = 60  # the shortest interval and margin the keys allow
WAIT_S = 5 * SWEEP_S  # the orphan is past the margin at the second pass at the latest


@pytest.mark.slow
def test_the_periodic_sweep_removes_an_old_orphan_of_an_s3_root(launch: Any, kafka: Any, s3_server: Any) -> None:
    prefix = f"daemon-sweep-{uuid.uuid4().hex[:12]}"
    daemon = launch("s3-sweep", root=f"s3://{BUCKET}/{prefix}",  # type: ignore[arg-type]
                    **s3_server.daemon_conf(storageSweepIntervalSeconds=str(SWEEP_S),
                                            storageSweepMinAgeSeconds=str(SWEEP_S)))
    topic = kafka.topic(prefix="sweep")
    kafka.produce(topic, [(f"k{i % 10}", f"v{i}") for i in range(50)])
    compact(daemon, topic)
    store = s3_server.store(prefix)
    current = read_pointer(store, topic).ledger
    assert current is not None
    orphan = f"{topic}/ledger-{current + 5}/part-00000-dead.parquet"  # a run that died before its switch
    store.put(orphan, b"a part of a run that died")
    kept = sorted(info.key for info in store.list(f"{topic}/") if info.key != orphan)

    deadline = time.monotonic() + WAIT_S
    while not metric(daemon, "compactord_swept_objects_total") and time.monotonic() < deadline:
        time.sleep(1)
    assert metric(daemon, "compactord_swept_objects_total") == 1, daemon.log_tail()
    assert metric(daemon, "compactord_swept_bytes_total") == len(b"a part of a run that died")
    assert store.head(orphan) is None
    assert sorted(info.key for info in store.list(f"{topic}/")) == kept
    assert f"sweeping orphan {topic}/ledger-{current + 5}/" in daemon.log_text()
    page = daemon.http.get(f"/v1/topics/{topic}/compacted", params={"partition": 0, "limit": 100})
    assert page.status_code == 200 and len(page.json()["entries"]) == 10, page.text
