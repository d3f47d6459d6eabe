"""The sweeps of a running daemon: on an S3 root, a ledger no pointer names is removed once older than
``storageSweepMinAgeSeconds``, by a pass of the daemon's own timer, the current ledger and its reads staying; every
ledger that switches replaced within one ``compactionRetiredLedgerGraceSeconds`` goes after its own ``until``, with
nothing but the daemon's timer to remove it (that timer is the topic's service's, the same on every root: this S3
daemon shows it; tests/unit/ledger/test_retired_reads.py shows it on a local root)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from compactord.ledger.layout import ledger_dir_name
from compactord.ledger.pointer import read_pointer
from compactord.storage import ObjectStore
from tests.support.daemon import DaemonProcess, compact, metric
from tests.support.s3_server import BUCKET
from tests.support.waiting import wait_for

S3_PREFIX = f"daemon-sweep-{uuid.uuid4().hex[:12]}"  # the S3 daemon's root, in the session's bucket
# The sweep of the S3 daemon: a pass every 2 s, of what is older than 3 s; keys below their recommended minimum
# (60 s), set as an operator would, each logged as a warning at start.
SWEEP_INTERVAL_S = 2
SWEEP_MIN_AGE_S = 3
# A pass is due every 2 s, the orphan past its margin 3 s after its put: the bound is for a loaded machine only.
SWEPT_ORPHAN_BOUND_S = 120
# Long enough for two compactions of a small topic on a loaded machine to retire two ledgers within one grace.
GRACE_S = 20
# After the last until: the sweep is due at once; the bound is for a loaded machine only.
SWEPT_BOUND_S = GRACE_S + 60


@pytest.fixture(scope="module")
def sweep_daemon(launch: Any, s3_server: Any) -> DaemonProcess:
    """One daemon on a fresh S3 root, with the short sweep and a grace of ``GRACE_S`` (the S3 tests' topics are
    their own: a periodic pass never removes what a pointer names, retired ledgers included)."""
    daemon: DaemonProcess = launch(
        "s3-sweep", root=f"s3://{BUCKET}/{S3_PREFIX}",
        **s3_server.daemon_conf(storageSweepIntervalSeconds=str(SWEEP_INTERVAL_S),
                                storageSweepMinAgeSeconds=str(SWEEP_MIN_AGE_S),
                                compactionRetiredLedgerGraceSeconds=str(GRACE_S)))
    return daemon


@pytest.mark.slow
def test_the_periodic_sweep_removes_an_old_orphan_of_an_s3_root(sweep_daemon: DaemonProcess, kafka: Any,
                                                                 s3_server: Any) -> None:
    daemon = sweep_daemon
    for key, value in (("storageSweepIntervalSeconds", SWEEP_INTERVAL_S), ("storageSweepMinAgeSeconds",
                                                                           SWEEP_MIN_AGE_S)):
        assert f"{key}={value} is below the recommended minimum 60" in daemon.log_text(), daemon.log_tail()
    swept_before = metric(daemon, "compactord_swept_objects_total") or 0.0
    bytes_before = metric(daemon, "compactord_swept_bytes_total") or 0.0
    topic = kafka.topic(prefix="sweep")
    kafka.produce(topic, [(f"k{i % 10}", f"v{i}") for i in range(50)])
    compact(daemon, topic)
    store = s3_server.store(S3_PREFIX)
    current = read_pointer(store, topic).ledger
    assert current is not None
    orphan = f"{topic}/ledger-{current + 5}/part-00000-dead.parquet"  # a run that died before its switch
    store.put(orphan, b"a part of a run that died")
    kept = sorted(info.key for info in store.list(f"{topic}/") if info.key != orphan)

    wait_for(lambda: (metric(daemon, "compactord_swept_objects_total") or 0.0) > swept_before,
             SWEPT_ORPHAN_BOUND_S, f"a periodic sweep to remove {orphan}", daemon, interval=0.5)
    assert metric(daemon, "compactord_swept_objects_total") == swept_before + 1, daemon.log_tail()
    assert metric(daemon, "compactord_swept_bytes_total") == bytes_before + len(b"a part of a run that died")
    assert store.head(orphan) is None
    assert sorted(info.key for info in store.list(f"{topic}/")) == kept
    assert f"sweeping orphan {topic}/ledger-{current + 5}/" in daemon.log_text()
    page = daemon.http.get(f"/v1/topics/{topic}/compacted", params={"partition": 0, "limit": 100})
    assert page.status_code == 200 and len(page.json()["entries"]) == 10, page.text


def retire_two_within_one_grace(daemon: DaemonProcess, kafka: Any, objects: ObjectStore) -> tuple[str, list[int]]:
    """Compact a topic until its pointer lists two retired ledgers (switches within one grace); return the topic
    and those ledgers. Nothing reads the topic afterwards: only the daemon's own timer can sweep them."""
    topic = kafka.topic(prefix="retired")
    for round_ in range(6):  # three compactions suffice unless one takes longer than the grace
        kafka.produce(topic, [(f"k{i % 5}", f"r{round_}-{i}") for i in range(20)])
        compact(daemon, topic)
        retired = read_pointer(objects, topic).retired
        if len(retired) >= 2:
            assert len({r.until for r in retired}) == len(retired), retired  # each due at its own time
            return topic, [r.id for r in retired]
        time.sleep(1.1)  # the next switch's until (whole seconds) a second later: not swept with this one
    pytest.fail(f"no two ledgers retired within one grace of {GRACE_S}s in six compactions\n{daemon.log_tail()}")


def wait_retired_swept(daemon: DaemonProcess, objects: ObjectStore, topic: str, retired: list[int]) -> None:
    until = max(r.until for r in read_pointer(objects, topic).retired)

    def swept() -> bool:
        left = [r.id for r in read_pointer(objects, topic).retired]
        files = [i for i in retired if objects.list(f"{topic}/{ledger_dir_name(i)}/")]
        return not left and not files

    wait_for(swept, max(0.0, until - time.time()) + SWEPT_BOUND_S,
             f"retired ledgers {retired} of topic {topic} off the pointer and deleted", daemon, interval=0.5)
    current = read_pointer(objects, topic).ledger
    assert current is not None and current not in retired
    assert objects.list(f"{topic}/{ledger_dir_name(current)}/")
    page = daemon.http.get(f"/v1/topics/{topic}/compacted", params={"partition": 0, "limit": 100})
    assert page.status_code == 200 and len(page.json()["entries"]) == 5, page.text


@pytest.mark.slow
def test_every_ledger_retired_within_one_grace_is_deleted_on_an_s3_root(sweep_daemon: DaemonProcess, kafka: Any,
                                                                       s3_server: Any) -> None:
    objects = s3_server.store(S3_PREFIX)
    topic, retired = retire_two_within_one_grace(sweep_daemon, kafka, objects)
    wait_retired_swept(sweep_daemon, objects, topic, retired)
