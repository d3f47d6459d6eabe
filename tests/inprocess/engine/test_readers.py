"""The range read of one offset range (``range_task.RangeReadTask``) against the real broker, without Spark:
every record's fields in its row, the end reached by position past a transaction marker, no offset reset,
event times from headers when some records have none."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from compactord.engine.kafka_fetch import open_range_reader
from compactord.engine.kafka_fetch.librdkafka import LibrdkafkaRangeReader
from compactord.engine.range_task import RangeReadTask
from compactord.errors import CompactordError
from tests.support.channel import LOOPBACK, run_channel


def spec(kafka: Any, topic: str, tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    base = {"client": {"bootstrap_servers": [kafka.bootstrap], "request_timeout_ms": 10000}, "topic": topic,
            "strategy": "publishing-order", "event_time_source": "timestamp", "retain_null_key": True,
            "batch_records": 1000}
    base.update(overrides)
    return base


def read_rows(task: RangeReadTask) -> list[dict[str, Any]]:
    table = pa.Table.from_batches(list(task.run()))
    return sorted(table.to_pylist(), key=lambda r: r["offset"])


def test_each_record_s_fields_reach_its_row(kafka, tmp_path):
    """Keys, null and empty values, null keys, headers (none, or a name twice), timestamps, several fetches'
    worth of offsets: each record's row holds its fields, column for column."""
    topic = kafka.topic()
    # Distinct keys (the readers drop a key's losers): every record reaches the rows.
    records = [(f"k{i}" if i % 11 else None, None if i % 13 == 0 and i % 11 else ("" if i % 17 == 0 else f"v{i}"),
                0, 1_700_000_000_000 + i, [("h", b"x%d" % i), ("h", b"\x00")] if i % 3 == 0 else None)
               for i in range(3000)]
    kafka.produce(topic, records)
    task = RangeReadTask(spec(kafka, topic, tmp_path), 0, 0, 3000)
    rows = read_rows(task)
    assert task.records == 3000
    assert [r["offset"] for r in rows] == list(range(3000))
    for row, (key, value, _p, ts, headers) in zip(rows, records):
        assert row["partition"] == 0
        assert (row["key"], row["value"]) == (None if key is None else key.encode(),
                                              None if value is None else value.encode())
        assert row["timestamp"] == row["event_time"] == ts
        assert row["headers"] == [{"key": k, "value": v} for k, v in headers or ()]


def test_event_times_from_a_header_when_some_records_have_none(kafka, tmp_path):
    topic = kafka.topic()
    kafka.produce(topic, [("a", "1", 0, None, [("et", (42).to_bytes(8, "big"))]), ("b", "2", 0, None, None)])
    task = RangeReadTask(spec(kafka, topic, tmp_path, event_time_source="header:et"), 0, 0, 2)
    assert [r["event_time"] for r in read_rows(task)] == [42, None]


def test_the_read_ends_on_the_position_past_a_commit_marker(kafka, tmp_path, tx_producer):
    topic = kafka.topic()
    tx_producer.begin_transaction()
    for key, value in (("a", "1"), ("b", "1"), ("a", "2")):
        tx_producer.send(topic, key=key.encode(), value=value.encode(), partition=0)
    tx_producer.commit_transaction()
    # Offsets 0-2 are the records, 3 the commit marker: the range's end is 4, which no record reaches.
    task = RangeReadTask(spec(kafka, topic, tmp_path), 0, 0, 4)
    assert [(r["key"], r["value"]) for r in read_rows(task)] == [(b"b", b"1"), (b"a", b"2")]
    assert task.records == 3


def test_a_start_the_log_does_not_hold_fails_instead_of_reading_other_offsets(kafka, tmp_path):
    topic = kafka.topic()
    kafka.produce(topic, [(f"k{i}", f"v{i}") for i in range(10)])
    task = RangeReadTask(spec(kafka, topic, tmp_path), 0, 20, 30)
    with pytest.raises(Exception, match=r"(?i)out of range|offset|ends at"):
        list(task.run())
    assert task.records == 0


def test_publishing_order_hands_over_each_key_s_last_record_once_per_window_of_keys(kafka, tmp_path, monkeypatch):
    """Under publishing-order a window is bounded by the keys it holds, not the records read: 40 records of
    4 keys (and 4 null-key records), polled 5 at a time, in windows of 9 leave the task as each key's last record only, with the retained null-key
    records; an empty value turned into a tombstone on the record that won. Every record still counts in
    the records and bytes read."""
    from compactord.engine import range_task

    monkeypatch.setattr(range_task, "REDUCE_WINDOW", 9)
    topic = kafka.topic()
    records = [(None if i % 10 == 3 else f"k{i % 4}", "" if i == 38 else f"v{i}", 0) for i in range(40)]
    kafka.produce(topic, records)
    task = RangeReadTask(spec(kafka, topic, tmp_path, empty_value_is_tombstone=True, batch_records=5),
                         0, 0, 40)
    rows = read_rows(task)
    last = {key: i for i, (key, _, _) in enumerate(records) if key is not None}
    want = sorted([*last.values(), *(i for i, (key, _, _) in enumerate(records) if key is None)])
    assert [r["offset"] for r in rows] == want
    assert [r["value"] for r in rows if r["offset"] == 38] == [None]
    assert task.records == 40
    assert task.bytes == sum(len(k or "") + len(v) for k, v, _ in records)


