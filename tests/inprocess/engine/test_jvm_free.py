"""Every ledger byte is read and written in Python: with the JVM's Hadoop file system unable to open a local
file, every path of a compaction (each strategy, the grouping job past the final-read bounds, retained
null keys, an incremental run over the previous ledger), the exact preview and the session's warm-up still
work and give the results they give with it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from compactord.engine import job
from compactord.engine.preview import kept_digest
from compactord.model import RECORD_SCHEMA
from tests.support.service import compact, entries, last_value_model, succeeded, view

# A Hadoop FileSystem class that does not exist: the JVM's every open of a file: path fails on it.
_NO_FILE_SYSTEM = "compactord.tests.NoLocalFileSystem"
_KEYS = ("fs.file.impl", "fs.file.impl.disable.cache")


@pytest.fixture
def jvm_without_files(spark_manager: Any, tmp_path: Path) -> Iterator[None]:
    """The live session's JVM unable to reach local files (its Hadoop configuration names a file system
    class that does not exist, its cache of file systems bypassed), restored afterwards."""
    spark = spark_manager.spark
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    saved = {key: conf.get(key) for key in _KEYS}
    probe = tmp_path / "probe.parquet"
    pq.write_table(RECORD_SCHEMA.empty_table(), probe)
    assert spark.read.parquet(str(probe)).count() == 0  # the JVM reads a local file before
    conf.set("fs.file.impl", _NO_FILE_SYSTEM)
    conf.set("fs.file.impl.disable.cache", "true")
    try:
        with pytest.raises(Exception, match="NoLocalFileSystem"):
            spark.read.parquet(str(probe)).count()
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                conf.unset(key)
            else:
                conf.set(key, value)
        assert spark.read.parquet(str(probe)).count() == 0


@pytest.fixture
def grouping(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every partition past the final-read bounds: each run groups its rows in Spark (``job.build_winners``)."""
    monkeypatch.setattr(job, "FINAL_READ_MAX_RECORDS", 0)
    monkeypatch.setattr(job, "FINAL_SPILLING_READ_MAX_RECORDS", 0)


def _et(value: int) -> list[tuple[str, bytes]]:
    return [("et", str(value).encode())]


# (key, value, partition, timestamp, headers): two runs, the second over the first one's ledger.
_FIRST = [("a", "1", 0, None, _et(5)), ("a", "22", 0, None, _et(3)), ("b", "x", 0, None, _et(1)),
          ("b", None, 0, None, _et(2)), ("c", "333", 0, None, _et(1)), ("d", "4", 1, None, _et(9)),
          ("d", "55", 1, None, _et(8))]
_SECOND = [("a", "9", 0, None, _et(4)), ("b", "y", 0, None, _et(3)), ("c", "4444", 0, None, _et(0)),
           ("d", None, 1, None, _et(10)), ("e", "e1", 1, None, _et(1))]
_PLUGIN_ORDER = "tests.support.plugins.listed:ListedOrder"  # an ordered plug-in (publishing order)
_PLUGIN_FOLD = "tests.inprocess.engine.strategies:LongestValue"  # a general plug-in (folded in Python)
# The view after each run, as the strategies define it.
_EXPECTED = {
    "publishing-order": ({"a": "22", "c": "333", "d": "55"}, {"a": "9", "b": "y", "c": "4444", "e": "e1"}),
    "event-time": ({"a": "1", "c": "333", "d": "4"}, {"a": "1", "b": "y", "c": "333", "e": "e1"}),
    "first-value": ({"a": "1", "c": "333", "d": "4"}, {"a": "1", "b": "y", "c": "333", "e": "e1"}),
    _PLUGIN_ORDER: ({"a": "22", "c": "333", "d": "55"}, {"a": "9", "b": "y", "c": "4444", "e": "e1"}),
    _PLUGIN_FOLD: ({"a": "22", "c": "333", "d": "55"}, {"a": "22", "b": "y", "c": "4444", "e": "e1"}),
}


def _bytes(view_: dict[str, str]) -> dict[bytes, bytes]:
    return {k.encode(): v.encode() for k, v in view_.items()}


def _part_names(service: Any) -> list[str]:
    return [f["name"] for f in service.ledger_info().files]


