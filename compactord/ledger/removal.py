"""Removing from the ledger root: durable topic deletion (the ``DELETING`` mark that the next start
completes), the orphans a crash leaves (ledgers neither ``CURRENT`` nor its retired list names, temporary
files), removed at once at the start, and the periodic sweep, which removes the same orphans only once they
are older than a safety margin (docs/design.md, "The sweep"). ``LedgerStore`` calls these with the root's
store and a checked topic name.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from compactord.errors import InsufficientDiskSpace
from compactord.ledger import layout
from compactord.ledger.layout import DELETING, LEDGER_RE, MANIFEST
from compactord.storage import ObjectInfo, ObjectStore
from compactord.storage.disk import TMP_SUFFIX

__all__ = ["DELETING", "Swept", "delete_topic", "mark_deleting", "remove_orphans", "sweep_orphans"]

log = logging.getLogger("compactord.ledger.store")  # one logger for what open() finds

def mark_deleting(objects: ObjectStore, topic: str) -> bool:
    """Write the topic's deletion mark durably; False if the disk is too full to hold it (logged)."""
    try:
        objects.put(layout.deleting_key(topic), b"deletion asked; completed at the next start if interrupted\n")
    except InsufficientDiskSpace as exc:
        log.warning("topic %r is deleted without a durable mark (a restart before the end leaves its "
                    "files): %s", topic, exc)
        return False
    return True


def delete_topic(objects: ObjectStore, topic: str, keep_pointer: bool = False) -> None:
    """Remove every object of the topic, its deletion mark last (missing is fine); with ``keep_pointer``, all but its
    pointer (a root daemons share keeps its epoch)."""
    mark, prefix, pointer = layout.deleting_key(topic), layout.topic_prefix(topic), layout.pointer_key(topic)
    kept = {mark, pointer} if keep_pointer else {mark}
    objects.delete_many(info.key for info in objects.list(prefix) if info.key not in kept)
    if keep_pointer:
        objects.delete(mark)
    else:
        objects.delete_prefix(prefix)  # the mark, and on a local disk the folders with them


def remove_orphans(objects: ObjectStore, topic: str, keep: set[int], has_pointer: bool) -> list[str]:
    """Remove the ledgers of the topic other than ``keep`` and leftover temporary files; return their keys
    (a ledger as its prefix). Without a pointer, a finalized ledger (with a manifest) is kept (``open()``
    quarantines it)."""
    doomed: list[str] = []
    prefix = layout.topic_prefix(topic)
    for child in objects.children(prefix):
        name = child.rstrip("/")
        match = LEDGER_RE.fullmatch(name) if child.endswith("/") else None
        if match is not None and int(match.group(1)) not in keep:
            if not has_pointer and objects.head(f"{prefix}{name}/{MANIFEST}") is not None:
                continue
            doomed.append(f"{prefix}{name}/")
        elif match is None and name.endswith(TMP_SUFFIX):  # an older version's CURRENT.tmp
            doomed.append(f"{prefix}{name}")
    for ledger_id in sorted(keep):
        doomed += [info.key for info in objects.list(layout.ledger_prefix(topic, ledger_id))
                   if info.key.endswith(TMP_SUFFIX)]
    for key in sorted(doomed):
        log.warning("removing orphan %s of topic %r (kept: %s)", key, topic, sorted(keep) or "none")
        if key.endswith("/"):
            objects.delete_prefix(key)
        else:
            objects.delete(key)
    return sorted(doomed)



@dataclass
class Swept:
    """What a sweep of one topic removed: the keys (a ledger as its prefix), their objects and bytes, and the
    unfinished uploads it aborted."""

    keys: list[str] = field(default_factory=list)
    objects: int = 0
    bytes: int = 0
    uploads: int = 0


def sweep_orphans(objects: ObjectStore, topic: str, keep: set[int], has_pointer: bool, ceiling: int,
                  older_than: float) -> Swept:
    """``remove_orphans`` for a root in use: only the ledgers up to ``ceiling`` (the highest id under the topic
    when no task of it ran: a task that starts later allocates a higher one) whose every object was last
    written before ``older_than`` (UTC seconds), and temporary files that old."""
    swept = Swept()
    doomed: list[tuple[str, list[ObjectInfo]]] = []
    prefix = layout.topic_prefix(topic)
    for child in objects.children(prefix):
        name = child.rstrip("/")
        match = LEDGER_RE.fullmatch(name) if child.endswith("/") else None
        if match is not None and int(match.group(1)) not in keep and int(match.group(1)) <= ceiling:
            found = objects.list(f"{prefix}{name}/")
            if not has_pointer and any(info.key.endswith(f"/{MANIFEST}") for info in found):
                continue  # a finalized ledger without CURRENT: the next start quarantines it
            if all(info.modified < older_than for info in found):
                doomed.append((f"{prefix}{name}/", found))
        elif match is None and name.endswith(TMP_SUFFIX):  # an older version's CURRENT.tmp
            info = objects.head(f"{prefix}{name}")
            if info is not None and info.modified < older_than:
                doomed.append((info.key, [info]))
    for ledger_id in sorted(keep):
        doomed += [(info.key, [info]) for info in objects.list(layout.ledger_prefix(topic, ledger_id))
                   if info.key.endswith(TMP_SUFFIX) and info.modified < older_than]
    for key, infos in sorted(doomed, key=lambda item: item[0]):
        log.warning("sweeping orphan %s of topic %r (%d objects, %d bytes; kept: %s)", key, topic, len(infos),
                    sum(i.size for i in infos), sorted(keep) or "none")
        if key.endswith("/"):
            objects.delete_prefix(key)
        else:
            objects.delete(key)
        swept.keys.append(key)
        swept.objects += len(infos)
        swept.bytes += sum(info.size for info in infos)
    return swept
