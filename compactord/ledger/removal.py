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
    _TMP,
    MANIFEST,
    _disk_errors,
    _fsync,
    _names,
    _remove,
    _write_atomic,
    ledger_dir_name,
)

__all__ = ["DELETING", "delete_topic", "mark_deleting", "remove_orphans"]

log = logging.getLogger("compactord.ledger.store")  # one logger for what open() finds

DELETING = "DELETING"


def mark_deleting(root: Path, topic_dir: Path, topic: str) -> bool:
    """Write ``topic_dir``'s deletion mark durably; False if the disk is too full to hold it (logged)."""
    try:
        with _disk_errors(f"marking topic {topic!r} for deletion"):
            if not topic_dir.is_dir():
                topic_dir.mkdir(parents=True, exist_ok=True)
                _fsync(root)
            mark = b"deletion asked; completed at the next start if interrupted\n"
            _write_atomic(topic_dir / DELETING, mark)
    except InsufficientDiskSpace as exc:
        with contextlib.suppress(FileNotFoundError):
            (topic_dir / (DELETING + _TMP)).unlink()
        log.warning("topic %r is deleted without a durable mark (a restart before the end leaves its "
                    "files): %s", topic, exc)
        return False
    return True


def delete_topic(root: Path, topic_dir: Path) -> None:
    """Remove ``topic_dir`` and everything in it, its deletion mark last (missing is fine)."""
    for name in _names(topic_dir):
        if name != DELETING:
            _remove(topic_dir / name)
    _remove(topic_dir / DELETING)
    with contextlib.suppress(FileNotFoundError):
        topic_dir.rmdir()
        _fsync(root)


def remove_orphans(topic_dir: Path, topic: str, current: int | None) -> list[Path]:
    """Remove the ledgers of ``topic_dir`` other than ``current`` and leftover temporary files; return
    them. Without a current ledger, a finalized one (with a manifest) is kept (``open()`` quarantines it)."""
    keep = ledger_dir_name(current) if current is not None else None
    doomed = [topic_dir / n for n in _names(topic_dir) if n.endswith(_TMP) or n.startswith("ledger-")]
    doomed = [p for p in doomed if p.name != keep]
    if keep is None:
        doomed = [p for p in doomed if not (p / MANIFEST).is_file()]
    if keep is not None:
        doomed += [topic_dir / keep / n for n in _names(topic_dir / keep) if n.endswith(_TMP)]
    for path in sorted(doomed):
        log.warning("removing orphan %s of topic %r (current: %s)", path, topic, keep)
        _remove(path)
    return sorted(doomed)
