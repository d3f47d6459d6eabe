"""The ledger's part files as reading tasks write them (``ledger.parts``), and what sealing a ledger does
with a part a dead task attempt left half-written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compactord.errors import LedgerCorrupt
from compactord.ledger import checksums, manifests, parts
from compactord.ledger.parts import ROW_GROUP_ROWS, is_partial_part, is_seal, part_name, seal_name, write_part
from compactord.ledger.row_groups import (
    FileSlice,
    ledger_row_groups,
    max_partition_rows,
    partition_groups,
    partition_rows,
)
from compactord.ledger.store import LedgerStore
from compactord.model import RECORD_SCHEMA, LedgerManifest, StrategySettings
from compactord.storage import LocalStore


def table(n: int, value_bytes: int = 10, partition: int = 0) -> pa.Table:
    return pa.Table.from_pylist(
        [{"partition": partition, "offset": i, "timestamp": i, "key": b"k%d" % i, "value": b"v" * value_bytes,
          "headers": [], "event_time": i, "marker": False, "marker_at": None} for i in range(n)],
        RECORD_SCHEMA)


def test_part_names_sort_as_their_partitions() -> None:
    names = [part_name(p) for p in (0, 2, 10, 123, 2**31 - 1)]
    assert names == sorted(names) and all(n.startswith("part-") and n.endswith(".parquet") for n in names)


def test_row_groups_are_bounded_by_rows_and_by_bytes(tmp_path: Path) -> None:
    write_part(table(20_000), LocalStore(tmp_path), "small.parquet")
    groups = pq.ParquetFile(tmp_path / "small.parquet").metadata
    assert groups.num_rows == 20_000 and groups.num_row_groups == 3
    assert max(groups.row_group(i).num_rows for i in range(3)) == ROW_GROUP_ROWS
    # 200 rows of 100 KB: the 8 MiB bound makes groups of ~80 rows, with statistics for the read API.
    write_part(table(200, value_bytes=100_000), LocalStore(tmp_path), "big.parquet")
    big = pq.ParquetFile(tmp_path / "big.parquet").metadata
    assert big.num_row_groups >= 3 and max(big.row_group(i).num_rows for i in range(big.num_row_groups)) < 100
    stats = big.row_group(1).column(1).statistics
    assert stats.has_min_max and stats.min > 0
    assert pq.read_table(tmp_path / "big.parquet").equals(table(200, value_bytes=100_000))


def test_offsets_and_times_are_delta_encoded_and_only_the_bounds_read_have_statistics(tmp_path: Path) -> None:
    """Offsets and times grow row by row: delta-encoded, a partition of 20,000 rows takes a fraction of the
    bytes they take plain, and reads back exactly; statistics are kept where ``row_groups`` reads them."""
    rows = table(20_000)
    write_part(rows, LocalStore(tmp_path), "delta.parquet")
    pq.write_table(rows, tmp_path / "plain.parquet", compression="snappy", use_dictionary=False)
    delta, plain = pq.ParquetFile(tmp_path / "delta.parquet").metadata, pq.ParquetFile(tmp_path / "plain.parquet").metadata

    def column_bytes(meta: pq.FileMetaData, name: str) -> int:
        index = meta.schema.names.index(name)
        return sum(meta.row_group(g).column(index).total_compressed_size for g in range(meta.num_row_groups))

    for name in ("offset", "timestamp", "event_time"):
        index = delta.schema.names.index(name)
        assert "DELTA_BINARY_PACKED" in delta.row_group(0).column(index).encodings
        assert column_bytes(delta, name) * 4 < column_bytes(plain, name)
    assert pq.read_table(tmp_path / "delta.parquet").equals(rows)
    group = delta.row_group(0)
    with_stats = {delta.schema.names[i] for i in range(group.num_columns) if group.column(i).is_stats_set}
    assert {"partition", "offset"} <= with_stats and not with_stats & {"key", "value"}


def test_the_footers_bound_and_locate_each_partition_s_rows(tmp_path: Path) -> None:
    """Read once by the driver: how many rows a partition may have (``max_partition_rows``), and which
    files and row groups a reading task opens for it (``partition_groups``), no other."""
    write_part(table(20_000, partition=0), LocalStore(tmp_path), part_name(0))
    write_part(table(100, partition=1), LocalStore(tmp_path), part_name(1))
    mixed = pa.concat_tables([table(30, partition=1), table(50, partition=2)])
    pq.write_table(mixed, tmp_path / "mixed.parquet")  # one group over partitions 1 and 2
    files = [tmp_path / part_name(0), tmp_path / part_name(1), tmp_path / "mixed.parquet"]
    groups = ledger_row_groups(files)
    assert max_partition_rows(groups) == 20_000
    assert max_partition_rows(ledger_row_groups(files[1:])) == 180  # partition 1: 100 + the shared group's 80
    assert max_partition_rows([]) == 0
    assert partition_groups(groups, 1) == [FileSlice(str(files[1]), [0]), FileSlice(str(files[2]), [0])]
    # Partition 0 from offset 19,000: only the last of its three groups (8,192 rows each at most).
    assert partition_groups(groups, 0, 19_000) == [FileSlice(str(files[0]), [2])]
    rows = partition_rows(partition_groups(groups, 0, 19_000), 0, 19_000)
    assert rows["offset"].to_pylist() == list(range(19_000, 20_000))
    assert partition_rows(partition_groups(groups, 2), 2)["offset"].to_pylist() == list(range(50))
    assert partition_groups(groups, 3) == [] and partition_rows([], 3).num_rows == 0


def test_no_rows_write_no_file(tmp_path: Path) -> None:
    write_part(table(0), LocalStore(tmp_path), part_name(0))
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_leaves_nothing_under_any_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk in the middle of the file, and again when the writer is closed: the first error is raised."""

    class FullDisk:
        def __init__(self, where: Path, schema: pa.Schema, **kwargs: object) -> None:
            self.where = Path(where)
            self.where.write_bytes(b"PAR1 half a file")

        def write_table(self, t: pa.Table, **kwargs: object) -> None:
            raise OSError(28, "No space left on device")

        def close(self) -> None:
            raise OSError(28, "No space left on device (the footer)")

    monkeypatch.setattr(parts.pq, "ParquetWriter", FullDisk)
    with pytest.raises(OSError, match="No space left on device$"):
        write_part(table(5), LocalStore(tmp_path), part_name(3))
    assert list(tmp_path.iterdir()) == []


