"""A small stand-in of the daemon's ledgers as the Kafka listener's view (``TopicView``) reads them: ledgers by
id, one of them current, a retired one raising ``LedgerRetired`` as the daemon's do, and a switch that changes
the pointer's generation as the daemon's store does (``LedgerStore.pointer_generation``). It counts its
``ledger_info`` calls and page reads. The view has no I/O of its own: its tests use this, not a daemon."""

from __future__ import annotations

from compactord.errors import LedgerRetired
from compactord.model import (
    CompactedPage,
    CompactedRows,
    Entry,
    LedgerManifest,
    Position,
    StrategySettings,
    entries_table,
)

__all__ = ["LedgerHost", "Ledgers"]


class Ledgers:
    """One topic's ledgers (a ``TopicCompactionService``'s reads) and its pointer's generation (the store's)."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.ledgers: dict[int, tuple[dict[int, int], list[Entry]]] = {}
        self.current = 0
        self.retired: set[int] = set()
        self.reads = 0
        self.infos = 0
        self.generation = 0

    def add(self, ledger_id: int, entries: list[Entry], horizon: dict[int, int] | None = None) -> None:
        """Switch to ledger ``ledger_id`` (horizon: by default ``{0: 9}``); the one it replaces is retired."""
        self.ledgers[ledger_id] = ({0: 9} if horizon is None else horizon, entries)
        if self.current:
            self.retired.add(self.current)
        self.current = ledger_id
        self.generation += 1

    # -- the service's reads ----------------------------------------------------------------------

    def ledger_info(self, ledger_id: int | None = None) -> LedgerManifest | None:
        self.infos += 1
        if ledger_id in self.retired:
            raise LedgerRetired(f"ledger {ledger_id} was replaced", topic=self.topic, ledger_id=ledger_id)
        wanted = self.current if ledger_id is None else ledger_id
        if not wanted:
            return None
        return LedgerManifest(ledger_id=wanted, topic=self.topic, horizon=dict(self.ledgers[wanted][0]),
                              strategy=StrategySettings(), files=[], created_at_ms=1000 + wanted)

    def read_compacted_page(self, start: Position, n: int, include_markers: bool = False,
                            ledger_id: int | None = None, max_bytes: int | None = None) -> CompactedPage:
        self.reads += 1
        manifest = self.ledger_info(ledger_id)
        assert manifest is not None
        found = [e for e in self.ledgers[manifest.ledger_id][1]
                 if e.partition == start.partition and e.offset >= start.offset][:n]
        return CompactedPage(manifest, found)

    def read_compacted_rows(self, start: Position, n: int, include_markers: bool = False,
                            ledger_id: int | None = None, max_bytes: int | None = None) -> CompactedRows:
        page = self.read_compacted_page(start, n, include_markers, ledger_id, max_bytes)
        return CompactedRows(page.ledger, entries_table(page.entries), page.truncated)

    # -- the store's ------------------------------------------------------------------------------

    def topics(self) -> list[str]:
        return [self.topic]

    def pointer_generation(self, topic: str) -> int:
        return self.generation


class LedgerHost:
    """The parts of the daemon ``TopicView`` reads (``ListenerHost``), over one topic's ``Ledgers``: the topic
    admitted, no log start moved, the broker's topic the ledger's log."""

    def __init__(self, ledgers: Ledgers) -> None:
        self.service = ledgers
        self.registry = self
        self.monitor = self
        self.identities = self
        self.store = ledgers
        self.ignored: frozenset[str] = frozenset()

    def existing_service(self, topic: str) -> Ledgers | None:
        return self.service if topic == self.service.topic else None

    def watches(self, topic: str) -> bool:
        return topic == self.service.topic

    def log_starts(self, topic: str) -> dict[int, int]:
        return {}

    def check(self, topic: str, manifest: LedgerManifest) -> None:
        return None
