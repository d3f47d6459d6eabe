"""The periodic sweep of a ledger root in use (``daemon/sweeper.py``), on a local root and on S3: it removes a
topic's ledgers that no pointer names once older than the margin, keeps the current, the retired and the young
ones, never touches a topic whose task runs, and aborts the topic's old unfinished uploads."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from compactord.daemon.metrics import Metrics
from compactord.daemon.scheduler import TaskRegistry
from compactord.daemon.sweeper import StorageSweeper
from compactord.storage import ObjectInfo, ObjectStore
from compactord.task import CompactionTaskCtx, TaskState
from tests.support.probes import Hold
from tests.support.s3_server import ACCESS_KEY, BUCKET, REGION, SECRET_KEY
from tests.support.service import compact, last_value_model, view
from tests.support.timeouts import TASK_TIMEOUT_S


@pytest.fixture(params=["local", "s3"])
def root_factory(request: pytest.FixtureRequest, make_factory: Any) -> Any:
    """``root_factory(**overrides)``: ``make_factory`` on a fresh local root, or a fresh prefix of the S3 server."""
    if request.param == "local":
        return make_factory
    s3_server = request.getfixturevalue("s3_server")

    def make(**overrides: Any) -> Any:
        return make_factory(root=f"s3://{BUCKET}/sweep-{uuid.uuid4().hex[:12]}", s3_region=REGION,
                            s3_endpoint=s3_server.endpoint, s3_access_key_id=ACCESS_KEY,
                            s3_secret_access_key=SECRET_KEY, **overrides)

    return make


def _sweeper(factory: Any) -> tuple[StorageSweeper, Metrics]:
    metrics = Metrics()
    registry = TaskRegistry(factory, max_concurrent=1, monitor_interval_s=60)
    return StorageSweeper(factory.settings, factory.store, registry, metrics), metrics


def _orphan(factory: Any, topic: str) -> tuple[int, str]:
    """A ledger of a run that died before it was sealed: an id allocated, one part written."""
    ledger_id, _ = factory.store.allocate_ledger(topic)
    key = f"{factory.store.ledger_key(topic, ledger_id)}/part-00000-dead.parquet"
    factory.store.objects.put(key, b"a part of a run that died")
    return ledger_id, key


def _written_after(objects: ObjectStore, key: str, data: bytes, after: float) -> ObjectInfo:
    """Write ``key`` until the store dates it later than ``after`` (S3 dates to the second)."""
    while True:
        objects.put(key, data)
        info = objects.head(key)
        assert info is not None
        if info.modified > after:
            return info
        time.sleep(0.2)


def test_old_unreferenced_ledgers_go_and_the_current_retired_and_young_ones_stay(kafka, root_factory):
    factory = root_factory(compaction_retired_ledger_grace_seconds=600)
    store, objects = factory.store, factory.store.objects
    topic = kafka.topic(partitions=1, prefix="sweep")
    service = factory.new_topic_compaction_service(topic)
    first_records = [(f"k{i % 10}", f"a{i}") for i in range(50)]
    kafka.produce(topic, first_records)
    retired = compact(service).ledger_id
    second_records = [(f"k{i % 15}", f"b{i}") for i in range(30)]
    kafka.produce(topic, second_records)
    current = compact(service).ledger_id
    assert [r.id for r in store.pointer(topic).retired] == [retired]

    old_id, old_key = _orphan(factory, topic)
    old = objects.head(old_key)
    assert old is not None
    young_id, _ = store.allocate_ledger(topic)
    young = _written_after(objects, f"{store.ledger_key(topic, young_id)}/part-00000-new.parquet", b"young",
                           old.modified)

    sweeper, metrics = _sweeper(factory)
    margin = factory.settings.storage_sweep_min_age_seconds
    swept = sweeper.run_once(now=young.modified + margin)  # the old orphan is past the margin, the young not

    assert list(swept) == [topic]
    assert swept[topic].keys == [f"{store.ledger_key(topic, old_id)}/"]
    assert (swept[topic].objects, swept[topic].bytes) == (1, old.size)
    assert store.ledger_ids(topic) == sorted([retired, current, young_id])
    store.verify(topic, current)
    store.verify(topic, retired)
    assert view(service) == last_value_model(first_records + second_records)
    assert metrics.registry.get_sample_value("compactord_swept_objects_total") == 1
    assert metrics.registry.get_sample_value("compactord_swept_bytes_total") == old.size
    assert metrics.registry.get_sample_value("compactord_sweeps_total", {"result": "ok"}) == 1

    # Once the young one is past the margin too, it goes; the current and the retired ledgers still stay.
    swept = sweeper.run_once(now=time.time() + margin + 60)
    assert swept[topic].keys == [f"{store.ledger_key(topic, young_id)}/"]
    assert store.ledger_ids(topic) == sorted([retired, current])
    assert sweeper.run_once(now=time.time() + margin + 60) == {}  # nothing left to sweep


class _HoldTopic(Hold):
    """``Hold`` for the tasks of one topic only."""

    def __init__(self, topic: str, point: str) -> None:
        super().__init__(point)
        self.topic = topic

    def at_checkpoint(self, task: CompactionTaskCtx, point: str) -> None:
        if task.topic == self.topic:
            super().at_checkpoint(task, point)


def test_a_topic_whose_task_runs_is_not_swept_while_the_others_are(kafka, root_factory):
    busy, idle = kafka.topic(partitions=1, prefix="busy"), kafka.topic(partitions=1, prefix="idle")
    hold = _HoldTopic(busy, "written")  # the task's ledger is written and sealed, not yet current
    factory = root_factory(probe=hold)
    store = factory.store
    records = [(f"k{i % 10}", f"v{i}") for i in range(40)]
    kafka.produce(busy, records)
    kafka.produce(idle, records)
    compact(factory.new_topic_compaction_service(idle))
    idle_orphan, _ = _orphan(factory, idle)
    busy_orphan, _ = _orphan(factory, busy)  # below the id the task allocates: only the guard keeps it

    task = factory.new_topic_compaction_service(busy).compact()
    try:
        assert hold.reached.wait(TASK_TIMEOUT_S), f"the task never wrote its ledger: {task.state}"
        writing = max(store.ledger_ids(busy))
        assert writing > busy_orphan
        sweeper, _ = _sweeper(factory)
        swept = sweeper.run_once(now=time.time() + 10**6)  # every object is past the margin
        assert list(swept) == [idle] and swept[idle].keys == [f"{store.ledger_key(idle, idle_orphan)}/"]
        assert store.ledger_ids(busy) == [busy_orphan, writing]
    finally:
        hold.release()
    assert task.wait(TASK_TIMEOUT_S) and task.state is TaskState.SUCCEED, task.error
    assert store.current_ledger_id(busy) == writing
    assert task.worker_done.wait(TASK_TIMEOUT_S)
    swept = sweeper.run_once(now=time.time() + 10**6)  # the task has ended: its topic is swept again
    assert swept[busy].keys == [f"{store.ledger_key(busy, busy_orphan)}/"]
    assert store.ledger_ids(busy) == [writing]


def test_old_unfinished_uploads_of_the_topic_are_aborted(make_factory, s3_server):
    import boto3

    root = f"sweep-{uuid.uuid4().hex[:12]}"
    factory = make_factory(root=f"s3://{BUCKET}/{root}", s3_region=REGION, s3_endpoint=s3_server.endpoint,
                           s3_access_key_id=ACCESS_KEY, s3_secret_access_key=SECRET_KEY)
    client = boto3.client("s3", endpoint_url=s3_server.endpoint, region_name=REGION,
                          aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
    topic, other = f"uploads-{uuid.uuid4().hex[:8]}", f"other-{uuid.uuid4().hex[:8]}"

    def upload(key: str) -> dict[str, Any]:
        upload_id = client.create_multipart_upload(Bucket=BUCKET, Key=f"{root}/{key}")["UploadId"]
        found = client.list_multipart_uploads(Bucket=BUCKET, Prefix=f"{root}/{key}")["Uploads"]
        return next(u for u in found if u["UploadId"] == upload_id)

    def uploads() -> set[str]:
        found = client.list_multipart_uploads(Bucket=BUCKET, Prefix=f"{root}/").get("Uploads", [])
        return {u["Key"][len(root) + 1:] for u in found}

    old = upload(f"{topic}/ledger-90/part-00000-old.parquet")
    other_old = upload(f"{other}/ledger-90/part-00000-old.parquet")
    while True:  # the server dates an upload to the second: the young one must be dated later
        young = upload(f"{topic}/ledger-91/part-00000-young.parquet")
        if young["Initiated"] > max(old["Initiated"], other_old["Initiated"]):
            break
        client.abort_multipart_upload(Bucket=BUCKET, Key=young["Key"], UploadId=young["UploadId"])
        time.sleep(0.2)

    sweeper, metrics = _sweeper(factory)
    older_than = young["Initiated"].timestamp()
    swept = sweeper.sweep_topic(topic, older_than)
    assert swept is not None and swept.uploads == 1
    assert uploads() == {f"{topic}/ledger-91/part-00000-young.parquet", f"{other}/ledger-90/part-00000-old.parquet"}
    assert metrics.registry.get_sample_value("compactord_swept_uploads_total") == 1
    assert factory.store.objects.abort_uploads(f"{other}/", older_than) == 1
    assert uploads() == {f"{topic}/ledger-91/part-00000-young.parquet"}
