"""Ledgers found without their ``CURRENT`` pointer: moved aside, never removed.

A topic folder that holds a finalized ledger (one with ``manifest.json``) but no ``CURRENT`` lost its
pointer (a disk or an operator took it): the ledgers may be the only copy of data the log has since
deleted, so ``LedgerStore.open()`` moves them to ``<root>/@compactord/quarantine/<topic>-<time>/`` and
logs it, and the daemon counts the folders there (``compactord_quarantined_topics``). A folder holding
only an unfinished first run (no manifest) is an orphan, removed as such.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from compactord.ledger.files import CURRENT, LEDGER_RE, MANIFEST, disk_errors, fsync_path, list_names

__all__ = ["lost_pointer", "quarantine"]

log = logging.getLogger("compactord.ledger.store")  # one logger for what open() finds


def lost_pointer(topic_dir: Path) -> bool:
    """A finalized ledger and no ``CURRENT``: the pointer was lost, not a first run left unfinished
    (whose ledger has no manifest yet)."""
    if (topic_dir / CURRENT).exists():
        return False
    return any(LEDGER_RE.fullmatch(n) and (topic_dir / n / MANIFEST).is_file() for n in list_names(topic_dir))


def quarantine(topic: str, topic_dir: Path, base: Path) -> Path:
    """Move the topic's ledgers into ``base/<topic>-<time>`` (its policies stay); an operator decides
    what they were. Returns that folder.

    :raises InsufficientDiskSpace: the disk is full.
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = base / f"{topic}-{stamp}"
    n = 1
    while target.exists():
        n += 1
        target = base / f"{topic}-{stamp}-{n}"
    with disk_errors(f"quarantining the ledgers of topic {topic!r}"):
        target.mkdir(parents=True)
        fsync_path(base)
        moved = sorted(name for name in list_names(topic_dir) if name.startswith("ledger-"))
        for name in moved:
            os.rename(topic_dir / name, target / name)
        fsync_path(target)
        fsync_path(topic_dir)
    log.warning("topic %r has finalized ledgers %s but no %s: moved them to %s (not served; not removed)",
                topic, moved, CURRENT, target)
    return target
