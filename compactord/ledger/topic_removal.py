"""Removing what a topic holds: the whole topic (its durable deletion mark first), and the ledgers that are not
current: one by its id, a partial one by its folder, the retired ones past their ``until``, and the orphans (at
the topic's recovery, or by the periodic sweep with its margin).
``LedgerStore`` (``store.py``) delegates to these; they go through its per-topic entry points (``topic_dir``,
``pointer``...), so each passes the topic's recovery gate (``recovery.py``) first; the removals by key are
``removal.py``'s.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from compactord.errors import InvalidArgument, LedgerCorrupt
from compactord.ledger import layout, removal
from compactord.ledger.guard import WriterGuard
from compactord.ledger.layout import CURRENT, LEDGER_RE, MANIFEST, ledger_dir_name
from compactord.ledger.pointer import KnownPointers, Pointer, expired, read_pointer, write_pointer
from compactord.storage import ObjectStore

__all__ = ["delete_ledger", "delete_released", "delete_retired", "delete_topic", "deletion_pending", "discard",
           "mark_deleting", "remove_orphans", "sweep", "sweep_retired", "unmark_deleting"]

log = logging.getLogger("compactord.ledger.store")


class _Store(Protocol):  # the ledger store, as far as this module needs it
    objects: ObjectStore
    guard: WriterGuard
    root: Path

    def ready(self, topic: str) -> None: ...
    def topic_dir(self, topic: str) -> Path: ...
    def ledger_path(self, topic: str, ledger_id: int) -> Path: ...
    def pointer(self, topic: str) -> Pointer: ...
    def current_ledger_id(self, topic: str) -> int | None: ...
    def drop_retired(self, topic: str, ids: set[int], base: Pointer) -> Pointer: ...
    def kept_elsewhere(self, topic: str) -> set[int] | None: ...


def mark_deleting(store: _Store, topic: str) -> bool:
    """Record durably that ``topic`` is to be deleted, before anything of it is removed: a deletion
    a crash or a restart interrupts is completed after the next ``open()``, by the topic's recovery.

    False if the disk is too full to hold the mark: deleting is what frees a full disk, so the
    deletion goes on without it (logged), rather than being refused.
    """
    store.ready(topic)
    store.guard.check_owner(topic)
    return removal.mark_deleting(store.objects, topic)


def unmark_deleting(store: _Store, topic: str) -> None:
    """Withdraw a deletion mark (a deletion given up, e.g. because a new compaction started)."""
    key = layout.deleting_key(topic)
    store.ready(topic)
    store.guard.check_owner(topic)
    store.objects.delete(key)


def deletion_pending(store: _Store, topic: str) -> bool:
    """Whether ``topic`` carries a deletion mark (``mark_deleting``) not yet completed (its recovery, which
    this is first of, completes a deletion a restart interrupted)."""
    key = layout.deleting_key(topic)
    store.ready(topic)
    return store.objects.head(key) is not None


def delete_topic(store: _Store, known: KnownPointers, topic: str) -> None:
    """Remove a topic's directory with every ledger, its pointer and policies (missing is fine), and forget its
    pointer in ``known`` (the store's).

    The deletion mark, if any, goes last: until then a crash leaves a deletion the topic's recovery completes.

    On a root daemons share, the topic's pointer is first replaced by compare-and-swap with one naming no ledger
    and the epoch the topic was taken with (``Fenced`` if another member took it since), and stays: a previous
    owner's switch from before the deletion fails on it rather than creating the pointer again.
    """
    store.topic_dir(topic)  # checks the name, and that the folder is the root's
    store.guard.check(topic)
    try:
        if store.guard.shared_root:
            _fence_pointer(store, topic)
        removal.delete_topic(store.objects, topic, keep_pointer=store.guard.shared_root)
    finally:
        known.wrote(topic, None)


def _fence_pointer(store: _Store, topic: str) -> None:
    try:
        base = read_pointer(store.objects, topic)
    except LedgerCorrupt:
        info = store.objects.head(layout.pointer_key(topic))
        base = Pointer(None, version=None if info is None else info.version)
    else:
        store.guard.check_pointer(topic, base)
    written = write_pointer(store.objects, topic, Pointer(None, store.guard.fence(topic)), base)
    store.guard.confirm(topic, written)


def delete_ledger(store: _Store, topic: str, ledger_id: int) -> None:
    """Remove a ledger that is not current (missing is fine).

    :raises InvalidArgument: ``CURRENT`` names this ledger.
    """
    path = store.ledger_path(topic, ledger_id)
    store.guard.check(topic)
    if _is_current(store, topic, path):
        raise InvalidArgument(
            f"ledger {ledger_id} is the current ledger of topic {topic!r}; switch to another ledger "
            "before deleting it, or delete the topic"
        )
    store.objects.delete_prefix(layout.ledger_prefix(topic, ledger_id))


def discard(store: _Store, path: Path) -> None:
    """Remove a partial ledger directory (missing is fine).

    :raises InvalidArgument: ``path`` is not an entry of a topic directory of this root, or is the
        topic's pointer or current ledger.
    """
    resolved = Path(path).resolve()
    parts = resolved.relative_to(store.root).parts if resolved.is_relative_to(store.root) else ()
    if not (len(parts) == 2 and layout.is_topic_name(parts[0]) and parts[1] != CURRENT):
        raise InvalidArgument(f"refusing to discard {path}: only an entry of a topic directory under ledger "
                              f"root {store.root} (not its CURRENT) can be discarded")
    if _is_current(store, parts[0], resolved):
        raise InvalidArgument(f"refusing to discard {path}: it is the current ledger of {parts[0]!r}")
    store.objects.delete(f"{parts[0]}/{parts[1]}")
    store.objects.delete_prefix(f"{parts[0]}/{parts[1]}/")


def sweep_retired(store: _Store, topic: str, now: float | None = None) -> list[int]:
    """Take the retired ledgers past their ``until`` off the pointer, then delete their files; return them.
    Only while no task of the topic runs (the pointer is the task's base).

    :raises Fenced: the pointer changed while this ran (nothing is deleted then).
    """
    pointer = store.pointer(topic)
    doomed = expired(pointer, now)
    store.drop_retired(topic, set(doomed), pointer)
    for ledger_id in doomed:
        delete_retired(store, topic, ledger_id)
    return doomed


def delete_retired(store: _Store, topic: str, ledger_id: int) -> bool:
    """Remove a ledger taken off the retired list, unless a keeper (``LedgerStore.keep_also``: a retained
    snapshot of the topic's Iceberg table) names it, or may (not known yet); False: kept, and removed once
    released (``delete_released``), or by the orphans' removal once nothing keeps it."""
    if ledger_id in _kept_elsewhere(store, topic, store.current_ledger_id(topic)):
        log.info("retired ledger %d of topic %r kept past its grace: a retained snapshot of its Iceberg table "
                 "names it", ledger_id, topic)
        return False
    delete_ledger(store, topic, ledger_id)
    return True


def delete_released(store: _Store, topic: str) -> list[int]:
    """Remove the finalized ledgers below the current one that neither the pointer nor a keeper names (those a
    keeper kept past their grace, once it released them: expiry before deletion); return their ids. A ledger
    without a manifest is left to the sweep (its run's writers may not be done). Only the topic's writer."""
    store.topic_dir(topic)
    store.guard.check(topic)
    pointer = store.pointer(topic)
    if pointer.ledger is None:
        return []
    kept = _kept(store, topic, pointer)
    doomed = [i for i in _ledger_ids(store, topic) if i < pointer.ledger and i not in kept
              and store.objects.head(layout.ledger_prefix(topic, i) + MANIFEST) is not None]
    for ledger_id in doomed:
        store.objects.delete_prefix(layout.ledger_prefix(topic, ledger_id))
    if doomed:
        log.info("topic %r: ledgers %s deleted (no retained snapshot of its Iceberg table names them)", topic,
                 doomed)
    return doomed


def remove_orphans(store: _Store, topic: str) -> list[str]:
    """Remove the ledgers neither ``CURRENT`` nor its retired list names, and leftover temporary files;
    return their keys (a ledger's ending in ``/``).

    Only safe while nothing of the topic is being written, i.e. in its recovery (``recover_topic``, before
    the topic is used; ``sweep`` is for later). Without ``CURRENT``, a finalized ledger (one with a
    manifest) is never removed: the recovery quarantines it.

    No age margin, unlike ``sweep``, on any root: a previous daemon's executors may still upload into a
    ledger removed here, but ledger ids are never reused, so no ledger of this daemon is hit; what lands
    later is a new orphan, which the periodic sweep removes once past its margin.

    :raises LedgerCorrupt: ``CURRENT`` is unreadable (then nothing is removed).
    """
    store.topic_dir(topic)
    store.guard.check(topic)
    pointer = store.pointer(topic)
    return removal.remove_orphans(store.objects, topic, _kept(store, topic, pointer), pointer.ledger is not None)


def sweep(store: _Store, topic: str, ceiling: int, older_than: float) -> removal.Swept:
    """Remove what ``remove_orphans`` would, on a root in use: only ledgers with an id up to ``ceiling``
    (the highest under the topic while no task of it ran), and only objects last written before
    ``older_than`` (UTC seconds); then abort the topic's unfinished uploads begun before then.

    :raises LedgerCorrupt: ``CURRENT`` is unreadable (then nothing is removed).
    """
    store.topic_dir(topic)
    if not store.guard.owns(topic):
        return removal.Swept()  # its owner sweeps it
    pointer = store.pointer(topic)
    swept = removal.sweep_orphans(store.objects, topic, _kept(store, topic, pointer), pointer.ledger is not None,
                                  ceiling, older_than)
    swept.uploads = store.objects.abort_uploads(layout.topic_prefix(topic), older_than)
    return swept


def _kept(store: _Store, topic: str, pointer: Pointer) -> set[int]:
    """The ledgers to keep: those the pointer names (its current one and its retired list), and those a keeper
    names (``LedgerStore.keep_also``: the retained snapshots of the topic's Iceberg table)."""
    named = {r.id for r in pointer.retired} | ({pointer.ledger} if pointer.ledger is not None else set())
    return named | _kept_elsewhere(store, topic, pointer.ledger)


def _kept_elsewhere(store: _Store, topic: str, current: int | None) -> set[int]:
    """What the keepers name; while one does not know yet, every ledger below ``current`` (any of them may be
    a retained snapshot's)."""
    named = store.kept_elsewhere(topic)
    if named is not None:
        return named
    return {i for i in _ledger_ids(store, topic) if current is not None and i < current}


def _ledger_ids(store: _Store, topic: str) -> list[int]:
    """The ledger folders under the topic (without the recovery gate: the recovery's removal asks too)."""
    found = (LEDGER_RE.fullmatch(name.rstrip("/")) for name in store.objects.children(layout.topic_prefix(topic)))
    return sorted(int(m.group(1)) for m in found if m)


def _is_current(store: _Store, topic: str, path: Path) -> bool:
    current = store.current_ledger_id(topic)
    if current is None:
        return False
    return path.resolve() == (store.topic_dir(topic) / ledger_dir_name(current)).resolve()
