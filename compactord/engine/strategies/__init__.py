"""The built-in strategies, strategy loading, and the per-range reducers used by the Kafka reader.

- ``publishing-order`` (default): the highest offset wins (Pulsar's PublishingOrderCompactor).
- ``event-time`` (PIP-352, KIP-280): the highest (has event time, event time, offset) wins.
- ``first-value`` (PIP-215 style): a key's first value stays until a tombstone deletes it.
- ``module:Class``: a ``CompactionStrategy`` subclass of the operator's.

A reducer takes the rows one reading task read, in offset order, and returns the indexes of the rows
that Spark still needs: for an order, each key's best row; for first-value, at most two rows per key;
for a general custom strategy, every row. Null-key rows are never passed to a reducer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from compactord.engine.strategies.event_time import EventTimeOrder, reduce_event_time
from compactord.engine.strategies.first_value import FirstValue, reduce_first_value
from compactord.engine.strategies.publishing_order import PublishingOrder, reduce_last_offset
from compactord.engine.strategies.rows import ROW_KEY, Reducer, Row, row_entry
from compactord.errors import ConfigError, PluginLoadError
from compactord.event_time import event_time_extractor, parse_event_time_header, validate_event_time_source
from compactord.interfaces import CompactionStrategy, OrderedCompactionStrategy
from compactord.model import Entry, StrategySettings
from compactord.refs import resolve_ref

if TYPE_CHECKING:
    from compactord.config import Settings

__all__ = [
    "BUILTIN_REDUCERS",
    "BUILTIN_STRATEGIES",
    "EventTimeOrder",
    "FirstValue",
    "PublishingOrder",
    "ResolvedStrategy",
    "StrategyPlan",
    "allowed_strategies",
    "event_time_extractor",
    "fold",
    "load_strategy",
    "load_strategy_plugins",
    "parse_event_time_header",
    "plan_for",
    "reducer_for",
    "row_entry",
    "strategy_name",
    "validate_event_time_source",
]

BUILTIN_STRATEGIES: dict[str, type[CompactionStrategy]] = {
    PublishingOrder.name: PublishingOrder,
    EventTimeOrder.name: EventTimeOrder,
    FirstValue.name: FirstValue,
}
BUILTIN_REDUCERS: dict[type[CompactionStrategy], Reducer] = {
    PublishingOrder: reduce_last_offset,
    EventTimeOrder: reduce_event_time,
    FirstValue: reduce_first_value,
}


def load_strategy(value: str, key: str = "compactionStrategy") -> CompactionStrategy:
    """A strategy from its built-in name or a ``module:Class`` reference.

    :raises ConfigError: neither a built-in name nor a resolvable ``CompactionStrategy`` subclass.
    """
    if value in BUILTIN_STRATEGIES:
        return BUILTIN_STRATEGIES[value]()
    if ":" not in value and "." not in value:
        raise ConfigError(
            key, value, f"use one of {', '.join(BUILTIN_STRATEGIES)} or a 'module:Class' reference"
        )
    cls = resolve_ref(key, value)
    if not (isinstance(cls, type) and issubclass(cls, CompactionStrategy)):
        raise PluginLoadError(key, value, "the class must subclass compactord.interfaces.CompactionStrategy")
    try:
        return cls()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        raise PluginLoadError(key, value, f"the class cannot be instantiated without arguments ({exc})") from exc


def allowed_strategies(settings: Settings) -> tuple[str, ...]:
    """What a topic's policies may choose (over HTTP): the built-in names, ``compactionStrategy`` and the
    ``compactionStrategyPlugins`` references, each spelled exactly so; choosing one imports nothing new."""
    return tuple(dict.fromkeys([*BUILTIN_STRATEGIES, settings.compaction_strategy, *settings.strategy_plugins]))


def load_strategy_plugins(settings: Settings) -> None:
    """Load and check every ``compactionStrategyPlugins`` reference (at start-up, once).

    :raises PluginLoadError: a reference that names no ``CompactionStrategy`` subclass.
    """
    for ref in settings.strategy_plugins:
        load_strategy(ref, key="compactionStrategyPlugins")


def strategy_name(strategy: CompactionStrategy, configured: str) -> str:
    """The name recorded in manifests: the built-in name (also when a built-in class is named by its
    ``module:Class`` reference, old or new), or the configured reference."""
    return strategy.name if type(strategy) in BUILTIN_STRATEGIES.values() else configured


@dataclass(frozen=True, slots=True)
class ResolvedStrategy:
    """The strategy in force for a topic: as configured (``ref``, loaded again inside the readers), the
    instance, and the settings recorded in manifests (a change of them forces a full rebuild)."""

    ref: str
    strategy: CompactionStrategy
    settings: StrategySettings

    @classmethod
    def resolve(cls, ref: str, event_time_source: str, retain_null_key: bool,
                key: str = "compactionStrategy", empty_value_is_tombstone: bool = False) -> ResolvedStrategy:
        """:raises ConfigError: ``ref`` names no strategy."""
        strategy = load_strategy(ref, key)
        name = strategy_name(strategy, ref)
        ref = name if name in BUILTIN_STRATEGIES else ref  # the readers load a built-in by its name
        return cls(ref, strategy, StrategySettings(name, event_time_source, retain_null_key,
                                                   empty_value_is_tombstone))


def _reduce_custom_order(strategy: OrderedCompactionStrategy) -> Reducer:
    def reduce(rows: Sequence[Row]) -> list[int]:
        best: dict[bytes, tuple[object, int]] = {}
        for i, row in enumerate(rows):
            rank = strategy.order_key(row_entry(row))
            key = row[ROW_KEY]
            if key not in best or rank > best[key][0]:  # type: ignore[operator]
                best[key] = (rank, i)
        return sorted(i for _, i in best.values())

    return reduce


def _keep_all(rows: Sequence[Row]) -> list[int]:
    return list(range(len(rows)))


def _declared_by(cls: type, name: str) -> type | None:
    """The class in ``cls``'s MRO that defines ``name``."""
    return next((c for c in cls.__mro__ if name in c.__dict__), None)