def test_a_part_written_from_tables_one_after_another(tmp_path: Path) -> None:
    """Tables given one after another are one part file, in their order, with the same row groups rule; when
    the next table cannot be made, nothing is left under any name and the error is the caller's."""
    first, second = table(10_000), table(3, value_bytes=5)
    write_part(iter([first, table(0), second]), LocalStore(tmp_path), part_name(0))
    written = pq.ParquetFile(tmp_path / part_name(0))
    assert written.read().equals(pa.concat_tables([first, second]))
    assert [written.metadata.row_group(i).num_rows for i in range(written.metadata.num_row_groups)] == \
        [ROW_GROUP_ROWS, 10_000 - ROW_GROUP_ROWS, 3]

    def cut_short() -> Iterator[pa.Table]:
        yield first
        raise RuntimeError("compaction cancelled while reading partition 1")

    with pytest.raises(RuntimeError, match="cancelled"):
        write_part(cut_short(), LocalStore(tmp_path), part_name(1))
    assert sorted(p.name for p in tmp_path.iterdir()) == [seal_name(part_name(0)), part_name(0)]


def test_sealing_a_ledger_removes_a_dead_attempt_s_partial_part(tmp_path: Path) -> None:
    """A task attempt killed while it wrote its part, or the entry beside it, leaves a temporary file of
    either: sealing the ledger removes both."""
    with LedgerStore(tmp_path / "root") as store:
        ledger_id, path = store.allocate_ledger("t")
        path.mkdir()
        write_part(table(10), LocalStore(path), part_name(0))
        partial = path / f".{part_name(1)}.4242.tmp"
        partial.write_bytes(b"PAR1 cut short")
        partial_seal = path / f"{seal_name(part_name(0))}.4243.tmp"
        partial_seal.write_text('{"rows": 1')
        assert is_partial_part(partial.name) and not is_partial_part(part_name(1))
        assert is_partial_part(partial_seal.name) and not is_partial_part(seal_name(part_name(0)))
        manifest = LedgerManifest(ledger_id=ledger_id, topic="t", horizon={0: 9},
                                  strategy=StrategySettings("publishing-order", "timestamp", False), files=[],
                                  records_read=10)
        sealed = store.finalize_ledger("t", ledger_id, manifest)
        assert [f["name"] for f in sealed.files] == [part_name(0)] and sealed.records_kept == 10
        assert sorted(p.name for p in path.iterdir()) == ["manifest.json", part_name(0)]
        store.verify("t", ledger_id)


