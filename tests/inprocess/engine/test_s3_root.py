"""A ledger root on S3 (``s3://BUCKET/PREFIX`` on the session's SeaweedFS): the driver and Spark's Python tasks
both reach it through the store, with no local folder of the root anywhere; the tasks get the root's keys over
the run's channel.
The local-root suites' end-to-end behaviours on an S3 root: test_s3_e2e.py."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from compactord.ledger.layout import CURRENT, MANIFEST
from compactord.storage.s3 import S3Store
from tests.support.s3_server import BUCKET, s3_factory
from tests.support.service import compact, entries, last_value_model, pinned, view


def _first_value_model(records: list[tuple[Any, ...]]) -> dict[bytes, bytes]:
    """Reference: each key's first value after its last deletion."""
    model: dict[bytes, bytes] = {}
    for key, value, *_ in records:
        if value is None:
            model.pop(key.encode(), None)
        else:
            model.setdefault(key.encode(), value.encode())
    return model


def _spooled() -> set[str]:
    """The temporary part files of tasks on this host's local disk (``parts.write_part``)."""
    return {p.name for p in Path(tempfile.gettempdir()).glob("compactord-part-*")}


def test_compactions_and_reads_on_an_s3_root(kafka, make_factory, s3_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a root taken for a local path would appear here (``s3:/...``)
    spooled_before = _spooled()
    topic = kafka.topic(partitions=2)
    first = [(f"k{i % 20}", None if i % 13 == 5 else f"v{i}", (i % 20) % 2) for i in range(120)]
    kafka.produce(topic, first)
    factory = s3_factory(make_factory, s3_server, compaction_retired_ledger_grace_seconds=600)
    objects = factory.store.objects
    assert isinstance(objects, S3Store)
    service = factory.new_topic_compaction_service(topic)

    full = compact(service)  # final reads: each reading task writes its part to the bucket
    assert full.stats.full_rebuild is True
    # The reading tasks report their requests: a part's upload each (the driver's store has no observer here).
    assert full.stats.storage_requests.snapshot().get("put_file", 0) == 2, full.stats.storage_requests
    assert view(service, 2) == last_value_model(first)

    second = [(f"k{i % 30}", f"w{i}", (i % 30) % 2) for i in range(40)]
    kafka.produce(topic, second)
    incremental = compact(service)  # the tasks merge the previous ledger's row groups, read from the bucket
    assert incremental.stats.full_rebuild is False and incremental.ledger_id > full.ledger_id
    model = last_value_model(first + second)
    assert view(service, 2) == model
    # The replaced ledger stays readable, pinned, until its grace ends; the current one's last entries.
    old = {e.key: e.value for p in (0, 1) for e in pinned(service, p, full.ledger_id)}
    assert old == last_value_model(first)
    for p in (0, 1):
        last = service.read_last_compacted_page(p).entries
        assert last and last[-1].offset == max(e.offset for e in entries(service, p))

    keys = [info.key for info in objects.list(f"{topic}/")]
    assert f"{topic}/{CURRENT}" in keys
    for ledger_id in (full.ledger_id, incremental.ledger_id):
        assert f"{topic}/ledger-{ledger_id}/{MANIFEST}" in keys
        manifest = factory.store.verify(topic, ledger_id)  # every part's size and checksum, in the bucket
        assert all(f"{topic}/ledger-{ledger_id}/{f['name']}" in keys for f in manifest.files)
    assert not [k for k in keys if k.rpartition("/")[2].startswith(".")], "a seal was left in the ledger"

    # The grouping job (first-value is no order): its Python tasks read and write the ledgers in the bucket.
    factory.set_topic_strategy(topic, "first-value")
    grouped = compact(service)
    assert grouped.stats.full_rebuild is True
    assert view(service, 2) == _first_value_model(first + second)
    manifest = factory.store.verify(topic, grouped.ledger_id)
    assert manifest.files and all(f["name"].endswith("-grouped.snappy.parquet") for f in manifest.files)

    assert not (tmp_path / "s3:").exists() and not Path(BUCKET).exists()
    assert _spooled() == spooled_before, "a task left its temporary part on the local disk"

