"""Ledgers found without their ``CURRENT`` pointer: moved aside, never removed.

A topic folder that holds a finalized ledger (one with ``manifest.json``) but no ``CURRENT`` lost its
pointer (a disk or an operator took it): the ledgers may be the only copy of data the log has since
deleted, so ``LedgerStore.open()`` moves them to ``<root>/@compactord/quarantine/<topic>/<time>/`` and
logs it, and the daemon counts the folders there (``compactord_quarantined_topics``: one per topic and time). A folder holding
only an unfinished first run (no manifest) is an orphan, removed as such.
"""

from __future__ import annotations

import logging
import time

from compactord.ledger import layout
from compactord.ledger.layout import CURRENT, LEDGER_RE, MANIFEST
from compactord.ledger.pointer import read_pointer
from compactord.storage import ObjectStore

__all__ = ["lost_pointer", "quarantine", "quarantined"]

log = logging.getLogger("compactord.ledger.store")  # one logger for what open() finds


def _ledgers(objects: ObjectStore, topic: str) -> list[str]:
    return [name[:-1] for name in objects.children(layout.topic_prefix(topic))
            if name.endswith("/") and LEDGER_RE.fullmatch(name[:-1])]


def lost_pointer(objects: ObjectStore, topic: str) -> bool:
    """A finalized ledger and no ``CURRENT`` naming a ledger (none, or a cluster member's naming only its epoch): the
    pointer was lost, not a first run left unfinished (whose ledger has no manifest yet).

    :raises LedgerCorrupt: ``CURRENT`` is unreadable.
    """
    if read_pointer(objects, topic).ledger is not None:
        return False
    return any(objects.head(f"{layout.topic_prefix(topic)}{name}/{MANIFEST}") is not None for name in _ledgers(objects, topic))


def quarantine(objects: ObjectStore, topic: str) -> str:
    """Move the topic's ledgers under ``@compactord/quarantine/<topic>/<time>/`` (its policies stay); an
    operator decides what they were. Returns that prefix. Each object is copied, then the ledger deleted: a
    crash in between leaves the ledger where it was (quarantined again, into another folder, at the next start).

    :raises InsufficientDiskSpace: the disk is full.
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target, n = layout.quarantine_prefix(topic, stamp), 1
    while objects.list(target):
        n += 1
        target = layout.quarantine_prefix(topic, f"{stamp}-{n}")
    moved = _ledgers(objects, topic)
    source = layout.topic_prefix(topic)
    for name in moved:
        for info in objects.list(f"{source}{name}/"):
            objects.copy(info.key, target + info.key[len(source):])
    for name in moved:
        objects.delete_prefix(f"{source}{name}/")
    target = target.rstrip("/")
    log.warning("topic %r has finalized ledgers %s but no %s: moved them to %s (not served; not removed)",
                topic, moved, CURRENT, objects.location(target))
    return target


def quarantined(objects: ObjectStore) -> list[str]:
    """The quarantined folders, ``<topic>/<time>`` each, sorted."""
    root = layout.quarantine_root()
    return sorted(f"{topic}{stamp.rstrip('/')}" for topic in objects.children(root) if topic.endswith("/")
                  for stamp in objects.children(root + topic) if stamp.endswith("/"))
