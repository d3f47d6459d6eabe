"""The ledger store: compacted ledgers as Parquet files under one root, and reads of them with pyarrow.

``store.LedgerStore`` owns the root (its lock, ids, manifests, the ``CURRENT`` pointer, orphans,
durable topic deletion), every object through the root's ``compactord.storage.ObjectStore``, with
``pointer`` (the compare-and-swap pointer, its retired list, ledger ids, the writer epoch), ``manifests``
(sealing, loading, verifying a ledger's manifest) and ``removal`` (deletion, orphans); ``quarantine`` moves
aside ledgers found without their ``CURRENT``;
``reader.LedgerReader`` reads one verified ledger; ``reader.LedgerHandle`` counts its readers so that
a switch never deletes files from under a read; ``row_groups`` reads the files' footers (a partition's
row groups, its rows from those alone).
"""

from __future__ import annotations

from compactord.ledger.reads import LedgerHandle, LedgerReader, LedgerRetired
from compactord.ledger.row_groups import RowGroup
from compactord.ledger.store import LedgerStore

__all__ = ["LedgerHandle", "LedgerReader", "LedgerRetired", "LedgerStore", "RowGroup"]
