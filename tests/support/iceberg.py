"""What the Iceberg tests compare: a topic's compacted view from the daemon's HTTP API, and the rows a scan of its
table returns (every row of a snapshot is a live key's: a tombstone or a deletion marker in the scan is a row
the view does not have, so the two sets differ)."""

from __future__ import annotations

import base64
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from compactord.iceberg.table import ledger_id_of
from tests.support.daemon import DaemonProcess, metric
from tests.support.waiting import wait_for

__all__ = ["PARTITIONS", "Row", "committed", "ledger_id", "table_rows", "view_rows"]

PARTITIONS = 2
Row = tuple[int, int, bytes, bytes | None]  # partition, offset, key, value


def view_rows(daemon: DaemonProcess, topic: str, ledger_id: int | None = None) -> set[Row]:
    """The topic's compacted view (of ledger ``ledger_id``, else the current one), as the API pages it."""
    rows: set[Row] = set()
    for partition in range(PARTITIONS):
        params: dict[str, Any] = {"partition": partition, "limit": 10000}
        if ledger_id is not None:
            params["ledger_id"] = ledger_id
        response = daemon.http.get(f"/v1/topics/{topic}/compacted", params=params)
        assert response.status_code == 200, response.text
        rows |= {(e["partition"], e["offset"], base64.b64decode(e["key"]),
                  None if e["value"] is None else base64.b64decode(e["value"])) for e in response.json()["entries"]}
    return rows


def ledger_id(daemon: DaemonProcess, topic: str) -> int:
    response = daemon.http.get(f"/v1/topics/{topic}/horizon")
    assert response.status_code == 200, response.text
    return int(response.json()["ledger_id"])


def table_rows(table: pa.Table) -> set[Row]:
    """Every row a scan returned, none filtered."""
    return set(zip(table["partition"].to_pylist(), table["offset"].to_pylist(), table["key"].to_pylist(),
                   table["value"].to_pylist(), strict=True))


def committed(daemon: DaemonProcess, catalog: Catalog, topic: str, namespace: str = "compactord") -> Table:
    """The topic's table (in ``namespace``) once it names the topic's current ledger and its lag is 0."""
    current = ledger_id(daemon, topic)

    def level() -> Table | None:
        if metric(daemon, "compactord_iceberg_lag_ledgers", topic=topic) != 0:
            return None
        try:
            table = catalog.load_table((namespace, topic))
        except NoSuchTableError:
            return None
        return table if ledger_id_of(table.current_snapshot()) == current else None

    table = wait_for(level, 60, f"topic {topic}'s table at ledger {current}", daemon)
    assert table is not None  # wait_for returns the first truthy answer
    return table
