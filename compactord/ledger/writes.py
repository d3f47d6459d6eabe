"""Writing a ledger of a root: its id handed out, its seal (``manifest.json``), and the pointer that makes it
current. ``LedgerStore`` (``store.py``) delegates to these; they go through its per-topic entry points
(``topic_dir``, ``pointer``...), so each passes the topic's recovery gate (``recovery.py``) first.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Protocol

from compactord.errors import InvalidArgument, LedgerCorrupt
from compactord.ledger import layout, manifests
from compactord.ledger.guard import WriterGuard
from compactord.ledger.layout import MANIFEST, ledger_dir_name
from compactord.ledger.pointer import Pointer, allocate_id
from compactord.model import LedgerManifest
from compactord.storage import ObjectStore

__all__ = ["allocate_ledger", "delete_topic_object", "finalize_ledger", "put_topic_object", "switched"]


class _Store(Protocol):  # the ledger store, as far as this module needs it
    objects: ObjectStore
    guard: WriterGuard

    def topic_dir(self, topic: str) -> Path: ...
    def ledger_path(self, topic: str, ledger_id: int) -> Path: ...
    def ledger_ids(self, topic: str) -> list[int]: ...
    def pointer(self, topic: str) -> Pointer: ...


def allocate_ledger(store: _Store, topic: str) -> tuple[int, Path]:
    """Hand out the topic's next ledger id (strictly increasing per topic, never reused: its last id
    advanced by compare-and-swap, ``pointer.allocate_id``) and its path.

    Creates the topic directory; the ledger directory is left to its writer (Spark).

    :raises LedgerCorrupt: the last id or an older version's counter does not hold an integer.
    :raises InsufficientDiskSpace: the disk is full.
    :raises StorageUnavailable: the root's lease has not been renewed in time (``Lease.check``): a run finds
        it before its job rather than at its switch.
    :raises Fenced: another daemon took the root's lease over.
    """
    store.guard.check(topic)
    topic_dir = store.topic_dir(topic)
    # Should the last id ever be lost, still never hand out an id this topic has used.
    used = store.ledger_ids(topic)
    with contextlib.suppress(LedgerCorrupt):  # a bad pointer is reported by reads and the run's plan
        pointer = store.pointer(topic)
        used += [*(r.id for r in pointer.retired), pointer.ledger or 0]
    next_id = allocate_id(store.objects, topic, used)
    store.objects.make_folder(layout.topic_prefix(topic))  # a local root's: the writers of a ledger's parts write into it
    return next_id, topic_dir / ledger_dir_name(next_id)


def finalize_ledger(store: _Store, topic: str, ledger_id: int, manifest: LedgerManifest) -> LedgerManifest:
    """Seal a ledger Spark has written: drop Spark's ``_SUCCESS`` and ``*.crc`` files, checksum and
    count every ``part-*.parquet``, write ``manifest.json`` and fsync it all.

    ``manifest`` is filled in place (files, bytes, records_kept, markers, removed, oldest marker)
    and returned; ``records_read`` must be set by the caller.

    :raises InvalidArgument: ``manifest`` names another topic or ledger id.
    :raises LedgerCorrupt: a part file is not Parquet or lacks a column of the record schema.
    :raises InsufficientDiskSpace: the disk is full.
    """
    if manifest.topic != topic or manifest.ledger_id != ledger_id:
        raise InvalidArgument(
            f"manifest of topic {manifest.topic!r} ledger {manifest.ledger_id} given to finalize "
            f"ledger {ledger_id} of topic {topic!r}; they must match"
        )
    store.ledger_path(topic, ledger_id)  # checks the name and the id
    return manifests.finalize(manifest, store.objects, layout.ledger_prefix(topic, ledger_id))


def switched(store: _Store, topic: str, ledger_id: int, base: Pointer | None,
             retire_for: float | None) -> tuple[Pointer, Pointer]:
    """The pointer that makes a finalized ledger current, and the ``base`` to write it against (None: as read
    now): ``LedgerStore.switch`` writes it by compare-and-swap. The ledger ``base`` named joins the retired
    list for ``retire_for`` seconds (None or <= 0: it does not).

    :raises Fenced: another daemon took the root's lease, or (a cluster's member) the topic is not this member's,
        or ``base`` does not carry the epoch it took the topic with.
    :raises StorageUnavailable: the root's lease has not been renewed in time (``Lease.check``).
    :raises InvalidArgument: the ledger has no ``manifest.json`` (it was not finalized).
    """
    store.ledger_path(topic, ledger_id)  # checks the name and the id
    key = layout.ledger_prefix(topic, ledger_id) + MANIFEST
    if store.objects.head(key) is None:
        store.guard.check_owner(topic)  # a cluster's previous owner: the new one removed it, and fenced this switch
        raise InvalidArgument(
            f"ledger {ledger_id} of topic {topic!r} has no {MANIFEST} in {store.objects.describe()}: "
            "only a finalized ledger can become current"
        )
    base = store.pointer(topic) if base is None else base
    store.guard.check(topic)
    store.guard.check_pointer(topic, base)  # a cluster member's: the epoch it took the topic with
    return base.switched(topic, ledger_id, store.guard.fence(topic), retire_for), base


def put_topic_object(store: _Store, topic: str, name: str, data: bytes) -> str:
    """Write ``<topic>/<name>`` (``policies.json``, ``UNLOADED``) as the topic's writer (``WriterGuard.check_owner``
    first: on a root daemons share, the topic is this member's and its pointer carries the epoch it took it with);
    return its version.

    :raises InvalidArgument: ``name`` is neither.
    :raises Fenced: another member holds the topic, or took it since.
    """
    key = _topic_object(store, topic, name)
    store.guard.check_owner(topic)
    return store.objects.put(key, data)


def delete_topic_object(store: _Store, topic: str, name: str) -> None:
    """Remove ``<topic>/<name>`` (missing is fine), as ``put_topic_object`` writes it."""
    key = _topic_object(store, topic, name)
    store.guard.check_owner(topic)
    store.objects.delete(key)


def _topic_object(store: _Store, topic: str, name: str) -> str:
    if name not in (layout.POLICIES, layout.UNLOADED):
        raise InvalidArgument(f"a topic's object beside its ledgers is {layout.POLICIES} or {layout.UNLOADED}, "
                              f"got: {name!r}")
    store.topic_dir(topic)  # checks the name, and that the topic's folder is the root's
    return layout.topic_prefix(topic) + name