def test_a_reading_task_takes_what_the_worker_held_before_it_out_of_the_collector_s_scans(kafka, tmp_path):
    """Spark's daemon runs a full collection in a reused Python worker after every task: what the worker
    held before the task (its modules, Spark's state) is frozen, so that collection scans only what the
    task left."""
    import gc

    topic = kafka.topic()
    kafka.produce(topic, [(f"k{i % 3}", f"v{i}") for i in range(30)])
    gc.unfreeze()
    held = len(gc.get_objects())
    try:
        assert len(read_rows(RangeReadTask(spec(kafka, topic, tmp_path), 0, 0, 30))) == 3
        assert gc.get_freeze_count() >= held
        assert len(gc.get_objects()) < held // 10
    finally:
        gc.unfreeze()


# -- final reads: a task that reads its whole partition keeps exactly each key's winner ----------------


@pytest.mark.parametrize(("strategy", "source"), [("publishing-order", "timestamp"), ("event-time", "header:et")])
def test_a_final_read_keeps_each_key_s_winner_across_windows(kafka, tmp_path, monkeypatch, strategy, source):
    """Polls of 5 records, windows of at least 3 rows (publishing-order: of 3 keys' last records, and 4 keys
    take turns): a key whose records span windows still leaves the task once, as its winner (without
    ``final``, each window's own survivor leaves: the job's grouping picks among them)."""
    from compactord.engine import range_task

    monkeypatch.setattr(range_task, "REDUCE_WINDOW", 3)
    topic = kafka.topic()
    # Event times fall as offsets grow for k0 (its first record wins under event time), rise for the others.
    records = [(f"k{i % 4}", f"v{i}" if i % 9 else None, 0, None,
                [("et", (100 - i if i % 4 == 0 else i).to_bytes(8, "big"))]) for i in range(40)]
    kafka.produce(topic, records)
    if strategy == "publishing-order":
        want = {f"k{k}".encode(): max(i for i in range(40) if i % 4 == k) for k in range(4)}
    else:
        want = {b"k0": 0, **{f"k{k}".encode(): max(i for i in range(40) if i % 4 == k) for k in range(1, 4)}}
    final = RangeReadTask(spec(kafka, topic, tmp_path / "f", strategy=strategy, event_time_source=source,
                               final=True, batch_records=5), 0, 0, 40)
    assert {r["key"]: r["offset"] for r in read_rows(final)} == want
    assert len(read_rows(RangeReadTask(spec(kafka, topic, tmp_path / "f", strategy=strategy,
                                            event_time_source=source, final=True, batch_records=5), 0, 0, 40))) == 4
    windowed = RangeReadTask(spec(kafka, topic, tmp_path / "w", strategy=strategy,
                                  event_time_source=source, batch_records=5), 0, 0, 40)
    assert len(read_rows(windowed)) > 4


def test_a_final_read_holds_a_window_of_keys_as_records_and_keeps_each_key_s_last_across_windows(
        kafka, tmp_path, monkeypatch):
    """Under publishing-order a final read turns its records into Arrow rows every few keys (a partition of
    distinct keys is not held as the client's record objects); the windows' rows are reduced to each key's
    last at the end. Windows of 7 keys over 300 records: keys that come back in later windows (hot keys,
    tombstones among them), keys seen once, and retained null-key records leave the task exactly once, as
    their key's last record, in offset order. A partition whose windows share no key is kept whole."""
    from compactord.engine import range_task

    monkeypatch.setattr(range_task, "FINAL_WINDOW_KEYS", 7)
    topic = kafka.topic()
    records = [(None if i % 23 == 0 else (f"hot{i % 3}" if i % 2 else f"once{i}"),
                None if i % 29 == 1 else f"v{i}", 0) for i in range(300)]
    kafka.produce(topic, records)
    task = RangeReadTask(spec(kafka, topic, tmp_path / "a", final=True, batch_records=5), 0, 0, 300)
    offsets = [r["offset"] for r in pa.Table.from_batches(list(task.run())).to_pylist()]
    last = {key: i for i, (key, _, _) in enumerate(records) if key is not None}
    assert offsets == sorted([*last.values(), *(i for i in range(0, 300, 23))])
    assert task.records == 300

    distinct = kafka.topic()
    kafka.produce(distinct, [(f"k{i}", None if i % 10 == 0 else f"v{i}", 0) for i in range(100)])
    task = RangeReadTask(spec(kafka, distinct, tmp_path / "b", final=True, batch_records=5), 0, 0, 100)
    assert [r["offset"] for r in pa.Table.from_batches(list(task.run())).to_pylist()] == list(range(100))


