"""LedgerReader against a reference model on real Parquet files (several files, small row groups), its
row-group pruning on a large ledger, and LedgerHandle's reference counting."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactord.errors import InvalidArgument, LedgerCorrupt
from compactord.ledger import LedgerHandle, LedgerReader, LedgerRetired, LedgerStore, RowGroup
from compactord.model import RECORD_SCHEMA, Entry, LedgerManifest, StrategySettings


def row(partition: int, offset: int, marker: bool = False) -> dict[str, Any]:
    return {
        "partition": partition,
        "offset": offset,
        "timestamp": 1000 + offset,
        "key": b"k%d" % (offset % 7),
        "value": None if marker else b"v%d-%d" % (partition, offset),
        "headers": [{"key": "h", "value": b"%d" % offset}] if offset % 3 == 0 else None,
        "event_time": None,
        "marker": marker,
        "marker_at": 5 if marker else None,
    }


def build(
    store: LedgerStore, topic: str, rows: list[dict[str, Any]], files: int, row_group_size: int, **kw: Any
) -> LedgerReader:
    """Write ``rows`` (sorted) as ``files`` part files through the store, verify, and open a reader."""
    ledger_id, path = store.allocate_ledger(topic)
    path.mkdir()
    size = -(-len(rows) // files) if rows else 0
    for i in range(files):
        chunk = rows[i * size : (i + 1) * size]
        table = pa.Table.from_pylist(chunk, schema=RECORD_SCHEMA)
        pq.write_table(table, path / f"part-{i:05d}.parquet", row_group_size=row_group_size, **kw)
    empty = LedgerManifest(ledger_id, topic, horizon={}, strategy=StrategySettings(), files=[])
    store.finalize_ledger(topic, ledger_id, empty)
    return LedgerReader(path, store.verify(topic, ledger_id))


# Partition 0: offsets 0..299 with every 10th a marker; 1: even offsets 1000..1598 with markers at
# the tail; 2: none at all; 3: markers only; 4: a single entry. 3 files, 50 rows a row group.
MARKERS_1 = set(range(1550, 1600, 2))
ROWS = (
    [row(0, o, marker=o % 10 == 4) for o in range(300)]
    + [row(1, o, marker=o in MARKERS_1) for o in range(1000, 1600, 2)]
    + [row(3, o, marker=True) for o in range(40)]
    + [row(4, 7)]
)
PARTITIONS = [0, 1, 2, 3, 4, 5]


def expected(partition: int, start: int, n: int) -> list[Entry]:
    live = [Entry.from_row(r) for r in ROWS if r["partition"] == partition and not r["marker"]]
    return [e for e in live if e.offset >= start][:n]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerStore]:
    with LedgerStore(tmp_path_factory.mktemp("root")) as s:
        yield s


@pytest.fixture(scope="module")
def reader(store: LedgerStore) -> LedgerReader:
    return build(store, "small", ROWS, files=3, row_group_size=50)


def test_the_fixture_spans_files_and_row_groups(reader: LedgerReader) -> None:
    assert len({g.file for g in reader.row_groups}) == 3 and len(reader.row_groups) > 12
    assert reader.num_rows == len(ROWS)
    assert all(g.partition_max < float("inf") for g in reader.row_groups)  # statistics present


@settings(max_examples=300, deadline=None)
@given(
    partition=st.sampled_from(PARTITIONS),
    start=st.one_of(st.integers(0, 1700), st.sampled_from([0, 4, 5, 299, 300, 1000, 1549, 1550, 1599])),
    n=st.integers(1, 400),
)
def test_read_matches_the_model(reader: LedgerReader, partition: int, start: int, n: int) -> None:
    assert reader.read(partition, start, n) == expected(partition, start, n)


@pytest.mark.parametrize(
    ("partition", "start", "n", "offsets"),
    [
        (0, 0, 6, [0, 1, 2, 3, 5, 6]),  # marker at 4 skipped
        (0, 4, 3, [5, 6, 7]),  # start on a marker
        (0, 148, 5, [148, 149, 150, 151, 152]),  # across a row-group boundary
        (0, 298, 10, [298, 299]),  # end of the partition: fewer than n
        (0, 300, 10, []),  # start past the end
        (1, 1001, 2, [1002, 1004]),  # start between two offsets
        (1, 1540, 10, [1540, 1542, 1544, 1546, 1548]),  # the tail is all markers
        (1, 1550, 10, []),
        (2, 0, 10, []),  # an empty partition
        (3, 0, 10, []),  # markers only
        (4, 0, 10, [7]),
        (4, 8, 10, []),
        (9, 0, 10, []),  # past the last partition
    ],
)
def test_read_cases(reader: LedgerReader, partition: int, start: int, n: int, offsets: list[int]) -> None:
    entries = reader.read(partition, start, n)
    assert [e.offset for e in entries] == offsets
    assert all(e.partition == partition and not e.marker for e in entries)


def expected_slice(partition: int, start: int, n: int, max_bytes: int) -> tuple[list[Entry], bool]:
    """The reference of ``read_slice``: entries while their raw bytes fit, at least one."""
    wanted, taken, used = expected(partition, start, n), [], 0
    for entry in wanted:
        if taken and used + entry.raw_bytes > max_bytes:
            return taken, True
        used += entry.raw_bytes
        taken.append(entry)
    return taken, False


@settings(max_examples=200, deadline=None)
@given(
    partition=st.sampled_from(PARTITIONS),
    start=st.sampled_from([0, 4, 299, 1000, 1549]),
    n=st.integers(1, 400),
    max_bytes=st.one_of(st.integers(1, 40), st.integers(40, 4000)),
)
def test_read_slice_stops_at_the_byte_budget(reader: LedgerReader, partition: int, start: int, n: int,
                                             max_bytes: int) -> None:
    found = reader.read_slice(partition, start, n, max_bytes=max_bytes)
    assert (found.entries, found.truncated) == expected_slice(partition, start, n, max_bytes)


def test_a_slice_counts_keys_values_and_headers() -> None:
    entry = Entry(0, 3, b"k3", b"v0-3", headers=(("h", b"3"), ("hh", None)))  # type: ignore[arg-type]
    assert entry.raw_bytes == 2 + 4 + 1 + 1 + 2


def test_a_slice_holds_one_entry_larger_than_the_budget(reader: LedgerReader) -> None:
    found = reader.read_slice(0, 0, 100, max_bytes=1)
    assert [e.offset for e in found.entries] == [0] and found.truncated
    with pytest.raises(InvalidArgument, match="max_bytes"):
        reader.read_slice(0, 0, 100, max_bytes=0)


def test_read_crosses_file_boundaries(reader: LedgerReader) -> None:
    files = {g.file.name: g for g in reader.row_groups if g.index == 0}
    entries = reader.read(0, 0, 1000)
    assert len(entries) == 270 and len(files) == 3  # partition 0 alone spans the first two files
    assert entries == expected(0, 0, 1000)


def test_entries_are_built_like_entry_from_row(reader: LedgerReader) -> None:
    entry = reader.read(0, 3, 1)[0]
    assert entry == Entry(0, 3, b"k3", b"v0-3", timestamp=1003, headers=(("h", b"3"),), event_time=None)
    assert reader.read(0, 1, 1)[0].headers == ()


def test_every_column_reaches_the_entry_like_entry_from_row(store: LedgerStore) -> None:
    """Entries are converted column by column: each field, null or not, as ``Entry.from_row`` gives it."""
    rows = [{**row(0, o, marker=o % 4 == 3), "event_time": None if o % 5 == 0 else 7000 + o,
             "timestamp": None if o % 6 == 0 else 1000 + o, "key": None if o % 7 == 0 else b"k%d" % o,
             "headers": [[], None, [{"key": "a", "value": None}, {"key": "b", "value": b""}]][o % 3]}
            for o in range(40)]
    mixed = build(store, "columns", rows, files=2, row_group_size=6)
    assert list(mixed.entries(include_markers=True)) == [Entry.from_row(r) for r in rows]
    assert mixed.read(0, 9, 5) == [Entry.from_row(r) for r in rows if r["offset"] >= 9 and not r["marker"]][:5]
    assert mixed.last(0) == Entry.from_row(rows[38])


@pytest.mark.parametrize(
    ("partition", "offset"), [(0, 299), (1, 1548), (2, None), (3, None), (4, 7), (5, None)]
)
def test_last(reader: LedgerReader, partition: int, offset: int | None) -> None:
    entry = reader.last(partition)
    assert (entry.offset if entry else None) == offset
    if entry is not None:
        assert entry == expected(partition, 0, 10**6)[-1]


def test_entries_in_order(reader: LedgerReader) -> None:
    assert list(reader) == [Entry.from_row(r) for r in ROWS if not r["marker"]]
    everything = list(reader.entries(include_markers=True))
    assert everything == [Entry.from_row(r) for r in ROWS]
    keys = [(e.partition, e.offset) for e in everything]
    assert keys == sorted(keys)


@pytest.mark.parametrize(
    ("args", "name"),
    [((-1, 0, 1), "partition"), ((0, -1, 1), "start"), ((0, 0, 0), "n"), ((0, 0, True), "n")],
)
def test_bad_read_arguments(reader: LedgerReader, args: tuple[Any, ...], name: str) -> None:
    with pytest.raises(InvalidArgument, match=f"{name} must be an integer"):
        reader.read(*args)
    with pytest.raises(InvalidArgument):
        reader.last(-1)


def test_a_ledger_without_statistics_is_read_in_full_but_right(store: LedgerStore) -> None:
    plain = build(store, "nostats", ROWS, files=2, row_group_size=50, write_statistics=False)
    assert all(g.partition_min == float("-inf") for g in plain.row_groups)
    for partition, start, n in [(0, 5, 7), (1, 1500, 100), (2, 0, 1), (4, 0, 5)]:
        assert plain.read(partition, start, n) == expected(partition, start, n)
    assert [plain.last(p) for p in PARTITIONS] == [reader_last(p) for p in PARTITIONS]


def reader_last(partition: int) -> Entry | None:
    live = expected(partition, 0, 10**6)
    return live[-1] if live else None


def test_an_empty_ledger(store: LedgerStore) -> None:
    empty = build(store, "empty", [], files=1, row_group_size=50)
    assert empty.read(0, 0, 10) == [] and empty.last(0) is None and list(empty) == []


def test_a_missing_or_miscounted_file_is_corrupt(store: LedgerStore, reader: LedgerReader) -> None:
    manifest = LedgerManifest.from_json(reader.manifest.to_json())
    manifest.files[0]["rows"] += 1
    with pytest.raises(LedgerCorrupt, match="rows"):
        LedgerReader(reader.path, manifest)
    manifest.files[0]["name"] = "part-99999.parquet"
    with pytest.raises(LedgerCorrupt, match="part-99999.parquet"):
        LedgerReader(reader.path, manifest)


# -- pruning on a large ledger -----------------------------------------------------------------


class CountingReader(LedgerReader):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.reads: list[RowGroup] = []

    def read_row_group(self, group: RowGroup) -> pa.Table:
        self.reads.append(group)
        return super().read_row_group(group)


@pytest.fixture(scope="module")
def big(store: LedgerStore) -> CountingReader:
    n = 50_000  # 4 partitions: 200k rows, 1000 rows a row group, 2 files
    partitions = pa.array([p for p in range(4) for _ in range(n)], pa.int32())
    offsets = pa.array([o for _ in range(4) for o in range(0, 2 * n, 2)], pa.int64())
    markers = pa.array([o % 100 == 0 for _ in range(4) for o in range(0, 2 * n, 2)])
    nulls = pa.nulls(4 * n)
    columns = {
        "partition": partitions,
        "offset": offsets,
        "timestamp": nulls.cast(pa.int64()),
        "key": nulls.cast(pa.binary()),
        "value": pa.array([b"x"] * (4 * n)),
        "headers": nulls.cast(RECORD_SCHEMA.field("headers").type),
        "event_time": nulls.cast(pa.int64()),
        "marker": markers,
        "marker_at": nulls.cast(pa.int64()),
    }
    table = pa.table(columns, schema=RECORD_SCHEMA)
    ledger_id, path = store.allocate_ledger("big")
    path.mkdir()
    pq.write_table(table.slice(0, 2 * n - 333), path / "part-00000.parquet", row_group_size=1000)
    pq.write_table(table.slice(2 * n - 333), path / "part-00001.parquet", row_group_size=1000)
    empty = LedgerManifest(ledger_id, "big", horizon={}, strategy=StrategySettings(), files=[])
    manifest = store.finalize_ledger("big", ledger_id, empty)
    assert manifest.records_kept + manifest.markers == 4 * n and manifest.markers == 4 * n // 50
    return CountingReader(path, manifest)


@pytest.mark.parametrize(
    ("partition", "start", "first"),
    [(0, 0, 2), (1, 50_002, 50_002), (2, 99_990, 99_990), (3, 40_000, 40_002), (1, 99_998, 99_998)],
)
def test_a_read_of_10_touches_few_row_groups(
    big: CountingReader, partition: int, start: int, first: int
) -> None:
    assert len(big.row_groups) > 200
    big.reads.clear()
    entries = big.read(partition, start, 10)
    live = [o for o in range(start + start % 2, 100_000, 2) if o % 100 != 0][:10]
    assert entries[0].offset == first and [e.offset for e in entries] == live
    assert all(e.partition == partition and e.offset % 100 != 0 for e in entries)
    assert len(big.reads) <= 2, big.reads


def test_last_touches_few_row_groups(big: CountingReader) -> None:
    for partition in range(4):
        big.reads.clear()
        last = big.last(partition)
        assert last is not None and (last.partition, last.offset) == (partition, 99_998)
        assert len(big.reads) <= 2
    big.reads.clear()
    assert big.last(7) is None and big.read(7, 0, 10) == [] and big.reads == []


def test_a_partition_s_last_entry_is_read_once(big: CountingReader) -> None:
    """A ledger never changes: its partitions' last entries, once read, are answered again without a read
    (a warm view's /last costs no request to the store)."""
    first = [big.last(p) for p in range(4)]
    big.reads.clear()
    assert [big.last(p) for p in range(4)] == first and big.last(7) is None
    assert big.reads == []


# -- LedgerHandle ------------------------------------------------------------------------------


def test_retire_waits_for_outstanding_readers(reader: LedgerReader) -> None:
    handle = LedgerHandle(reader)
    done: list[str] = []
    first, second = handle.acquire(), handle.acquire()
    assert first is second is reader and handle.readers == 2
    handle.retire(lambda: done.append("deleted"))
    with pytest.raises(LedgerRetired, match="replaced"):
        handle.acquire()
    handle.release()
    assert done == [] and handle.readers == 1
    handle.release()
    assert done == ["deleted"] and handle.readers == 0
    with pytest.raises(RuntimeError, match="without a matching acquire"):
        handle.release()
    with pytest.raises(RuntimeError, match="already retired"):
        handle.retire(lambda: done.append("again"))
    assert done == ["deleted"]


def test_retire_without_readers_runs_at_once_and_reading_releases(reader: LedgerReader) -> None:
    handle = LedgerHandle(reader)
    with handle.reading() as r, pytest.raises(KeyError):
        assert r.read(4, 0, 1)[0].offset == 7
        raise KeyError("the block fails: the reader is released all the same")
    assert handle.readers == 0
    done: list[int] = []
    handle.retire(lambda: done.append(1))
    assert done == [1] and handle.retired
    with pytest.raises(LedgerRetired), handle.reading():
        pass


def test_a_failing_cleanup_does_not_fail_the_reader(
    reader: LedgerReader, caplog: pytest.LogCaptureFixture
) -> None:
    handle = LedgerHandle(reader)
    handle.acquire()
    handle.retire(lambda: 1 / 0)  # type: ignore[func-returns-value]
    handle.release()
    assert "ZeroDivisionError" in caplog.text


def test_a_switch_never_deletes_files_from_under_readers(store: LedgerStore) -> None:
    old = build(store, "busy", ROWS, files=2, row_group_size=50)
    old_id = old.manifest.ledger_id
    store.switch("busy", old_id)
    handle = LedgerHandle(old)
    results: list[bool] = []
    errors: list[BaseException] = []
    go = threading.Barrier(9)
    retired = threading.Event()

    def work() -> None:
        try:
            with handle.reading() as r:
                go.wait()
                for start in range(0, 300, 30):
                    results.append(r.read(0, start, 20) == expected(0, start, 20))
                    retired.wait()  # keep reading after the switch and the retire
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(8)]
    for w in workers:
        w.start()
    go.wait()
    new = build(store, "busy", ROWS[:10], files=1, row_group_size=50)
    store.switch("busy", new.manifest.ledger_id)
    handle.retire(lambda: store.delete_ledger("busy", old_id))
    assert store.ledger_path("busy", old_id).exists() and handle.readers == 8
    retired.set()
    for w in workers:
        w.join()
    assert errors == [] and len(results) == 80 and all(results)
    assert handle.readers == 0 and not store.ledger_path("busy", old_id).exists()
