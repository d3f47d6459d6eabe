"""The compacted view as an Apache Iceberg table (``icebergCatalogUri``; pyiceberg, the ``[iceberg]`` extra):
each switched ledger committed as one snapshot that references the ledger's part files in place."""

from __future__ import annotations

from compactord.iceberg.publisher import TablePublisher, open_publisher

__all__ = ["TablePublisher", "open_publisher"]