def test_a_final_read_of_new_keys_that_meets_a_key_again_in_the_same_window_keeps_each_key_s_last(
        kafka, tmp_path):
    """A final read under publishing-order makes the rows of a window's records poll by poll while every key is
    new to the partition; once a key comes again (here in the window's second poll of 5), the window goes on
    as each key's last record, the rows made so far included: every key leaves once, as its last record."""
    topic = kafka.topic()
    records = [(f"k{i}", f"v{i}", 0) for i in range(7)] + [("k3", "again", 0)] + [(f"k{i}", f"v{i}", 0)
                                                                                 for i in range(7, 12)]
    kafka.produce(topic, records)
    task = RangeReadTask(spec(kafka, topic, tmp_path, final=True, batch_records=5), 0, 0, 13)
    rows = pa.Table.from_batches(list(task.run())).to_pylist()
    last = {key: i for i, (key, _, _) in enumerate(records)}
    assert [r["offset"] for r in rows] == sorted(last.values())
    assert {r["key"]: r["value"] for r in rows} == {k.encode(): records[i][1].encode() for k, i in last.items()}


def test_a_final_read_that_writes_its_part_keeps_each_key_s_last_across_windows(kafka, tmp_path, monkeypatch):
    """A compaction's final read writes its partition's part file itself. Windows of 7 keys: where no key
    comes back in a later window the windows go through the deletion rules into the file one at a time;
    where keys do come back (hot keys, tombstones among them), or null-key rows are retained, the windows
    are reduced together first. Either way the file holds each live key's last record, in offset order."""
    import pyarrow.parquet as pq

    from compactord.engine import range_task
    from compactord.engine.deletions import DeletionRules
    from compactord.ledger.parts import part_name

    monkeypatch.setattr(range_task, "FINAL_WINDOW_KEYS", 7)
    rules = DeletionRules(now_ms=0, tombstone_retention_ms=0, keeps_markers=False).to_json()
    cases = {
        "distinct": [(f"k{i}", None if i % 10 == 3 else f"v{i}", 0) for i in range(100)],
        "hot": [(f"hot{i % 3}" if i % 2 else f"once{i}", None if i % 29 == 1 else f"v{i}", 0) for i in range(100)],
        "null keys": [(None if i % 23 == 0 else f"k{i}", None if i % 10 == 4 else f"v{i}", 0) for i in range(100)],
    }
    for name, records in cases.items():
        topic = kafka.topic()
        kafka.produce(topic, records)
        out = tmp_path / name.replace(" ", "-")
        out.mkdir()
        task = RangeReadTask(spec(kafka, topic, out, final=True, batch_records=5, write_to=str(out),
                                  deletion_rules=rules), 0, 0, len(records))
        assert list(task.run()) == []  # nothing handed to Spark
        last = {key: i for i, (key, _, _) in enumerate(records) if key is not None}
        live = [i for i in last.values() if records[i][1] is not None]
        nulls = [i for i, (key, value, _) in enumerate(records) if key is None and value is not None]
        written = pq.read_table(out / part_name(0))
        assert written["offset"].to_pylist() == sorted(live + nulls), name
        assert written["value"].to_pylist() == [records[i][1].encode() for i in sorted(live + nulls)], name


_SPILL_CASES = {
    "distinct": [(f"k{i}", None if i % 10 == 3 else f"v{i}", 0) for i in range(120)],
    "hot": [(f"hot{i % 3}" if i % 2 else f"once{i}", None if i % 29 == 1 else f"v{i}", 0) for i in range(120)],
    # keys that come back windows later, their last record a tombstone or a value
    "late": [(f"k{i % 40}", None if i % 17 == 5 else f"v{i}", 0) for i in range(120)],
}


