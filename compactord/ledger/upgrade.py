"""A root written by the older layout, upgraded in place when it is opened (``LedgerStore.open``), before any
topic is served or compacted.

The older layout named two kinds of objects by a topic's name plus a suffix, beside other topics' folders, so
that two legal names could claim one key (``layout.py``):

- ``@compactord/history/<topic>.jsonl``, a topic's compacted run history, moves to
  ``@compactord/history/<topic>/compacted.jsonl`` (its runs recorded one by one, ``<topic>/<seq>.json``, are
  where the new layout has them). Only an object directly under ``history/`` is such a file: a folder named
  ``<name>.jsonl`` (a local root) or the prefix ``history/<name>.jsonl/`` (S3) is the history of the topic
  ``<name>.jsonl``, and stays.
- ``@compactord/quarantine/<topic>-<time>/ledger-<id>/``, a quarantined ledger, moves to
  ``@compactord/quarantine/<topic>/<time>/ledger-<id>/``. A folder holding ledger folders directly is the
  older layout's (the new one holds ``<time>/`` folders there).

Two leftovers of an older version are removed: ``@compactord/progress/<task>/`` (its tasks' progress files;
tasks now report over the driver's channel) and ``@compactord/ledger-seq.tmp`` (its id counter's temporary
file).

Each move copies, then deletes: a crash in between leaves both, and the next start moves again (a history file
already at its new place is merged with the old one; reads take each run once). Nothing else changed place.
"""

from __future__ import annotations

import logging
import re

from compactord.errors import CompactordError, ObjectNotFound
from compactord.ledger import layout
from compactord.model import validate_topic_name
from compactord.storage import ObjectStore
from compactord.storage.disk import TMP_SUFFIX

__all__ = ["upgrade_root"]

log = logging.getLogger("compactord.ledger.store")  # one logger for what open() finds

_OLD_QUARANTINE = re.compile(r"(?P<topic>.+)-(?P<stamp>[0-9]{8}T[0-9]{6}Z(?:-[0-9]+)?)")


def upgrade_root(objects: ObjectStore) -> None:
    """Move what the older layout wrote to its place in this one (nothing on a root written by this one)."""
    _remove_leftovers(objects)
    for name in objects.children(layout.history_root()):
        if not name.endswith("/") and name.endswith(layout.LEGACY_HISTORY_SUFFIX):
            topic = _topic(name.removesuffix(layout.LEGACY_HISTORY_SUFFIX))
            if topic is not None:
                _move_history(objects, topic)
    for name in objects.children(layout.quarantine_root()):
        if name.endswith("/"):
            _move_quarantined(objects, name)


def _remove_leftovers(objects: ObjectStore) -> None:
    names = objects.children(f"{layout.DAEMON_DIR}/")
    seq_tmp = layout.legacy_seq_key().rpartition("/")[2] + TMP_SUFFIX
    if seq_tmp in names:
        objects.delete(f"{layout.DAEMON_DIR}/{seq_tmp}")
    progress = f"{layout.DAEMON_DIR}/{layout.progress_name()}/"
    if f"{layout.progress_name()}/" not in names:
        return
    for task in objects.children(progress):
        log.warning("removing the progress files an older version left for task %s", task.rstrip("/"))
        if task.endswith("/"):
            objects.delete_prefix(progress + task)
        else:
            objects.delete(progress + task)


def _topic(name: str) -> str | None:
    try:
        return validate_topic_name(name)
    except CompactordError:
        return None


def _move_history(objects: ObjectStore, topic: str) -> None:
    old, new = layout.legacy_history_key(topic), layout.history_file_key(topic)
    try:
        data = objects.get(old)
    except ObjectNotFound:
        return
    try:
        data += objects.get(new)  # a move a crash interrupted: both hold runs, each ``seq`` is read once
    except ObjectNotFound:
        pass
    objects.put(new, data)
    objects.delete(old)
    log.warning("topic %r: run history moved from %s to %s (the older layout's place)", topic,
                objects.location(old), objects.location(new))


def _move_quarantined(objects: ObjectStore, folder: str) -> None:
    """``folder`` (``<name>/`` under the quarantine) as the older layout's ``<topic>-<time>/``, if it is one."""
    match = _OLD_QUARANTINE.fullmatch(folder[:-1])
    topic = _topic(match.group("topic")) if match else None
    if match is None or topic is None:
        return
    base = layout.quarantine_root() + folder
    ledgers = [name for name in objects.children(base) if name.endswith("/") and layout.LEDGER_RE.fullmatch(name[:-1])]
    if not ledgers:
        return  # a topic's folder of this layout (its ``<time>/`` folders)
    target = layout.quarantine_prefix(topic, match.group("stamp"))
    for ledger in ledgers:
        for info in objects.list(base + ledger):
            objects.copy(info.key, target + info.key[len(base):])
    for ledger in ledgers:
        objects.delete_prefix(base + ledger)
    log.warning("topic %r: quarantined ledgers %s moved from %s to %s (the older layout's place)", topic,
                [name[:-1] for name in ledgers], objects.location(base.rstrip("/")),
                objects.location(target.rstrip("/")))
