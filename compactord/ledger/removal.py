"""Removing from the ledger root: durable topic deletion (the ``DELETING`` mark that the next start
completes) and the orphans a crash leaves (ledgers neither ``CURRENT`` nor its retired list names, temporary
files). ``LedgerStore`` calls these with the root's store and a checked topic name.
"""

from __future__ import annotations

import logging

from compactord.errors import InsufficientDiskSpace
from compactord.ledger.files import LEDGER_RE, MANIFEST, TMP_SUFFIX, ledger_dir_name
from compactord.storage import ObjectStore

__all__ = ["DELETING", "delete_topic", "mark_deleting", "remove_orphans"]

log = logging.getLogger("compactord.ledger.store")  # one logger for what open() finds

DELETING = "DELETING"


def mark_deleting(objects: ObjectStore, topic: str) -> bool:
    """Write the topic's deletion mark durably; False if the disk is too full to hold it (logged)."""
    try:
        objects.put(f"{topic}/{DELETING}", b"deletion asked; completed at the next start if interrupted\n")
    except InsufficientDiskSpace as exc:
        log.warning("topic %r is deleted without a durable mark (a restart before the end leaves its "
                    "files): %s", topic, exc)
        return False
    return True


def delete_topic(objects: ObjectStore, topic: str) -> None:
    """Remove every object of the topic, its deletion mark last (missing is fine)."""
    mark = f"{topic}/{DELETING}"
    objects.delete_many(info.key for info in objects.list(f"{topic}/") if info.key != mark)
    objects.delete_prefix(f"{topic}/")  # the mark, and on a local disk the folders with them


def remove_orphans(objects: ObjectStore, topic: str, keep: set[int], has_pointer: bool) -> list[str]:
    """Remove the ledgers of the topic other than ``keep`` and leftover temporary files; return their keys
    (a ledger as its prefix). Without a pointer, a finalized ledger (with a manifest) is kept (``open()``
    quarantines it)."""
    doomed: list[str] = []
    for child in objects.children(f"{topic}/"):
        name = child.rstrip("/")
        match = LEDGER_RE.fullmatch(name) if child.endswith("/") else None
        if match is not None and int(match.group(1)) not in keep:
            if not has_pointer and objects.head(f"{topic}/{name}/{MANIFEST}") is not None:
                continue
            doomed.append(f"{topic}/{name}/")
        elif match is None and name.endswith(TMP_SUFFIX):  # an older version's CURRENT.tmp
            doomed.append(f"{topic}/{name}")
    for ledger_id in sorted(keep):
        doomed += [info.key for info in objects.list(f"{topic}/{ledger_dir_name(ledger_id)}/")
                   if info.key.endswith(TMP_SUFFIX)]
    for key in sorted(doomed):
        log.warning("removing orphan %s of topic %r (kept: %s)", key, topic, sorted(keep) or "none")
        if key.endswith("/"):
            objects.delete_prefix(key)
        else:
            objects.delete(key)
    return sorted(doomed)