@pytest.mark.parametrize("case", sorted(_SPILL_CASES))
def test_a_final_read_past_its_memory_budget_keeps_its_windows_on_disk(kafka, tmp_path, monkeypatch, case):
    """A final read under publishing-order holds its windows in memory up to a budget, then writes them to
    Arrow files under Spark's local directory (``SPARK_LOCAL_DIRS``) and reads them back at the end: a
    partition of any size holds one window and its keys. With a budget of one byte every window of 7 keys
    goes to disk (with one of 4,500 bytes, the first ones do); the part file it writes, and the rows a
    preview's read hands over, are those of the read that held everything, and the spill folder is gone
    afterwards."""
    import pyarrow.parquet as pq

    from compactord.engine import range_task
    from compactord.engine.deletions import DeletionRules
    from compactord.ledger.parts import part_name

    monkeypatch.setattr(range_task, "FINAL_WINDOW_KEYS", 7)
    local = tmp_path / "local"
    local.mkdir()
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{local},{tmp_path / 'unused'}")
    rules = DeletionRules(now_ms=0, tombstone_retention_ms=0, keeps_markers=False).to_json()
    records = _SPILL_CASES[case]
    topic = kafka.topic()
    kafka.produce(topic, records)

    def part(budget: int) -> tuple[pa.Table, int]:
        out = tmp_path / f"out-{budget}"
        out.mkdir()
        task = RangeReadTask(spec(kafka, topic, out, final=True, batch_records=5, write_to=str(out),
                                  deletion_rules=rules, retain_null_key=False, window_memory_bytes=budget),
                             0, 0, len(records))
        assert list(task.run()) == []
        return pq.read_table(out / part_name(0)), task.spilled_windows

    (held, held_files), (spilled, spilled_files) = part(1 << 30), part(1)
    # A window closes at the poll (of up to 5 records) that brings it to 7 keys.
    assert held_files == 0 and spilled_files >= len({k for k, _, _ in records}) // (7 + 5 - 1)
    assert spilled.equals(held)
    # A budget of a few windows: some on disk, the last ones still in memory at the end.
    some, some_files = part(4500)
    assert some_files > 0 and some.equals(held)
    last = {key: i for i, (key, _, _) in enumerate(records)}
    live = sorted(i for i in last.values() if records[i][1] is not None)
    assert spilled["offset"].to_pylist() == live
    assert spilled["value"].to_pylist() == [records[i][1].encode() for i in live]
    assert list(local.iterdir()) == []

    # A preview's final read hands the same winners over, tombstones included, window by window.
    preview = RangeReadTask(spec(kafka, topic, tmp_path / "p", final=True, batch_records=5,
                                 retain_null_key=False, window_memory_bytes=1), 0, 0, len(records))
    handed = pa.Table.from_batches(list(preview.run()))
    assert preview.spilled_windows > 0 and handed["offset"].to_pylist() == sorted(last.values())
    assert list(local.iterdir()) == []


def test_a_full_disk_under_the_spilled_windows_fails_the_read_and_leaves_nothing(kafka, tmp_path, monkeypatch):
    """The local disk fills while a final read writes its windows to it: the read fails with the disk's
    error, no part file is written, and what was spilled is removed (the run then fails and keeps the
    previous ledger: ``test_disk_errors``). The disk is a real 2 MiB tmpfs."""
    from compactord.engine import range_task
    from compactord.engine.deletions import DeletionRules
    from compactord.ledger.parts import part_name
    from tests.support.disks import tmpfs

    monkeypatch.setattr(range_task, "FINAL_WINDOW_KEYS", 1000)
    topic = kafka.topic()
    records = [(f"key-{i:08d}", "v" * 200, 0) for i in range(12_000)]  # ~2.6 MB of rows: more than the disk
    kafka.produce(topic, records)
    out = tmp_path / "out"
    out.mkdir()
    rules = DeletionRules(now_ms=0, tombstone_retention_ms=0, keeps_markers=False).to_json()
    with tmpfs(tmp_path / "small-disk", "2m") as disk:
        monkeypatch.setenv("SPARK_LOCAL_DIRS", str(disk))
        task = RangeReadTask(spec(kafka, topic, tmp_path, final=True, write_to=str(out),
                                  deletion_rules=rules, retain_null_key=False, window_memory_bytes=1),
                             0, 0, len(records))
        with pytest.raises(OSError, match="No space left on device"):
            list(task.run())
        assert task.spilled_windows > 0
        assert list(disk.iterdir()) == []
    assert not (out / part_name(0)).exists() and [p.name for p in out.iterdir()] == []


def test_a_final_read_hands_its_rows_over_in_offset_order(kafka, tmp_path, monkeypatch):
    """Final reads are written without a sort: the winners of many reduce windows and the retained
    null-key rows between them leave the task in offset order."""
    from compactord.engine import range_task

    monkeypatch.setattr(range_task, "REDUCE_WINDOW", 300)  # ten windows
    topic = kafka.topic()
    records = [(None if i % 7 == 0 else f"k{i % 40}", f"v{i}", 0) for i in range(3000)]
    kafka.produce(topic, records)
    task = RangeReadTask(spec(kafka, topic, tmp_path, final=True), 0, 0, 3000)
    offsets = [r["offset"] for r in pa.Table.from_batches(list(task.run())).to_pylist()]
    last = {key: i for i, (key, _, _) in enumerate(records) if key is not None}
    assert offsets == sorted([*last.values(), *(i for i in range(0, 3000, 7))])


