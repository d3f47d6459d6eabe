"""A partition's new winners merged into its previous ledger rows in the reading task
(``merge.merge_into_ledger``): under publishing-order, in Arrow alone."""

from __future__ import annotations

import pyarrow as pa
import pytest

from compactord.engine import merge
from compactord.engine.merge import columns_to_batch, merge_into_ledger
from compactord.engine.strategies.publishing_order import reduce_last_offset
from compactord.model import RECORD_SCHEMA


def table(rows: list[tuple[int, bytes | None, bytes | None]], headers: bool = False) -> pa.Table:
    """Rows (offset, key, value) of partition 0, in offset order."""
    offsets = [o for o, _, _ in rows]
    stamps = [1_700_000_000_000 + o for o in offsets]
    batch = columns_to_batch(0, offsets, stamps, [k for _, k, _ in rows], [v for _, _, v in rows],
                             [[("h", b"%d" % o)] if headers and o % 2 else None for o in offsets], stamps)
    return pa.Table.from_batches([batch], RECORD_SCHEMA)


LEDGER = table([(0, b"a", b"a0"), (3, b"b", b"b3"), (5, b"c", b"c5"), (8, None, b"n8"), (9, b"d", b"d9")],
               headers=True)
CASES = {
    "some keys contested": table([(10, b"b", b"b10"), (12, b"e", b"e12"), (15, b"a", None)]),
    "every key contested": table([(11, b"a", b"a11"), (12, b"b", b"b12"), (13, b"c", b"c13"), (14, b"d", b"d14")],
                                 headers=True),
    "none contested, a null key": table([(10, None, b"n10"), (11, b"z", b"z11")]),
    "no ledger rows": table([(10, b"a", b"a10")]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_publishing_order_merges_in_arrow_what_the_reducer_over_rows_would(case, monkeypatch):
    """The tail's winner of a key the ledger also holds replaces the ledger's row (it is the key's last
    record): the result is, row for row, what the strategy's reducer over both as rows gives, and no row
    leaves Arrow for it."""
    winners = CASES[case]
    ledger = LEDGER.slice(0, 0) if case == "no ledger rows" else LEDGER
    through_rows = merge_into_ledger(winners, ledger, lambda rows: reduce_last_offset(rows))  # the general path

    def no_rows(_table: pa.Table) -> list:
        raise AssertionError("a row left Arrow")

    monkeypatch.setattr(merge, "_rows", no_rows)
    merged = merge_into_ledger(winners, ledger, reduce_last_offset)
    assert merged.to_pylist() == through_rows.to_pylist()
    assert merged.column("offset").to_pylist() == sorted(merged.column("offset").to_pylist())
    if case == "some keys contested":
        assert [(r["key"], r["value"]) for r in merged.to_pylist()] == [
            (b"c", b"c5"), (None, b"n8"), (b"d", b"d9"), (b"b", b"b10"), (b"e", b"e12"), (b"a", None)]
