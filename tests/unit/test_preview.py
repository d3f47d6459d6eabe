"""The preview's ledger totals over real Parquet files (pyarrow, no Spark)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from compactord.engine.preview import kept_digest, ledger_totals
from compactord.model import RECORD_SCHEMA


def _ledger_file(path, rows):
    cols = list(zip(*rows, strict=True))
    table = pa.Table.from_arrays([
        pa.array(cols[0], pa.int32()), pa.array(cols[1], pa.int64()), pa.array([0] * len(rows), pa.int64()),
        pa.array(cols[2], pa.binary()), pa.array(cols[3], pa.binary()),
        pa.array([[] for _ in rows], RECORD_SCHEMA.field("headers").type), pa.nulls(len(rows), pa.int64()),
        pa.array(cols[4], pa.bool_()), pa.nulls(len(rows), pa.int64()),
    ], schema=RECORD_SCHEMA)
    pq.write_table(table, path)
    return str(path)


def test_ledger_totals_count_live_entries_bytes_markers_and_the_keys_asked_for(tmp_path):
    files = [
        _ledger_file(tmp_path / "a.parquet", [(0, 1, b"k1", b"vvv", False), (0, 2, b"gone", None, True)]),
        _ledger_file(tmp_path / "b.parquet", [(1, 5, b"k2", b"", False), (1, 6, None, b"nk", False)]),
    ]
    totals = ledger_totals(files, {b"k2", b"gone", b"absent"})
    assert (totals.live, totals.bytes, totals.markers) == (3, 2 + 3 + 2 + 0 + 2, 1)
    assert totals.matched == {(1, b"k2"): 2}  # a marker is no live entry
    assert ledger_totals([]).live == 0
    assert kept_digest([(0, 1), (1, 5)]) == kept_digest([(1, 5), (0, 1)]) != kept_digest([(0, 1)])