# -- the driver's log-identity probe (``KafkaAdmin.first_records``) reads like the reading tasks --------


def test_the_log_identity_probe_finds_what_the_reading_task_fingerprinted(kafka, tmp_path, tx_producer):
    """The probe reads with the reading tasks' client (librdkafka decodes the batch holding the offset in
    C): at the offset of the last record a task read, it finds that record's fingerprint; where only a
    transaction marker is left, nothing; at an offset retention removed, nothing."""
    from compactord.config import Settings
    from compactord.kafka.admin import KafkaAdmin

    topic = kafka.topic(partitions=2)
    kafka.produce(topic, [(f"k{i % 50}", f"v{i}", 0, 1_700_000_000_000 + i) for i in range(3000)])
    tx_producer.begin_transaction()
    for i in range(3):
        tx_producer.send(topic, key=b"t%d" % i, value=b"x", partition=1)
    tx_producer.commit_transaction()  # offsets 0-2 the records, 3 the commit marker
    tasks = {p: RangeReadTask(spec(kafka, topic, tmp_path / str(p)), p, 0, end)
             for p, end in ((0, 3000), (1, 4))}
    for task in tasks.values():
        read_rows(task)
    admin = KafkaAdmin(Settings(kafka_bootstrap_servers=kafka.bootstrap, compacted_ledger_root=str(tmp_path / "l")))
    try:
        offsets = admin.offsets(topic)
        found = admin.first_records(topic, {0: 2999, 1: 2}, offsets)
        assert found == {0: tasks[0].last, 1: tasks[1].last}
        assert found[0] is not None and found[0].offset == 2999 and found[1].offset == 2
        assert admin.first_records(topic, {1: 3}, offsets) == {1: None}  # only the marker is left
        # What retention removed (the broker's log start, given at the boundary that receives it: the test
        # broker never moves its log start) is not read at all.
        moved = {0: dataclasses.replace(offsets[0], log_start=2500), 1: offsets[1]}
        assert admin.first_records(topic, {0: 100}, moved) == {0: None}
    finally:
        admin.close()


def test_the_log_identity_probe_fetches_little_past_its_record_and_still_finds_a_larger_one(kafka, monkeypatch):
    """librdkafka's probe at the previous horizon asks for 64 KB per fetch: a fetch of 1 MB also brought the
    new tail behind the record (here ~470 KB after it), which librdkafka checked and decoded for one record.
    A record larger than the limit is answered whole (KIP-74) and found. The settings are read where the
    client library receives them (``confluent_kafka.Consumer``, the seam; the probe's code is the
    production one)."""
    import confluent_kafka
    from kafka import KafkaProducer

    from compactord.config import Settings
    from compactord.kafka import librdkafka

    topic = kafka.topic()
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=100, batch_size=1 << 20,
                             max_request_size=1 << 20)
    try:
        for i in range(6000):
            producer.send(topic, key=b"k%d" % i, value=b"v" * 100, partition=0)
        producer.send(topic, key=b"large", value=b"w" * 150_000, partition=0)  # offset 6000
        producer.flush()
    finally:
        producer.close()
    made: list[dict[str, Any]] = []

    class Recording(confluent_kafka.Consumer):
        def __init__(self, config: dict[str, Any]) -> None:
            made.append(config)
            super().__init__(config)

    monkeypatch.setattr(confluent_kafka, "Consumer", Recording)
    client = Settings(kafka_bootstrap_servers=kafka.bootstrap).kafka_client_config()
    found = librdkafka.first_records(client, topic, {0: 1500}, {0: 6001}, 10)
    assert found == {0: librdkafka.RecordFingerprint.of(1500, found[0].timestamp, b"k1500", b"v" * 100)}
    [config] = made
    assert config["max.partition.fetch.bytes"] <= 64 << 10 and config["fetch.max.bytes"] <= 64 << 10
    found = librdkafka.first_records(client, topic, {0: 6000}, {0: 6001}, 10)
    assert found == {0: librdkafka.RecordFingerprint.of(6000, found[0].timestamp, b"large", b"w" * 150_000)}


