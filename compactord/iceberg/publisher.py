"""``TablePublisher``: each topic's switched ledger committed to its Iceberg table, off the switch's path.

The daemon hands a topic over after each successful run (``switched``); one thread commits the topic's current
ledger then (``table.commit_ledger``), one commit at a time. The queue holds each topic once (a topic switched
again before its commit is committed once, at its newest ledger), so it is bounded by the number of topics.
A commit that fails is logged in one line and leaves the topic's lag (``compactord_iceberg_lag_ledgers``: the
switches not yet in its table) where it was; the next switch commits the newest ledger and brings the table
level. Nothing here fails a compaction or holds a read.

The ledger's part files are referenced where they are: by their absolute paths on a local root, by their
``s3://`` URLs on an object store's root (``ObjectStore.uri``); the catalog and the FileIO that reads them are
``catalogs.py``'s.

The table's lifecycle, on the same thread: at ``start`` (and for a topic a cluster's member takes,
``catch_up``) every topic's table is checked, paced, and its current ledger committed when the table is missing
or behind (so idle topics appear); a table whose topic has no ledger any more is dropped (``drop_table``, never
a purge), and so is a deleted topic's (``deleted``). Only the topics ``owns`` answers for are published, and
none whose policy says ``iceberg: false`` (``enabled``). After each look at a table the ledger ids its retained
snapshots name are known (``retained``: the ledger store keeps those ledgers, ``LedgerStore.keep_also``), and
``released`` is called so that the ledgers expired from the table are deleted: expiry before deletion.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from compactord.config import Settings
from compactord.iceberg.catalogs import opener
from compactord.ledger.store import LedgerStore

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

__all__ = ["TablePublisher", "open_publisher"]

log = logging.getLogger(__name__)

_USERINFO = re.compile(r"://[^/@\s]*@")  # a URL's user and password, in an error's message
CATCH_UP_TOPICS_PER_SECOND = 20.0  # tables looked at per second by the catch-up pass (a burst on no catalog)


def open_publisher(settings: Settings, store: LedgerStore,
                   set_lag: Callable[[str, int], None]) -> TablePublisher | None:
    """The publisher ``icebergCatalogUri`` asks for (None: the key is empty, Iceberg is off).

    :raises ConfigError: the URI names no catalog compactord opens, or pyiceberg (the ``[iceberg]`` extra) is
        missing (``catalogs.opener``)."""
    if not settings.iceberg_catalog_uri:
        return None
    catalog = opener(settings, store.objects)
    return TablePublisher(store, catalog, settings.iceberg_namespace, settings.iceberg_snapshots_retained, set_lag)


class TablePublisher:
    def __init__(self, store: LedgerStore, catalog: Callable[[], Catalog], namespace: str, retained: int,
                 set_lag: Callable[[str, int], None], per_second: float = CATCH_UP_TOPICS_PER_SECOND) -> None:
        """``catalog``: opens the catalog (at the first commit, and again after a commit failed);
        ``set_lag``: told each topic's lag, in ledgers, whenever it changes; ``per_second``: the pace of the
        catch-up pass (tables looked at per second at most)."""
        self._store = store
        self._open_catalog = catalog
        self._catalog: Catalog | None = None
        self._namespace = namespace
        self._retained = retained
        self._set_lag = set_lag
        self._pace_s = 1.0 / per_second if per_second > 0 else 0.0
        # Set by the daemon: whether this process owns the topic (a cluster's member: holds its partition),
        # whether its policy publishes it, and what to call once the table's retained ledgers are known.
        self.owns: Callable[[str], bool] = lambda topic: True
        self.enabled: Callable[[str], bool] = lambda topic: True
        self.released: Callable[[str], object] = lambda topic: None
        self._lock = threading.Condition()
        self._queued: dict[str, bool] = {}  # topics to commit, in the order they came, each once (True: drop first)
        self._pass: list[str] | None = None  # the catch-up pass's topics left (None: the tables not listed yet)
        self._passing = False
        self._pass_only: Callable[[str], bool] | None = None
        self._lag: dict[str, int] = {}
        self._errors: dict[str, str] = {}  # each topic's last commit error, its first line
        self._kept: dict[str, set[int]] = {}  # the ledger ids each table's snapshots name, as last read
        self._stopping = False
        self._thread: threading.Thread | None = None

    # -- what the daemon tells it -----------------------------------------------------------------

    def start(self) -> None:
        """Catch every table up: the root's topics and the namespace's tables, paced on the publisher's thread."""
        with self._lock:
            self._passing, self._pass, self._pass_only = True, None, None
            self._wake()

    def catch_up(self, topics: list[str]) -> None:
        """Catch ``topics`` up (a cluster's member took them): what is known of their tables is forgotten (their
        ledgers are all kept until the table is read again), then each is committed if its table is behind."""
        with self._lock:
            for topic in topics:
                self._kept.pop(topic, None)
                self._queued.setdefault(topic, False)
            self._wake()

    def switched(self, topic: str) -> None:
        """A run of ``topic`` succeeded: its current ledger is committed, soon, on the publisher's thread."""
        with self._lock:
            self._lag[topic] = self._lag.get(topic, 0) + 1
            self._set_lag(topic, self._lag[topic])
            self._queued.setdefault(topic, False)
            self._wake()

    def deleted(self, topic: str) -> None:
        """``topic`` was deleted: its table is dropped on the publisher's thread (before a commit of a topic of
        the same name created since)."""
        with self._lock:
            self._lag.pop(topic, None)
            self._errors.pop(topic, None)
            self._kept[topic] = set()
            self._queued.pop(topic, None)
            self._queued[topic] = True
            self._wake()

    def stop(self) -> None:
        """Commit nothing more (a commit under way ends)."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()

    # -- what it answers ---------------------------------------------------------------------------

    def lag(self, topic: str) -> int:
        """Switches of ``topic`` not yet in its table."""
        with self._lock:
            return self._lag.get(topic, 0)

    def retained(self, topic: str) -> set[int] | None:
        """The ledger ids the retained snapshots of the topic's table name (None: the table not read since the
        start or since the topic was taken: any ledger may be named)."""
        with self._lock:
            kept = self._kept.get(topic)
            return None if kept is None else set(kept)

    def warning(self, topic: str) -> str | None:
        """What the topic's status says while its table is behind (None: level)."""
        with self._lock:
            lag, error = self._lag.get(topic, 0), self._errors.get(topic)
        if lag <= 0:
            return None
        return (f"its Iceberg table {self._namespace}.{topic} is {lag} ledger(s) behind the current ledger"
                + (f" (last commit error: {error})" if error else "") + "; the next switch commits again")

    # -- the publisher's thread --------------------------------------------------------------------

    def _wake(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="iceberg", daemon=True)
            self._thread.start()
        self._lock.notify()

    def _next(self) -> tuple[str, bool, bool] | None:
        """The next topic (a switched or deleted one first, then the catch-up pass's), whether its table is
        dropped first, and whether it is the pass's (paced); None: stopping."""
        with self._lock:
            while not self._stopping:
                if self._queued:
                    topic = next(iter(self._queued))
                    return topic, self._queued.pop(topic), False
                if self._passing and self._pass is None:
                    return "", False, True  # list the pass's topics
                if self._pass:
                    return self._pass.pop(0), False, True
                self._passing = False
                self._lock.wait()
            return None

    def _run(self) -> None:
        while (item := self._next()) is not None:
            topic, drop, paced = item
            if paced and not topic:
                self._list_pass()
                continue
            if not drop and not self.owns(topic):
                continue  # another member's (a deleted topic's table is dropped by who deleted it): unpaced
            self._publish(topic, drop)
            if paced and self._pace_s:
                with self._lock:
                    self._lock.wait_for(lambda: self._stopping or bool(self._queued), self._pace_s)

    def _list_pass(self) -> None:
        """The catch-up pass's topics: the root's and the namespace's tables (those of topics gone, to drop)."""
        from compactord.iceberg.table import table_names

        try:
            topics = set(self._store.topics()) | set(table_names(self._catalog_now(), self._namespace))
        except Exception as exc:  # noqa: BLE001 (the catalog or the root down: the next start catches up)
            self._failed("", "catalog not read for the catch-up at start", exc)
            topics = set()
        with self._lock:
            self._pass = sorted(topics)

    def _catalog_now(self) -> Catalog:
        if self._catalog is None:
            self._catalog = self._open_catalog()
        return self._catalog

    def _publish(self, topic: str, drop: bool) -> None:
        """Bring the topic's table level with its current ledger: dropped first if ``drop`` (or if the topic has
        no ledger any more), created if missing, committed if behind; then its retained ledgers are known and
        ``released`` is called. A failure is logged in one line; the lag stays."""
        from compactord.iceberg.table import commit_ledger, drop_table, table_ledgers

        with self._lock:
            counted = self._lag.get(topic, 0)
        try:
            if not drop and not self.enabled(topic):
                self._level(topic, counted, set())  # its table (if any) is left as it is, and keeps nothing
                return
            ledger_id = self._store.current_ledger_id(topic)
            catalog = self._catalog_now()
            if drop or ledger_id is None:
                if drop_table(catalog, self._namespace, topic):
                    log.info("topic %s: its Iceberg table %s.%s dropped", topic, self._namespace, topic)
                if ledger_id is None:
                    self._level(topic, counted, set(), release=False)  # no ledger left to delete
                    return
            found = table_ledgers(catalog, self._namespace, topic)
            named = found[0] if found is not None else None
            if named is None or named < ledger_id:
                with self._lock:
                    if self._lag.get(topic, 0) == 0:  # behind without a switch counted: caught up now
                        self._lag[topic] = counted = 1
                        self._set_lag(topic, 1)
                manifest = self._store.load_manifest(topic, ledger_id)
                folder = self._store.ledger_key(topic, ledger_id)
                paths = [self._store.objects.uri(f"{folder}/{part['name']}") for part in manifest.files]
                if commit_ledger(catalog, self._namespace, manifest, paths, self._retained):
                    log.info("topic %s: ledger %d committed to Iceberg table %s.%s", topic, ledger_id,
                             self._namespace, topic)
                found = table_ledgers(catalog, self._namespace, topic)
        except Exception as exc:  # noqa: BLE001 (a catalog's or pyiceberg's error: logged, the next switch retries)
            self._failed(topic, "its Iceberg table not " + ("dropped" if drop else "committed"), exc)
            return
        self._level(topic, counted, found[1] if found is not None else set())

    def _level(self, topic: str, counted: int, kept: set[int], release: bool = True) -> None:
        with self._lock:
            self._kept[topic] = kept
            self._errors.pop(topic, None)
            if topic in self._lag:
                self._lag[topic] = max(0, self._lag[topic] - counted)
                self._set_lag(topic, self._lag[topic])
        if not release:
            return
        try:
            self.released(topic)
        except Exception as exc:  # noqa: BLE001 (the root's error: the ledgers go at the sweep or next release)
            log.warning("topic %s: ledgers its Iceberg table no longer names not deleted yet: %s", topic,
                        _first_line(exc))

    def _failed(self, topic: str, what: str, exc: Exception) -> None:
        self._catalog = None
        first = _first_line(exc)
        if topic:
            with self._lock:
                self._errors[topic] = f"{type(exc).__name__}: {first}"
            retry = "the next start drops it" if what.endswith("dropped") else "the next switch commits again"
            log.warning("topic %s: %s (%s: %s); %s", topic, what, type(exc).__name__, first, retry)
        else:
            log.warning("Iceberg %s (%s: %s); tables are caught up at each switch", what, type(exc).__name__, first)


def _first_line(exc: BaseException) -> str:
    """An error's first line, with no password a URL in it may carry, and bounded."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return _USERINFO.sub("://***@", first)[:300]
