"""The listing's pages and filters over the rows it keeps (``daemon/listing.py``): every topic once, in name
order, ``limit`` at a time after ``after``; by prefix and by state (running, failed, behind); a bad limit or
state is refused naming what is allowed."""

from __future__ import annotations

import pytest

from compactord.daemon.backlogs import Backlog
from compactord.daemon.listing import TopicRow, TopicRows, select
from compactord.errors import InvalidArgument, LedgerCorrupt

POLICY = {"thresholdBytes": 0, "thresholdMessages": 10, "maxLagSeconds": 0, "minDirtyRatio": 0}


def row(error: Exception | None = None) -> TopicRow:
    return TopicRow(None, None, error, "publishing-order", dict(POLICY), False)  # type: ignore[arg-type]


def rows() -> TopicRows:
    kept = TopicRows()
    kept.replace({f"t{i:02d}": row() for i in range(7)} | {"broken": row(LedgerCorrupt("bad pointer"))},
                 {f"t{i:02d}": None for i in range(7)}.keys() | {"only-broker"}, 0.0)
    return kept


def pick(**query: object) -> list[list[str]]:
    kept, out, after = rows(), [], None
    backlogs = {"t01": Backlog("t01", 50, 500, 1.0, 0), "t02": Backlog("t02", 5, 50, 1.0, 0)}
    while True:
        page = select(kept, {"tasked"}, lambda _t: None, lambda t: object() if t == "tasked" else None,  # type: ignore[arg-type,return-value]
                      backlogs, {}, after=after, **query)  # type: ignore[arg-type]
        out.append(page.topics)
        after = page.next_after
        if after is None:
            return out


def test_pages_cover_every_topic_once_in_order():
    names = sorted([f"t{i:02d}" for i in range(7)] + ["broken", "only-broker", "tasked"])
    assert pick(limit=1000) == [names]
    paged = pick(limit=3)
    assert [t for p in paged for t in p] == names and [len(p) for p in paged] == [3, 3, 3, 1]


def test_filters():
    assert pick(prefix="t0", limit=4) == [["t00", "t01", "t02", "t03"], ["t04", "t05", "t06"]]
    assert pick(state="behind") == [["t01"]]
    assert pick(state="running") == [["tasked"]]
    assert pick(state="failed") == [["broken"]]


@pytest.mark.parametrize("query", [{"limit": 0}, {"limit": 1001}, {"state": "asleep"}])
def test_bad_queries_are_refused(query):
    with pytest.raises(InvalidArgument, match="limit must be|state must be one of running, failed, behind"):
        pick(**query)