def test_the_driver_s_probe_consumers_are_all_closed(kafka, monkeypatch):
    """Every consumer the driver's end reads and probe make is closed (the reads run in the probe processes,
    which keep running: a consumer left open there would hold its connections for good). Read where the client
    library makes and closes them (``confluent_kafka.Consumer``, the seam), with the functions those processes
    run."""
    import confluent_kafka

    from compactord.kafka import librdkafka

    topic = kafka.topic(partitions=2)
    kafka.produce(topic, [(f"k{i}", f"v{i}", i % 2) for i in range(100)])
    made, closed = [], []

    class Recording(confluent_kafka.Consumer):
        def __init__(self, config: dict[str, Any]) -> None:
            made.append(self)
            super().__init__(config)

        def close(self) -> None:
            super().close()
            closed.append(self)

    monkeypatch.setattr(confluent_kafka, "Consumer", Recording)
    config = {"bootstrap_servers": kafka.bootstrap}
    assert librdkafka.read_ends(config, topic, {0: 50, 1: 50}, 10)[0] == {0: 50, 1: 50}
    assert librdkafka.read_ends_many(config, {(topic, 0): 50}, 10)[0] == {(topic, 0): 50}
    found = librdkafka.first_records(config, topic, {0: 10, 1: 20}, {0: 50, 1: 50}, 10)
    assert found[0].offset == 10 and found[1].offset == 20
    deadline = time.monotonic() + 10  # read_ends_many closes its consumer on a thread of its own
    while len(closed) < len(made) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(made) == 3
    assert len(closed) == len(made)


def test_the_probe_read_while_the_offsets_are_fixed_answers_as_the_probe_after_them(kafka, tx_producer, tmp_path):
    """A run's planning asks for the offsets and the log-identity probe at once (``offsets_with_records``:
    with librdkafka the probe reads while the offsets are fixed, and its answer is held to them after).
    The answer is the one ``first_records`` gives after the offsets: the record at an offset, nothing where
    only a transaction marker is left, nothing at or past a partition's end, nothing of a partition the
    topic does not have (a topic recreated with fewer partitions)."""
    from compactord.config import Settings
    from compactord.kafka.admin import KafkaAdmin

    topic = kafka.topic(partitions=2)
    kafka.produce(topic, [(f"k{i % 50}", f"v{i}", 0) for i in range(3000)])
    tx_producer.begin_transaction()
    for i in range(3):
        tx_producer.send(topic, key=b"t%d" % i, value=b"x", partition=1)
    tx_producer.commit_transaction()  # partition 1: offsets 0-2 the records, 3 the commit marker
    admin = KafkaAdmin(Settings(kafka_bootstrap_servers=kafka.bootstrap, compacted_ledger_root=str(tmp_path / "l")))
    try:
        at = {0: 2999, 1: 3}
        offsets, found = admin.offsets_with_records(topic, at)
        assert offsets == admin.offsets(topic)
        assert found[0] is not None and (found[0].offset, found[1]) == (2999, None)
        assert found == admin.first_records(topic, at, offsets)
        for elsewhere in ({0: 10, 1: 2}, {0: 3000}, {0: 5000, 1: 4}, {0: 7, 9: 0}):
            offsets, found = admin.offsets_with_records(topic, elsewhere)
            assert found == admin.first_records(topic, elsewhere, offsets), elsewhere
            assert [p for p, record in found.items() if record is not None] == [
                p for p, o in elsewhere.items() if p in offsets and o < offsets[p].end and (p, o) != (1, 3)]
        assert admin.offsets_with_records(topic, {}) == (admin.offsets(topic), {})
        # A transaction left open right after the last committed record: the read at its start gets nothing
        # (the broker holds read_committed reads at the open transaction), and the probe says so.
        tx_producer.begin_transaction()
        for i in range(2):
            tx_producer.send(topic, key=b"open%d" % i, value=b"x", partition=0)
        tx_producer.flush()
        offsets, found = admin.offsets_with_records(topic, {0: offsets[0].end})
        assert found == admin.first_records(topic, {0: offsets[0].end}, offsets)
        tx_producer.abort_transaction()
    finally:
        admin.close()


def test_a_runs_planning_names_the_partitions_and_the_topic_id_in_one_metadata_request(kafka, tmp_path):
    """``offsets_and_identity``: the offsets, the probe's records and the topic id a run's planning asks for, as
    ``offsets_with_records`` and ``topic_id`` answer them, with one metadata request, not one for each."""
    from collections import Counter

    from compactord.config import Settings
    from compactord.kafka.admin import KafkaAdmin

    topic = kafka.topic(partitions=2)
    kafka.produce(topic, [(f"k{i % 50}", f"v{i}", i % 2) for i in range(100)])
    asked: Counter[str] = Counter()
    admin = KafkaAdmin(Settings(kafka_bootstrap_servers=kafka.bootstrap, compacted_ledger_root=str(tmp_path / "l")),
                       observer=lambda op: asked.update([op]))
    try:
        for at in ({}, {0: 10, 1: 20}):
            asked.clear()
            offsets, found, topic_id = admin.offsets_and_identity(topic, at)
            assert asked["metadata"] == 1, asked
            assert (offsets, found) == admin.offsets_with_records(topic, at)
            assert topic_id == admin.topic_id(topic)
            assert {p: o.end for p, o in offsets.items()} == {0: 50, 1: 50}
    finally:
        admin.close()


