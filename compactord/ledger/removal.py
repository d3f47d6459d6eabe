"""Removing from the ledger root: durable topic deletion (the ``DELETING`` mark that the next start
completes) and the orphans a crash leaves (ledgers ``CURRENT`` does not name, temporary files).
``LedgerStore`` calls these with the topic's folder, after checking the name.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from compactord.errors import InsufficientDiskSpace
from compactord.ledger.files import (
    MANIFEST,
    TMP_SUFFIX,
    disk_errors,
    fsync_path,
    ledger_dir_name,
    list_names,
    remove_path,
    write_atomic,
)

__all__ = ["DELETING", "delete_topic", "mark_deleting", "remove_orphans"]

log = logging.getLogger("compactord.ledger.store")  # one logger for what open() finds

DELETING = "DELETING"


def mark_deleting(root: Path, topic_dir: Path, topic: str) -> bool:
    """Write ``topic_dir``'s deletion mark durably; False if the disk is too full to hold it (logged)."""
    try:
        with disk_errors(f"marking topic {topic!r} for deletion"):
            if not topic_dir.is_dir():
                topic_dir.mkdir(parents=True, exist_ok=True)
                fsync_path(root)
            mark = b"deletion asked; completed at the next start if interrupted\n"
            write_atomic(topic_dir / DELETING, mark)
    except InsufficientDiskSpace as exc:
        with contextlib.suppress(FileNotFoundError):
            (topic_dir / (DELETING + TMP_SUFFIX)).unlink()
        log.warning("topic %r is deleted without a durable mark (a restart before the end leaves its "
                    "files): %s", topic, exc)
        return False
    return True


def delete_topic(root: Path, topic_dir: Path) -> None:
    """Remove ``topic_dir`` and everything in it, its deletion mark last (missing is fine)."""
    for name in list_names(topic_dir):
        if name != DELETING:
            remove_path(topic_dir / name)
    remove_path(topic_dir / DELETING)
    with contextlib.suppress(FileNotFoundError):
        topic_dir.rmdir()
        fsync_path(root)


def remove_orphans(topic_dir: Path, topic: str, current: int | None) -> list[Path]:
    """Remove the ledgers of ``topic_dir`` other than ``current`` and leftover temporary files; return
    them. Without a current ledger, a finalized one (with a manifest) is kept (``open()`` quarantines it)."""
    keep = ledger_dir_name(current) if current is not None else None
    doomed = [topic_dir / n for n in list_names(topic_dir) if n.endswith(TMP_SUFFIX) or n.startswith("ledger-")]
    doomed = [p for p in doomed if p.name != keep]
    if keep is None:
        doomed = [p for p in doomed if not (p / MANIFEST).is_file()]
    if keep is not None:
        doomed += [topic_dir / keep / n for n in list_names(topic_dir / keep) if n.endswith(TMP_SUFFIX)]
    for path in sorted(doomed):
        log.warning("removing orphan %s of topic %r (current: %s)", path, topic, keep)
        remove_path(path)
    return sorted(doomed)
