"""Everything a plug-in author implements or is given, in one place (Pulsar's PIP-278 and PIP-215).

- ``CompactionServiceFactory``: chosen by ``compactionServiceFactoryClassName`` (``module:Class``),
  resolved once at start-up; it makes one ``TopicCompactionService`` per topic.
- ``TopicCompactionService``: compacts one topic and serves its compacted view.
- ``CompactionStrategy``: decides which record of a key survives (``compactionStrategy``).
- ``BrokerMetadata``: what the broker says about its topics (partitions, ids, log starts, ends); one
  instance per daemon, given to the factory in the ``ServiceContext``.
- ``TaskProbe`` (in ``compactord.task``): sees every task's states and checkpoints; a no-op in
  production, the seam through which tests hold a task at a chosen point.

What the daemon asks of a factory or a service beyond these bases, each a protocol that an
implementation may have (the daemon checks with ``isinstance``; without it, the daemon does without):

- ``RuntimeOwner`` / ``EngineRuntime``: a process-wide runtime the runs need (the Spark factory's session
  and JVM), which the daemon starts and warms in the background, watches and stops.
- ``StrategyCatalog``: the strategies a topic's policy may choose.
- ``SampledPreviews``: the sampled estimate of ``GET .../compaction/preview`` (from the topic's current
  ledger and its strategy in force).
- ``IdleGuarded``: a service whose topic's folder the periodic sweep may clean, under its guard.

This module imports only leaf modules (``model``, ``errors``, ``task``; ``config`` for types).

Implementations do not repeat these docstrings.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from compactord.errors import BrokerUnavailable, CompactordError
from compactord.task import TaskProbe

if TYPE_CHECKING:
    from compactord.config import Settings
    from compactord.errors import LedgerCorrupt
    from compactord.model import (
        CompactedPage,
        CompactedRows,
        Entry,
        Horizon,
        LedgerManifest,
        PartitionOffsets,
        Position,
        RecordFingerprint,
        TopicConfigs,
    )
    from compactord.task import CompactionTaskCtx

__all__ = [
    "BrokerMetadata",
    "CompactionServiceFactory",
    "CompactionStrategy",
    "EngineRuntime",
    "IdleGuarded",
    "OrderedCompactionStrategy",
    "RuntimeOwner",
    "SampledPreviews",
    "ServiceContext",
    "StrategyCatalog",
    "TopicCompactionService",
]


class BrokerMetadata(ABC):
    """What the broker says about its topics. Thread-safe; built once per daemon and passed where it
    is needed (the daemon, the API, the engine's planning), so that tests come in at one place.

    Every method raises ``BrokerUnavailable`` when the broker does not answer.
    """

    @abstractmethod
    def list_topics(self) -> list[str]:
        """The broker's topic names, sorted."""

    @abstractmethod
    def ping(self) -> None:
        """Return when the broker answers a metadata request. :raises BrokerUnavailable: it does not."""

    @abstractmethod
    def partitions(self, topic: str) -> list[int]:
        """The topic's partition numbers, sorted. :raises TopicNotFound: the broker has no such topic."""

    @abstractmethod
    def topic_id(self, topic: str) -> str | None:
        """The topic's id (Metadata v10+), or None where the broker reports none.

        :raises TopicNotFound: the broker has no such topic.
        """

    @abstractmethod
    def offsets(self, topic: str) -> dict[int, PartitionOffsets]:
        """Per partition: the log start and the committed end (the last stable offset), fixed now.

        :raises TopicNotFound: the broker has no such topic.
        """

    def log_now(self, topic: str, horizon: Mapping[int, int]) -> tuple[str | None, dict[int, PartitionOffsets]]:
        """The topic's id and offsets as the identity check of a ledger of ``horizon`` needs them: an end at or
        below a partition's horizon confirmed (as ``offsets`` confirms it), one above it as listed, marked
        ``end_confirmed=False`` (a read could only find it further on: no evidence of a new log either way). This
        default: ``topic_id`` and ``offsets``, every end confirmed.

        :raises TopicNotFound: the broker has no such topic.
        """
        return self.topic_id(topic), self.offsets(topic)

    @abstractmethod
    def first_records(self, topic: str, at: Mapping[int, int],
                      offsets: Mapping[int, PartitionOffsets]) -> dict[int, RecordFingerprint | None]:
        """Per partition of ``at``: the first data record at or after that offset, read_committed (one
        small fetch each), or None when the log holds none there (the offset is below the log start or
        at its end). ``offsets``: the topic's offsets as the caller fetched them for the same run: whether an
        offset is in the log, and where each read stops, are judged against them.

        :raises TopicNotFound: the broker has no such topic.
        """

    def offsets_with_records(self, topic: str, at: Mapping[int, int]
                             ) -> tuple[dict[int, PartitionOffsets], dict[int, RecordFingerprint | None]]:
        """``offsets(topic)`` and ``first_records(topic, at, those offsets)``, as a run's planning asks for
        both (a broker may read them at the same time).

        :raises TopicNotFound: the broker has no such topic.
        """
        offsets = self.offsets(topic)
        return offsets, (self.first_records(topic, at, offsets) if at else {})

    def offsets_and_identity(self, topic: str, at: Mapping[int, int]
                             ) -> tuple[dict[int, PartitionOffsets], dict[int, RecordFingerprint | None], str | None]:
        """``offsets_with_records(topic, at)`` and ``topic_id(topic)``: the log as a run's planning sees it (a
        broker may ask once for what both need).

        :raises TopicNotFound: the broker has no such topic.
        """
        offsets, found = self.offsets_with_records(topic, at)
        return offsets, found, self.topic_id(topic)

    @abstractmethod
    def topic_configs(self, topic: str) -> TopicConfigs:
        """The topic's cleanup configs (DescribeConfigs); every field None where the broker does not say.

        :raises TopicNotFound: the broker has no such topic.
        """

    def describe_many(self, topics: Sequence[str], stopping: Callable[[], bool] = lambda: False
                      ) -> dict[str, tuple[str | None, dict[int, PartitionOffsets], TopicConfigs] | CompactordError]:
        """Per topic: its id, offsets and cleanup configs, or the error that kept them (``TopicNotFound``, ...),
        in as few requests as the broker allows (a client may batch them: one metadata, one DescribeConfigs
        and one ListOffsets per broker for every topic). This default asks topic by topic, and stops asking
        once ``stopping()`` says so (the topics not asked are left out).

        :raises BrokerUnavailable: no broker answers at all (a topic whose leader alone is unreachable is that
            topic's error).
        """
        found: dict[str, tuple[str | None, dict[int, PartitionOffsets], TopicConfigs] | CompactordError] = {}
        for topic in topics:
            if stopping():
                break
            try:
                offsets = self.offsets(topic)
                found[topic] = (self.topic_id(topic), offsets, self.topic_configs(topic))
            except CompactordError as exc:
                if isinstance(exc, BrokerUnavailable):
                    try:
                        self.ping()
                    except CompactordError:
                        raise exc from None
                found[topic] = exc
        return found

    @abstractmethod
    def close(self) -> None:
        """Release the connections."""


class ServiceContext:
    """What a factory is initialised with: the settings and the process-wide resources.

    ``spark``: a ``SparkSessionManager`` to share (tests, the demo): a factory that uses Spark runs on it
    and never stops it; None: such a factory builds its own, and stops it when the daemon stops its
    runtime (``RuntimeOwner``); a factory that does not use Spark ignores it. ``store``: the
    ``LedgerStore`` of the ledger root (it holds the root's lock); ``broker``: the daemon's
    ``BrokerMetadata``; ``probe`` sees every task's states and checkpoints (a no-op unless a test passes
    one). A factory builds what is None itself, and then closes it.
    """

    def __init__(self, settings: Settings, *, spark: Any = None, store: Any = None,
                 broker: BrokerMetadata | None = None, probe: TaskProbe | None = None) -> None:
        self.settings = settings
        self.spark = spark
        self.store = store
        self.broker = broker
        self.probe = probe or TaskProbe()


class TopicCompactionService(ABC):
    """Compaction of one topic, and reads of its compacted view."""

    @abstractmethod
    def compact(self, *, rebuild: bool = False, start: bool = True) -> CompactionTaskCtx:
        """Start a compaction and return its task at once (PIP-387's ``CompactionTaskCtx compact()``).

        :param rebuild: ignore the current ledger and read the topic from its log start.
        :param start: False leaves the task in state ``Pending`` until ``task.start()`` (the daemon
            uses this while a task waits for a free slot).
        :raises CompactionAlreadyRunning: a task of this topic has not ended yet.
        :raises TopicNotFound: the broker has no such topic (may also fail the task instead).
        """

    @abstractmethod
    def read_compacted_page(self, start: Position, n: int, include_markers: bool = False,
                            ledger_id: int | None = None, max_bytes: int | None = None) -> CompactedPage:
        """Up to ``n`` live entries of ``start.partition`` with offset >= ``start.offset``, in offset
        order, with the manifest of the one ledger they were read from: the current one, or the pinned
        ``ledger_id`` while it is current or in its grace period after a switch (``LedgerRetired``
        after it).

        Served from the current ledger with pyarrow, never through Spark. Event-time deletion markers
        are returned only with ``include_markers`` (the compacted reader needs them to apply the
        strategy); the read API for applications never asks for them.

        ``max_bytes`` bounds the page's memory: it holds entries until their ``Entry.raw_bytes`` would
        pass it (always at least one entry), and ``truncated`` says that it stopped there.

        :raises NotCompacted: the topic has no ledger.
        :raises LedgerCorrupt: the current ledger's files are missing or fail their checksum.
        :raises InvalidArgument: ``n`` < 1, ``max_bytes`` < 1, or a negative partition or offset.
        """

    def read_compacted_rows(self, start: Position, n: int, include_markers: bool = False,
                            ledger_id: int | None = None, max_bytes: int | None = None) -> CompactedRows:
        """``read_compacted_page``'s entries as Arrow columns (``model.RECORD_SCHEMA``), for a reader that needs
        no Python object per entry (the Kafka listener writes them as record batches). By default the page's
        entries made a table; a service that reads its ledgers with pyarrow gives their columns as read.

        :raises NotCompacted, LedgerCorrupt, InvalidArgument: as ``read_compacted_page``.
        """
        from compactord.model import CompactedRows, entries_table

        page = self.read_compacted_page(start, n, include_markers, ledger_id, max_bytes)
        return CompactedRows(page.ledger, entries_table(page.entries), page.truncated)

    @abstractmethod
    def read_last_compacted_page(self, partition: int, ledger_id: int | None = None) -> CompactedPage:
        """The last live entry of ``partition`` (no entry for an empty partition), with its ledger (the
        current one, or the pinned ``ledger_id`` as for ``read_compacted_page``).

        :raises NotCompacted: the topic has no ledger.
        :raises LedgerCorrupt: the current ledger's files are missing or fail their checksum.
        """

    def read_compacted_entries(self, start: Position, n: int, include_markers: bool = False) -> list[Entry]:
        """PIP-278's spelling: the entries of ``read_compacted_page``."""
        return self.read_compacted_page(start, n, include_markers).entries

    def read_last_compacted_entry(self, partition: int) -> Entry | None:
        """PIP-278's spelling: the entry of ``read_last_compacted_page``, or None."""
        entries = self.read_last_compacted_page(partition).entries
        return entries[0] if entries else None

    @abstractmethod
    def get_last_compacted_position(self) -> Horizon | None:
        """The compaction horizon: per partition, the last offset the current ledger covers
        (-1 for a partition that never had records). None if the topic was never compacted."""

    @abstractmethod
    def ledger_info(self, ledger_id: int | None = None) -> LedgerManifest | None:
        """The current ledger's manifest, or None if the topic was never compacted; with ``ledger_id``,
        that ledger's while it is readable (``LedgerRetired`` after)."""

    @abstractmethod
    def corrupt_ledger(self) -> LedgerCorrupt | None:
        """What was found wrong with the current ledger when it was last verified (it is then not
        served and the next run rebuilds it), or None."""

    @abstractmethod
    def delete(self) -> None:
        """Remove the topic's ledgers and horizon (the topic was deleted).

        :raises CompactionAlreadyRunning: a task of this topic has not ended yet; cancel it first.
        """

    @abstractmethod
    def close(self) -> None:
        """Release what the service holds; the ledger stays on disk."""


class CompactionServiceFactory(ABC):
    """Makes the per-topic services. One instance per daemon, chosen at start-up."""

    @abstractmethod
    def initialize(self, context: ServiceContext) -> None:
        """Called once before any other method.

        :raises CompactordError: the factory cannot work with these settings.
        """

    @abstractmethod
    def new_topic_compaction_service(self, topic: str) -> TopicCompactionService:
        """The service of ``topic`` (the same object for the same topic while the factory lives).

        :raises InvalidTopicName: ``topic`` breaks Kafka's naming rule.
        """

    def existing_topic_compaction_service(self, topic: str) -> TopicCompactionService | None:
        """The service of ``topic`` if the factory holds anything of it (a ledger, a task, a service
        made before), else None; creates and keeps nothing for a name it has never seen. The API's reads
        use it, so that reads of names that do not exist leave no state behind.

        The default calls ``new_topic_compaction_service`` (a factory that does not override it keeps a
        service for every name read).

        :raises InvalidTopicName: ``topic`` breaks Kafka's naming rule.
        """
        return self.new_topic_compaction_service(topic)

    @abstractmethod
    def set_topic_strategy(self, topic: str, ref: str | None) -> None:
        """Use the strategy ``ref`` (a built-in name or ``module:Class``) for ``topic`` from its next
        run on (a topic policy); None returns to ``compactionStrategy``.

        :raises ConfigError: ``ref`` names no strategy.
        """

    def set_topic_limits(self, topic: str, *, key_ttl_ms: int | None = None,
                         max_read_bytes_per_second: int | None = None) -> None:
        """Use these limits for ``topic`` from its next run on (its policy's ``keyTtlMs`` and
        ``maxReadBytesPerSecond``); None returns to ``compactionKeyTtlMs`` and
        ``compactionMaxReadBytesPerSecond``. The default ignores them (a factory without such limits)."""

    @abstractmethod
    def close(self) -> None:
        """Release the factory's resources (not its runtime: the daemon stops that, ``RuntimeOwner``)."""


@runtime_checkable
class EngineRuntime(Protocol):
    """A process-wide runtime that a factory's runs need (the Spark factory's: its session and JVM). The
    daemon starts it in the background while it serves reads, and runs compactions once it is warm."""

    @property
    def warmed(self) -> bool:
        """Started and warmed up: compactions may run on it (``/readyz`` waits for it)."""
        ...

    def start(self, scratch: Path | None) -> None:
        """Start it and warm it up, on a thread of the daemon's. ``scratch``: a local folder for the
        warm-up's files (None: the host's temporary folder).

        :raises Exception: it cannot start; the daemon then exits (2 for a ``ConfigError``, else 70).
        """
        ...

    def alive(self, timeout: float) -> bool:
        """False once it has died, or when it does not answer within ``timeout`` seconds (hung); the
        daemon then exits so that its supervisor restarts it."""
        ...

    def stop(self) -> None:
        """Stop it, if the factory made it (one given in the ``ServiceContext`` is left running)."""
        ...


@runtime_checkable
class RuntimeOwner(Protocol):
    """A factory that has an ``EngineRuntime``. A factory that is not one runs no runtime of its own:
    compactions can run as soon as the broker answers."""

    def runtime(self) -> EngineRuntime:
        """The factory's runtime (the same object each time); not started yet when ``initialize`` returns."""
        ...


@runtime_checkable
class StrategyCatalog(Protocol):
    """A factory that says which strategies a topic's policy may choose. For a factory that does not,
    the daemon allows ``compactionStrategy`` and the ``compactionStrategyPlugins`` references."""

    def allowed_strategies(self) -> tuple[str, ...]:
        """The strategy references ``set_topic_strategy`` accepts from a policy, each spelled exactly so;
        choosing one imports nothing new."""
        ...


@runtime_checkable
class SampledPreviews(Protocol):
    """A factory that estimates the next compaction of a topic from a sample (the preview's default; a
    factory that cannot answers only ``?exact=true``)."""

    def sampled_preview(self, topic: str, offsets: Mapping[int, PartitionOffsets],
                        check: Callable[[LedgerManifest], object]) -> dict[str, Any]:
        """The estimate for ``topic`` at the broker's ``offsets``, from its current ledger (``check`` is
        called with that ledger's manifest before it is read, and may raise) and its strategy in force:
        ``records_kept``, ``records_removed``, ``bytes_kept``, ``bytes_removed``, ``sample_records`` (the
        records read) and ``tail_records`` (the records past the ledger's horizon).

        :raises LedgerCorrupt: the current ledger fails verification.
        """
        ...


@runtime_checkable
class IdleGuarded(Protocol):
    """A service whose topic's folder under the ledger root the periodic sweep may clean: what no pointer
    names, below the highest ledger id read under its guard. A service that is not one is never swept."""

    def idle_guard(self) -> AbstractContextManager[bool]:
        """Hold the topic's guard (no task of it starts meanwhile); give whether no task of the topic runs
        nor is still stopping."""
        ...


class CompactionStrategy(ABC):
    """Which record of a key survives, per topic partition (Pulsar's ``TopicCompactionStrategy``).

    The general form is a left fold in offset order: with ``prev`` the record kept so far for a key
    and ``cur`` the next one, ``should_keep_left(prev, cur)`` True keeps ``prev``; False lets ``cur``
    replace it (a tombstone ``cur`` deletes the key). The first record of a key, or the first after a
    deletion, is always taken.

    Records are ``compactord.model.Entry`` objects; ``Entry.is_tombstone`` tells deletions apart.
    """

    #: The name written into a ledger's manifest; a change of it forces a full rebuild.
    name: ClassVar[str] = "custom"

    @abstractmethod
    def should_keep_left(self, prev: Entry, cur: Entry) -> bool:
        """True to keep ``prev`` and drop ``cur``."""


class OrderedCompactionStrategy(CompactionStrategy):
    """A strategy that is a total order: the record with the highest ``order_key`` wins.

    Tombstones take part in the order like any record: a winning tombstone deletes the key, a
    losing one does nothing. Because a maximum can be taken in any grouping, the Kafka reader drops
    a key's losers inside each reading task, so that Spark sees few rows.
    """

    #: The same order as a Spark SQL expression over the record columns, when it has one: the engine
    #: then picks winners natively (``max_by``) instead of calling ``order_key`` per row in Python.
    sql_order: ClassVar[str | None] = None

    @abstractmethod
    def order_key(self, record: Entry) -> tuple[Any, ...]:
        """A sortable key; the highest wins. Must be unique per partition (end with the offset)."""

    def should_keep_left(self, prev: Entry, cur: Entry) -> bool:
        return self.order_key(prev) > self.order_key(cur)