def test_the_reads_identity_check_confirms_by_a_read_only_the_ends_at_or_below_the_ledger_s_horizon(kafka, tmp_path):
    """``log_now``: the topic id and partitions of one metadata request, the offsets listed, and a read confirming
    only the ends at or below the horizon (as ``offsets`` confirms them); an end above the horizon is the listed
    one, marked unconfirmed. No read when every listed end is above the horizon."""
    from collections import Counter

    from kafka import TopicPartition

    from compactord.config import Settings
    from compactord.kafka import end_offsets
    from compactord.kafka.admin import KafkaAdmin

    topic = kafka.topic(partitions=2)
    kafka.produce(topic, [(f"k{i % 50}", f"v{i}", i % 2) for i in range(100)])
    tps = [TopicPartition(topic, p) for p in (0, 1)]
    listed = {tp.partition: end for tp, end in end_offsets.list_offsets(kafka.admin, tps, 10_000)[1].items()}
    asked: Counter[str] = Counter()
    admin = KafkaAdmin(Settings(kafka_bootstrap_servers=kafka.bootstrap, compacted_ledger_root=str(tmp_path / "l")),
                       observer=lambda op: asked.update([op]))
    try:
        confirmed = admin.offsets(topic)
        asked.clear()
        topic_id, offsets = admin.log_now(topic, {0: listed[0] - 1, 1: listed[1]})  # 1's listed end is its horizon

        assert (asked["metadata"], asked["fetch"]) == (1, 1), asked
        assert topic_id == admin.topic_id(topic)
        assert offsets[0] == dataclasses.replace(confirmed[0], end=listed[0], end_confirmed=False)
        assert offsets[1] == confirmed[1] and offsets[1].end == 50

        asked.clear()
        _, offsets = admin.log_now(topic, {0: listed[0] - 1, 1: listed[1] - 1})
        assert asked["fetch"] == 0, asked
        assert [(o.end, o.end_confirmed) for o in offsets.values()] == [(listed[0], False), (listed[1], False)]
    finally:
        admin.close()


def test_a_call_to_the_broker_does_not_wait_for_another_threads_call_under_way(kafka, tmp_path):
    """A call that holds its admin client (a broker slow to answer one run's planning) leaves others to theirs:
    the API's, the monitor's and other runs' requests do not queue behind it. A client whose call failed is
    not used again."""
    import threading

    from compactord.config import Settings
    from compactord.kafka import admin as admin_module
    from compactord.kafka.admin import KafkaAdmin
    from tests.support.timeouts import TASK_TIMEOUT_S

    topic = kafka.topic(partitions=1)
    admin = KafkaAdmin(Settings(kafka_bootstrap_servers=kafka.bootstrap, compacted_ledger_root=str(tmp_path / "l")))
    held, release, used = threading.Event(), threading.Event(), []

    def slow(client: Any) -> None:
        used.append(client)
        held.set()
        release.wait(2 * TASK_TIMEOUT_S)

    holder = threading.Thread(target=admin._call, args=(topic, slow), daemon=True)
    try:
        holder.start()
        assert held.wait(TASK_TIMEOUT_S)
        answered = threading.Event()
        other = threading.Thread(target=lambda: (admin.partitions(topic), answered.set()), daemon=True)
        other.start()
        assert answered.wait(TASK_TIMEOUT_S), "a call waited for another thread's call to end"
        release.set()
        holder.join(TASK_TIMEOUT_S)

        def failing(client: Any) -> None:
            used.append(client)
            raise OSError("the connection broke")

        for _ in range(admin_module.ADMIN_CLIENTS + 1):
            with pytest.raises((CompactordError, OSError)):  # the broker named as unavailable, or the error as it is
                admin._call(topic, failing)
        assert len({id(c) for c in used[1:]}) == len(used) - 1  # a new client after each failure
        assert admin.partitions(topic) == [0]
    finally:
        release.set()
        admin.close()


