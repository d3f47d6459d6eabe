"""What the engine's parts are given by the part that owns them, as protocols, so that each depends on
what it uses rather than on its owner's module (the factory makes services, a service starts runs; none
imports back up):

- ``EngineResources``: what the factory shares with its topics' services and their runs.
- ``TopicLedger``: what a run needs of its topic's service (the current ledger, its switch, the
  retirement of the ledger it replaces).

These are the engine's own seams, not plug-in interfaces (those are in ``compactord.interfaces``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from compactord.config import Settings
    from compactord.engine.spark_session import SparkSessionManager
    from compactord.engine.strategies import ResolvedStrategy
    from compactord.interfaces import BrokerMetadata
    from compactord.ledger.pointer import Pointer
    from compactord.ledger.reads import LedgerHandle
    from compactord.ledger.store import LedgerStore
    from compactord.task import TaskProbe

__all__ = ["EngineResources", "TopicLedger"]


class EngineResources(Protocol):
    """The daemon's settings, ledger store, Spark session and broker, and each topic's limits in force."""

    @property
    def settings(self) -> Settings: ...

    @property
    def store(self) -> LedgerStore: ...

    @property
    def spark(self) -> SparkSessionManager: ...

    @property
    def broker(self) -> BrokerMetadata: ...

    @property
    def probe(self) -> TaskProbe: ...

    def strategy_for(self, topic: str) -> ResolvedStrategy:
        """The strategy in force for ``topic`` (its policy's, else the configured one)."""
        ...

    def key_ttl_ms_for(self, topic: str) -> int:
        """The key expiry in force for ``topic`` in milliseconds (0: off)."""
        ...

    def max_read_rate_for(self, topic: str) -> int:
        """The read budget of one compaction of ``topic`` in bytes per second (0: unlimited)."""
        ...

    def forget(self, topic: str) -> None:
        """Drop the service of ``topic`` (its ledgers were deleted)."""
        ...


class TopicLedger(Protocol):
    """One topic's current ledger, as a run of that topic reads and replaces it."""

    @property
    def topic(self) -> str: ...

    @property
    def factory(self) -> EngineResources: ...

    def current(self, *, recheck: bool = False) -> LedgerHandle | None:
        """The verified current ledger (its files checked again if ``recheck``).

        :raises LedgerCorrupt: the current ledger fails verification.
        """
        ...

    def switch_to(self, handle: LedgerHandle, ledger_id: int,
                  base: Pointer | None = None) -> tuple[LedgerHandle | None, Exception | None]:
        """Make ``handle`` current if the pointer is still ``base``; return the ledger it replaced in memory
        and any error past the commit point (the switch then stands).

        :raises Fenced: the pointer changed since ``base`` (another writer switched); nothing changed.
        :raises Exception: the switch failed before its commit point (the previous ledger stays current).
        """
        ...

    def keep_retired(self, handle: LedgerHandle, ledger_id: int, delete: Callable[[], None]) -> None:
        """Keep a replaced ledger readable by id for its grace period, then retire it and ``delete`` it."""
        ...