@pytest.mark.parametrize("strategy", list(_EXPECTED))
def test_every_strategy_groups_and_merges_its_ledger_without_the_jvm_s_files(
        kafka, make_factory, jvm_without_files, grouping, strategy):
    topic = kafka.topic(partitions=2)
    kafka.produce(topic, _FIRST)
    factory = make_factory(compaction_strategy=strategy, compaction_event_time_source="header:et")
    service = factory.new_topic_compaction_service(topic)
    compact(service)
    assert view(service, 2) == _bytes(_EXPECTED[strategy][0])
    # The grouping job's Python writer wrote the ledger: one part per non-empty Spark partition.
    assert _part_names(service) and all(n.endswith("-grouped.snappy.parquet") for n in _part_names(service))
    kafka.produce(topic, _SECOND)
    ctx = compact(service)
    assert ctx.stats.full_rebuild is False  # the previous ledger was read, by Python tasks
    assert view(service, 2) == _bytes(_EXPECTED[strategy][1])
    # d's deletion, kept as a marker by every strategy but the general plug-in (a fold drops a deletion)
    assert service.ledger_info().markers == (0 if strategy == _PLUGIN_FOLD else 1)


def test_final_reads_and_an_incremental_grouping_run_agree(kafka, make_factory, jvm_without_files, monkeypatch):
    """A first run by final reads (the reading tasks write their parts), a second past the bounds: the
    grouping job reads the reading tasks' parts."""
    topic = kafka.topic(partitions=2)
    kafka.produce(topic, _FIRST)
    service = make_factory().new_topic_compaction_service(topic)
    compact(service)
    assert not any(n.endswith("-grouped.snappy.parquet") for n in _part_names(service))
    kafka.produce(topic, _SECOND)
    monkeypatch.setattr(job, "FINAL_READ_MAX_RECORDS", 0)
    assert compact(service).stats.full_rebuild is False
    assert view(service, 2) == _bytes(_EXPECTED["publishing-order"][1])
    assert all(n.endswith("-grouped.snappy.parquet") for n in _part_names(service))


def test_the_grouping_job_s_files_sort_as_their_rows(kafka, make_factory, jvm_without_files, grouping, monkeypatch):
    """Several output files (a few rows each): read in their names' order, the ledger's rows are in
    (partition, offset) order, which the read API's bisection relies on."""
    monkeypatch.setattr(job, "ROWS_PER_SHUFFLE_PARTITION", 40)
    topic = kafka.topic(partitions=3)
    records = [(f"k{i}", f"v{i}", i % 3) for i in range(150)] + [(f"k{i}", None, i % 3) for i in range(0, 150, 7)]
    kafka.produce(topic, records)
    factory = make_factory()
    service = factory.new_topic_compaction_service(topic)
    compact(service)
    manifest = service.ledger_info()
    names = [f["name"] for f in manifest.files]
    assert len(names) > 1 and names == sorted(names)
    folder = factory.store.ledger_path(topic, manifest.ledger_id)
    rows = [(p, o) for name in names for p, o in zip(*pq.read_table(folder / name, columns=["partition", "offset"])
                                                      .to_pydict().values(), strict=True)]
    deleted = len(range(0, 150, 7))  # each a marker in the ledger
    assert rows == sorted(rows) and len(rows) == manifest.records_kept + manifest.markers == 150
    assert manifest.markers == deleted
    assert view(service, 3) == last_value_model(records)


def test_retained_null_keys_stay_in_place_without_the_jvm_s_files(kafka, make_factory, jvm_without_files, grouping):
    topic = kafka.topic()
    kafka.produce(topic, [("a", "1"), (None, "n1"), ("a", "2"), (None, "n2")])
    service = make_factory(topic_compaction_retain_null_key=True).new_topic_compaction_service(topic)
    compact(service)
    kafka.produce(topic, [(None, "n3"), ("a", "3")])
    assert compact(service).stats.full_rebuild is False
    assert [(e.offset, e.key, e.value) for e in entries(service)] == [
        (1, None, b"n1"), (3, None, b"n2"), (4, None, b"n3"), (5, b"a", b"3")]


def test_the_exact_preview_counts_what_the_run_writes_without_the_jvm_s_files(
        kafka, make_factory, jvm_without_files, grouping):
    topic = kafka.topic(partitions=2)
    kafka.produce(topic, _FIRST)
    service = make_factory().new_topic_compaction_service(topic)
    compact(service)
    kafka.produce(topic, _SECOND)
    preview = succeeded(service.compact(kind="preview")).preview
    compact(service)
    kept = [e for p in (0, 1) for e in entries(service, p)]
    assert preview["records_kept"] == len(kept) == 4
    assert preview["kept_digest"] == kept_digest([(e.partition, e.offset) for e in kept])


def test_the_warm_up_runs_without_the_jvm_s_files(spark_manager, jvm_without_files, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    spark_manager.warm_up(scratch)
    assert spark_manager.warmed
    assert list(scratch.iterdir()) == []  # its folder is gone