def test_a_task_of_several_ranges_opens_the_next_reader_while_one_reads_and_closes_each(kafka, tmp_path, monkeypatch):
    """One Spark task reads several ranges one after the other (``pack_ranges``); the next range's reader
    is open while the current one reads. Every reader is closed, also when the task stops early."""
    from compactord.engine import range_task
    from compactord.engine.kafka_source import KafkaRangeReader

    topic = kafka.topic(partitions=3)
    kafka.produce(topic, [(f"k{i}", f"v{i}", i % 3) for i in range(30)])
    events: list[tuple[str, int]] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        reader, partition = open_range_reader(*args, **kwargs), args[2]
        events.append(("open", partition))
        close = reader.close

        def closing() -> None:
            events.append(("close", partition))
            close()

        reader.close = closing
        return reader

    monkeypatch.setattr(range_task, "open_range_reader", recording)
    with run_channel() as channel:
        source = KafkaRangeReader(spec(kafka, topic, tmp_path, read_tasks=1,
                                       ranges=[[0, 0, 10], [1, 0, 10], [2, 0, 10]],
                                       channel=channel.endpoint(LOOPBACK)))
        [task] = source.partitions()
        rows = pa.Table.from_batches(list(source.read(task))).to_pylist()
        assert sorted((r["partition"], r["offset"]) for r in rows) == [(p, o) for p in range(3) for o in range(10)]
        assert events == [("open", 0), ("open", 1), ("close", 0), ("open", 2), ("close", 1), ("close", 2)]
        assert channel.progress().records == 30 and channel.progress().ended == 3

        events.clear()
        channel.cancel()
        with pytest.raises(RuntimeError, match="cancelled"):
            list(source.read(task))
        assert events == [("open", 0), ("open", 1), ("close", 0), ("close", 1)]


def test_the_end_of_each_partition_is_where_a_read_committed_read_ends(kafka, tmp_path, tx_producer):
    """The driver fixes each partition's end by reading from its listed end - 1 with the reading tasks' client
    (librdkafka decodes the broker's batch in C): past a commit marker, at the last record, or the log start
    of an empty partition; the reading task then reads exactly to it."""
    from compactord.config import Settings
    from compactord.kafka.admin import KafkaAdmin

    topic = kafka.topic(partitions=3)
    kafka.produce(topic, [(f"k{i % 50}", f"v{i}", 0) for i in range(3000)])
    tx_producer.begin_transaction()
    for i in range(3):
        tx_producer.send(topic, key=b"t%d" % i, value=b"x", partition=1)
    tx_producer.commit_transaction()  # offsets 0-2 the records, 3 the commit marker
    admin = KafkaAdmin(Settings(kafka_bootstrap_servers=kafka.bootstrap, compacted_ledger_root=str(tmp_path / "l")))
    try:
        offsets = admin.offsets(topic)
    finally:
        admin.close()
    assert {p: (o.log_start, o.end) for p, o in offsets.items()} == {0: (0, 3000), 1: (0, 4), 2: (0, 0)}
    from compactord.kafka.librdkafka import read_ends

    # A listed end past what the log holds (given at the boundary: the log was truncated under the read): it
    # stands, and the read ends once the broker's answers show that nothing more comes.
    client = Settings(kafka_bootstrap_servers=kafka.bootstrap).kafka_client_config()
    assert read_ends(client, topic, {0: 3000, 1: 9000}, 10) == ({0: 3000, 1: 9000}, set())
    for p in (0, 1):
        task = RangeReadTask(spec(kafka, topic, tmp_path / str(p)), p, 0, offsets[p].end)
        assert len(read_rows(task)) == {0: 50, 1: 3}[p]


def test_a_librdkafka_poll_hands_over_the_records_that_came_without_waiting_for_a_whole_batch(kafka, monkeypatch):
    """A poll asks for up to a batch (10,000 records here) and the topic holds 50: it hands them over as
    they come, instead of holding them until the batch is full or its time limit (far longer than this
    test) has passed. Each fetch of a reading consumer is bounded to 1 MiB, per partition and per request,
    so that the first records come with the first MiB (read where the client library makes the consumer,
    ``confluent_kafka.Consumer``, the seam)."""
    import threading

    import confluent_kafka

    topic = kafka.topic()
    kafka.produce(topic, [(f"k{i}", f"v{i}", 0) for i in range(50)])
    made: list[dict[str, Any]] = []

    class Recording(confluent_kafka.Consumer):
        def __init__(self, config: dict[str, Any]) -> None:
            made.append(config)
            super().__init__(config)

    monkeypatch.setattr("compactord.engine.kafka_fetch.librdkafka.Consumer", Recording)
    reader = LibrdkafkaRangeReader({"bootstrap_servers": [kafka.bootstrap]}, topic, 0, 0, batch_records=10_000)
    offsets: list[int] = []

    def read() -> None:
        while len(offsets) < 50:
            polled = reader.poll(600)  # a time limit no run of this test reaches
            offsets.extend(polled.offsets if polled else [])

    polling = threading.Thread(target=read, daemon=True)
    try:
        polling.start()
        polling.join(120)
        assert not polling.is_alive(), f"the polls held {len(offsets)} records back, waiting for a whole batch"
        assert offsets == list(range(50))
        [config] = made
        assert config["max.partition.fetch.bytes"] == config["fetch.max.bytes"] == 1 << 20
    finally:
        if not polling.is_alive():
            reader.close()