def _marked(n: int, at: dict[int, int], partition: int = 0) -> pa.Table:
    """``table(n)`` with the rows of offsets in ``at`` made deletion markers, each entered at ``at[offset]``."""
    rows = table(n, partition=partition).to_pylist()
    for row in rows:
        if row["offset"] in at:
            row.update(value=None, marker=True, marker_at=at[row["offset"]])
    return pa.Table.from_pylist(rows, RECORD_SCHEMA)


def _manifest(ledger_id: int) -> LedgerManifest:
    return LedgerManifest(ledger_id=ledger_id, topic="t", horizon={0: 99}, files=[], records_read=100,
                          strategy=StrategySettings("publishing-order", "timestamp", False))


def test_a_part_is_sealed_by_its_writer_and_the_ledger_then_reads_none(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``write_part`` leaves the part's manifest entry beside it (rows, deletion markers and the oldest of them,
    CRC-32C, size): sealing the ledger takes it without opening or reading the part, and removes it."""
    with LedgerStore(tmp_path / "root") as store:
        ledger_id, path = store.allocate_ledger("t")
        path.mkdir()
        write_part(iter([_marked(60, {7: 5_000}), _marked(40, {}), _marked(30, {2: 4_000, 9: 6_000})]),
                   LocalStore(path), part_name(0))
        assert sorted(p.name for p in path.iterdir()) == [seal_name(part_name(0)), part_name(0)]
        assert is_seal(seal_name(part_name(0))) and not is_seal(part_name(0))
        crc = checksums.file_crc32c(path / part_name(0))

        def not_here(*args: object, **kwargs: object) -> None:
            raise AssertionError("the part was read to seal the ledger")

        monkeypatch.setattr(manifests.pq, "ParquetFile", not_here)
        sealed = store.finalize_ledger("t", ledger_id, _manifest(ledger_id))
        monkeypatch.undo()
        assert sealed.files == [{"name": part_name(0), "bytes": (path / part_name(0)).stat().st_size, "crc32c": crc,
                                 "rows": 130}]
        assert (sealed.markers, sealed.records_kept, sealed.oldest_marker_at_ms) == (3, 127, 4_000)
        assert sorted(p.name for p in path.iterdir()) == ["manifest.json", part_name(0)]
        store.verify("t", ledger_id)


def test_an_entry_that_no_longer_describes_its_part_is_not_taken(tmp_path: Path) -> None:
    """A part written again after its entry (another task attempt; here a file renamed over it), and an entry
    that does not parse: each part is read and checksummed when the ledger is sealed, as Spark's are."""
    with LedgerStore(tmp_path / "root") as store:
        ledger_id, path = store.allocate_ledger("t")
        path.mkdir()
        write_part(_marked(50, {3: 1_000}), LocalStore(path), part_name(0))
        again = path / "again.parquet"
        pq.write_table(_marked(20, {}), again)
        again.replace(path / part_name(0))  # the entry beside it still says 50 rows and one marker
        write_part(table(10, partition=1), LocalStore(path), part_name(1))
        (path / seal_name(part_name(1))).write_text("{not json")
        sealed = store.finalize_ledger("t", ledger_id, _manifest(ledger_id))
        assert [(f["name"], f["rows"], f["crc32c"]) for f in sealed.files] == [
            (part_name(p), n, checksums.file_crc32c(path / part_name(p))) for p, n in ((0, 20), (1, 10))]
        assert (sealed.markers, sealed.records_kept) == (0, 30)
        assert sorted(p.name for p in path.iterdir()) == ["manifest.json", part_name(0), part_name(1)]
        store.verify("t", ledger_id)