@dataclass(frozen=True, slots=True)
class StrategyPlan:
    """How the engine runs a strategy, decided once from what its class declares, so that the readers'
    reducer and the Spark job never disagree (a subclass of a built-in that overrides ``order_key``
    or ``should_keep_left`` loses the built-in's shortcuts, in both places)."""

    reducer: Reducer
    sql_order: str | None = None  # pick winners natively with max_by over this order
    first_value: bool = False  # the native first-value query
    # A winning deletion stays in the ledger as a marker for ``compactionTombstoneRetentionMs`` (Kafka's
    # ``delete.retention.ms``), so that a reader past it (the Kafka listener) sees the delete. Only where a
    # marker cannot change a later winner, or is meant to (event-time: a late record ranked below it).
    keeps_deletion_markers: bool = False
    # The winner may be any record of a key, not always its last: the strategy needs a key's earlier
    # records, which retention or a broker's own cleaner may remove (every strategy but publishing-order).
    needs_losers: bool = True


def plan_for(strategy: CompactionStrategy) -> StrategyPlan:
    cls = type(strategy)
    markers = isinstance(strategy, EventTimeOrder)
    if isinstance(strategy, OrderedCompactionStrategy):
        order_at = _declared_by(cls, "order_key")
        # Ordered by offset, any later record of the key ranks above its marker: a marker blocks nothing. A
        # plug-in's own order might rank a later record below it, so the plug-in keeps none.
        markers = markers or order_at is PublishingOrder
        sql_at = _declared_by(cls, "sql_order")
        # An SQL order counts only where it was declared with (or below) the order_key it mirrors.
        sql = strategy.sql_order if sql_at is not None and order_at is not None and issubclass(sql_at, order_at) \
            else None
        builtin = BUILTIN_REDUCERS.get(order_at) if order_at in (PublishingOrder, EventTimeOrder) else None
        return StrategyPlan(builtin or _reduce_custom_order(strategy), sql, False, markers,
                            needs_losers=order_at is not PublishingOrder)
    if _declared_by(cls, "should_keep_left") is FirstValue:
        # A marker is a deletion: the first value after it wins, as after the tombstone it remembers.
        return StrategyPlan(reduce_first_value, None, True, True)
    return StrategyPlan(_keep_all, None, False, markers)


def reducer_for(strategy: CompactionStrategy) -> Reducer:
    return plan_for(strategy).reducer


def fold(strategy: CompactionStrategy, records: Sequence[Entry]) -> Entry | None:
    """The winner of one key's records, in offset order; None if the key ends deleted.

    For an ordered strategy a winning tombstone is returned (the caller turns it into a deletion or a
    marker); for a general strategy a deletion returns None.
    """
    if isinstance(strategy, OrderedCompactionStrategy):
        return max(records, key=strategy.order_key) if records else None
    kept: Entry | None = None
    for cur in records:
        if kept is None or not strategy.should_keep_left(kept, cur):
            kept = None if cur.is_tombstone else cur
    return kept
