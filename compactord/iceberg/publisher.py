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
"""

from __future__ import annotations

import logging
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
                 set_lag: Callable[[str, int], None]) -> None:
        """``catalog``: opens the catalog (at the first commit, and again after a commit failed);
        ``set_lag``: told each topic's lag, in ledgers, whenever it changes."""
        self._store = store
        self._open_catalog = catalog
        self._catalog: Catalog | None = None
        self._namespace = namespace
        self._retained = retained
        self._set_lag = set_lag
        self._lock = threading.Condition()
        self._queued: dict[str, None] = {}  # topics to commit, in the order they came, each once
        self._lag: dict[str, int] = {}
        self._thread: threading.Thread | None = None

    def switched(self, topic: str) -> None:
        """A run of ``topic`` succeeded: its current ledger is committed, soon, on the publisher's thread."""
        with self._lock:
            self._lag[topic] = self._lag.get(topic, 0) + 1
            self._set_lag(topic, self._lag[topic])
            self._queued[topic] = None
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="iceberg", daemon=True)
                self._thread.start()
            self._lock.notify()

    def lag(self, topic: str) -> int:
        """Switches of ``topic`` not yet in its table."""
        with self._lock:
            return self._lag.get(topic, 0)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queued:
                    self._lock.wait()
                topic = next(iter(self._queued))
                del self._queued[topic]
                counted = self._lag.get(topic, 0)
            if self._publish(topic):
                with self._lock:
                    self._lag[topic] = max(0, self._lag.get(topic, 0) - counted)
                    self._set_lag(topic, self._lag[topic])

    def _publish(self, topic: str) -> bool:
        """Commit the topic's current ledger; False when it failed (logged)."""
        from compactord.iceberg.table import commit_ledger

        try:
            ledger_id = self._store.current_ledger_id(topic)
            if ledger_id is None:
                return True
            manifest = self._store.load_manifest(topic, ledger_id)
            folder = self._store.ledger_key(topic, ledger_id)
            paths = [self._store.objects.uri(f"{folder}/{part['name']}") for part in manifest.files]
            if self._catalog is None:
                self._catalog = self._open_catalog()
            committed = commit_ledger(self._catalog, self._namespace, manifest, paths, self._retained)
        except Exception as exc:  # noqa: BLE001 (a catalog's or pyiceberg's error: logged, the next switch retries)
            self._catalog = None
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            log.warning("topic %s: its Iceberg table not committed (%s: %s); the next switch commits again",
                        topic, type(exc).__name__, first)
            return False
        if committed:
            log.info("topic %s: ledger %d committed to Iceberg table %s.%s", topic, ledger_id, self._namespace, topic)
        return True