def test_a_part_written_to_an_s3_store_is_sealed_from_its_seal_object(s3_server, monkeypatch) -> None:
    """On an object store the part is written on the local disk, put, and the local file removed; its seal is
    an object beside it, which sealing the ledger takes (reading no part) and removes."""
    import tempfile

    store = s3_server.store()
    spooled = set(Path(tempfile.gettempdir()).glob("compactord-*"))
    write_part(iter([_marked(60, {7: 5_000}), _marked(40, {})]), store, f"t/ledger-1/{part_name(0)}")
    write_part(table(10, partition=1), store, f"t/ledger-1/{part_name(1)}")
    assert set(Path(tempfile.gettempdir()).glob("compactord-*")) == spooled
    assert [i.key for i in store.list("t/ledger-1/")] == [
        f"t/ledger-1/{seal_name(part_name(0))}", f"t/ledger-1/{seal_name(part_name(1))}",
        f"t/ledger-1/{part_name(0)}", f"t/ledger-1/{part_name(1)}"]

    def not_here(*args: object) -> None:
        raise AssertionError("a part was read to seal the ledger")

    monkeypatch.setattr(manifests, "_read_part", not_here)
    sealed = manifests.finalize(_manifest(1), store, "t/ledger-1/")
    monkeypatch.undo()
    assert [(f["name"], f["rows"]) for f in sealed.files] == [(part_name(0), 100), (part_name(1), 10)]
    assert (sealed.markers, sealed.records_kept) == (1, 109)
    assert [i.key.rpartition("/")[2] for i in store.list("t/ledger-1/")] == [
        "manifest.json", part_name(0), part_name(1)]
    manifests.verify(store, "t/ledger-1/", "t", 1)
    with store.open_input(f"t/ledger-1/{part_name(1)}") as f:
        assert pq.read_table(f).num_rows == 10


def test_verifying_a_ledger_on_s3_lists_it_and_reads_a_part_only_once_it_was_written_again(s3_server) -> None:
    """A manifest on S3 records each part's version (its ETag): a part listed at that version is the part
    written and is not read; a part written again (a new version) is read and checksummed."""
    store = s3_server.store()
    prefix = "t/ledger-2/"
    write_part(table(50, partition=0), store, f"{prefix}{part_name(0)}")
    sealed = manifests.finalize(_manifest(2), store, prefix)
    [entry] = sealed.files
    assert entry["version"] == store.head(prefix + part_name(0)).version
    reads: list[str] = []
    get = store.get

    def counted(key: str, *args: Any, **kwargs: Any) -> bytes:
        reads.append(key)
        return get(key, *args, **kwargs)

    store.get = counted  # type: ignore[method-assign]
    store.open_input = lambda key: pytest.fail(f"{key} was opened to verify it")  # type: ignore[method-assign]
    manifests.verify(store, prefix, "t", 2)
    assert reads == [prefix + "manifest.json"]

    # Written again with other bytes of the same size: another version, so read, and its checksum fails.
    data = bytearray(get(prefix + part_name(0)))
    data[len(data) // 2] ^= 0xFF
    store.put(prefix + part_name(0), bytes(data))
    del store.open_input  # the store's own again
    with pytest.raises(LedgerCorrupt, match="fails its checksum"):
        manifests.verify(store, prefix, "t", 2)
