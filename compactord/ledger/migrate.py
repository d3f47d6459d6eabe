"""Moving a ledger root (``compactord migrate-root SRC DST``): each topic's current ledger, run history and
policies copied from one root to another, a local folder or an S3 prefix either way.

Per topic, in this order: the current ledger's parts (each read from SRC and checked against the CRC-32C its
manifest records, written to DST, then read back from DST and checked again), its ``manifest.json`` byte for
byte, the run history, the policies, DST's last ledger id raised to at least SRC's, and last the topic's
``CURRENT`` (``put_if_absent``). An interrupted migration so leaves each topic on DST either complete (with its
pointer) or without a pointer: never served, and written over by a rerun, which skips the topics already
complete (the same ledger, byte for byte).

The pointer written names the copied ledger with epoch 0 and no retired ledgers, so that a daemon opening DST,
whatever epoch DST's record gives it, switches from it. Retired ledgers, quarantine, deletion marks and the
"unloaded" marks are not copied; a topic with a pending deletion is skipped.

Refused before anything is copied: SRC and DST the same root or one inside the other, SRC missing or without
topics, a daemon holding either root (a local root's lock; an S3 root's lease), a topic DST has already that is
not the same ledger or what an interrupted migration of it left. A local root's lock is held throughout.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compactord.config_values import s3_location
from compactord.errors import InvalidArgument, LedgerCorrupt, ObjectNotFound
from compactord.ledger import layout
from compactord.ledger.checksums import check_object, file_crc32c
from compactord.ledger.layout import MANIFEST
from compactord.ledger.lock import RootLock
from compactord.ledger.manifests import load_manifest
from compactord.ledger.pointer import Pointer, last_id, raise_last_id, read_pointer, write_pointer
from compactord.ledger.store import DAEMON_DIR, LedgerStore
from compactord.storage import ObjectStore, open_store

if TYPE_CHECKING:
    from compactord.config import Settings

__all__ = ["Root", "TopicMoved", "TopicState", "migrate_root", "open_root"]

_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class TopicState:
    """What the daemon keeps of a topic besides its ledgers and run history (``layout.history_prefix``): the
    files in the topic's folder to copy (its policies)."""

    files: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Root:
    """A root as the user named it, its store and, for a local root, its folder."""

    text: str
    objects: ObjectStore
    folder: Path | None


@dataclass(frozen=True, slots=True)
class TopicMoved:
    """What ``migrate_root`` did with one topic of SRC; ``note`` says why it copied nothing, if it did not."""

    topic: str
    ledger_id: int | None = None
    parts: int = 0
    bytes: int = 0
    seconds: float = 0.0
    note: str = ""


def open_root(text: str, settings: Settings | None, role: str) -> Root:
    """The root ``text`` names (``role``: SRC or DST, for messages).

    :raises InvalidArgument: ``text`` is empty or of another scheme, or an ``s3://`` root comes without
        ``s3Region`` in ``settings``.
    """
    if not text.strip() or (s3_location(text) is None and "://" in text):
        raise InvalidArgument(f"{role} {text!r} is not a ledger root: give a local path or s3://BUCKET/PREFIX")
    if s3_location(text) is not None and (settings is None or not settings.s3_region.strip()):
        raise InvalidArgument(f"{role} {text} is an S3 root: give --config a broker.conf that sets s3Region "
                              "(and s3Endpoint and the keys, as a daemon on that root would)")
    objects = open_store(text, settings)
    return Root(text, objects, objects.local_root)


def migrate_root(source: Root, target: Root, state: TopicState, lease_seconds: float,
                 on_topic: Callable[[TopicMoved], None] = lambda moved: None) -> list[TopicMoved]:
    """Copy every topic of ``source`` to ``target`` (see the module's docstring); ``on_topic`` hears of each
    topic once it is done. ``lease_seconds``: how long an S3 root's lease is watched for a daemon renewing it.

    :raises InvalidArgument: the roots overlap, SRC is missing or has no topics, or DST has a topic already.
    :raises LedgerRootLocked: a daemon holds either root.
    :raises LedgerCorrupt: a part fails its checksum on SRC, or as written to DST (that topic's pointer is not
        written); a manifest is unreadable.
    """
    if _overlap(source, target):
        raise InvalidArgument(f"SRC {source.text} and DST {target.text} are the same root or one is inside the "
                              "other: pick a DST apart from SRC")
    if source.folder is not None and not source.folder.is_dir():
        raise InvalidArgument(f"SRC {source.text} does not exist: name the ledger root to copy from")
    src, dst = LedgerStore(source.text, source.objects), LedgerStore(target.text, target.objects)
    topics = src.topics()
    if not topics:
        raise InvalidArgument(f"SRC {source.text} holds no topics: name a ledger root that a daemon wrote")
    with _holding(source, lease_seconds, create=False), _holding(target, lease_seconds, create=True):
        plans = [_plan(src, dst, topic, state) for topic in topics]
        taken = [f"{plan.topic} ({plan.conflict})" for plan in plans if plan.conflict]
        if taken:
            raise InvalidArgument(f"DST {target.text} already has topic(s) {', '.join(taken)}; nothing was "
                                  "copied: pick an empty DST")
        moved = []
        for plan in plans:
            moved.append(_copy_topic(src, dst, plan, state) if plan.note is None else
                         TopicMoved(plan.topic, plan.ledger_id, note=plan.note))
            on_topic(moved[-1])
    return moved


# -- the roots' holders ----------------------------------------------------------------------------


def _overlap(a: Root, b: Root) -> bool:
    if a.folder is not None and b.folder is not None:
        return a.folder.is_relative_to(b.folder) or b.folder.is_relative_to(a.folder)
    at, bt = s3_location(a.text), s3_location(b.text)
    if at is None or bt is None or at[0] != bt[0]:
        return False
    return not at[1] or not bt[1] or f"{at[1]}/".startswith(f"{bt[1]}/") or f"{bt[1]}/".startswith(f"{at[1]}/")


def _check_lease(objects: ObjectStore, lease_seconds: float) -> None:
    # Only an object-store root has a lease: a migration between local roots never loads its module.
    from compactord.ledger.lease import check_free

    check_free(objects, lease_seconds)


@contextlib.contextmanager
def _holding(root: Root, lease_seconds: float, create: bool) -> Iterator[None]:
    """A local root's lock held meanwhile, so that no daemon starts on it (one that sweeps SRC or writes DST);
    an S3 root's lease is only checked free, as nothing here renews one.

    :raises LedgerRootLocked: a daemon holds ``root``.
    """
    if root.folder is None:
        _check_lease(root.objects, lease_seconds)
        yield
        return
    if not create and not (root.folder / DAEMON_DIR).is_dir():
        yield  # no daemon ever opened SRC, and SRC is not written to
        return
    (root.folder / DAEMON_DIR).mkdir(parents=True, exist_ok=True)
    lock = RootLock(root.folder / DAEMON_DIR / layout.lock_name(), root.folder)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


# -- one topic -------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Plan:
    topic: str
    ledger_id: int | None
    pointer: Pointer
    manifest: bytes | None = None  # SRC's, as stored
    files: list[dict[str, Any]] | None = None  # the manifest's entries
    prefix: str = ""  # the ledger's key prefix, ``<topic>/ledger-<id>/``
    history: list[str] | None = None
    extras: list[str] | None = None  # the state files SRC has in the topic's folder
    note: str | None = None  # copied nothing: why
    conflict: str | None = None  # DST has the topic already: what


def _plan(src: LedgerStore, dst: LedgerStore, topic: str, state: TopicState) -> _Plan:
    if src.deletion_pending(topic):
        return _Plan(topic, None, Pointer(None), note="skipped: its deletion is pending on SRC")
    pointer = src.pointer(topic)
    plan = _Plan(topic, pointer.ledger, pointer)
    objects = src.objects
    plan.history = [info.key for info in objects.list(layout.history_prefix(topic))]
    if objects.head(layout.legacy_history_key(topic)) is not None:  # SRC written by the older layout
        plan.history.append(layout.legacy_history_key(topic))
    plan.extras = [layout.topic_prefix(topic) + name for name in state.files
                   if objects.head(layout.topic_prefix(topic) + name) is not None]
    ours = {*map(_history_target, plan.history), *plan.extras}
    if pointer.ledger is not None:
        prefix = plan.prefix = src.ledger_key(topic, pointer.ledger) + "/"
        plan.files = load_manifest(objects, prefix, topic, pointer.ledger).files
        plan.manifest = objects.get(prefix + MANIFEST)
        ours |= {prefix + MANIFEST, *(prefix + str(entry["name"]) for entry in plan.files)}
    _compare(dst.objects, plan, ours, state)
    return plan


def _compare(dst: ObjectStore, plan: _Plan, ours: set[str], state: TopicState) -> None:
    """Set ``plan.conflict`` if DST has the topic as something else than SRC's (or an interrupted copy of
    it), ``plan.note`` if it has it complete, byte for byte."""
    topic = plan.topic
    if dst.head(layout.pointer_key(topic)) is None:
        theirs = [info.key for prefix in (layout.topic_prefix(topic), layout.history_prefix(topic))
                  for info in dst.list(prefix)]
        foreign = sorted(set(theirs) - ours)
        if foreign:
            plan.conflict = f"{dst.location(foreign[0])} is not SRC's"
        return
    try:
        theirs_pointer = read_pointer(dst, topic)
    except LedgerCorrupt as exc:
        plan.conflict = str(exc)
        return
    if theirs_pointer.ledger != plan.ledger_id or plan.ledger_id is None:
        plan.conflict = f"its pointer names ledger {theirs_pointer.ledger}, SRC's {plan.ledger_id}"
        return
    prefix = plan.prefix
    if _get(dst, prefix + MANIFEST) == plan.manifest and not any(
            check_object(dst, prefix, entry) for entry in plan.files or []):
        plan.note = "already on DST, the same ledger byte for byte"
        return
    plan.conflict = f"its ledger {plan.ledger_id} differs from SRC's"


def _copy_topic(src: LedgerStore, dst: LedgerStore, plan: _Plan, state: TopicState) -> TopicMoved:
    started = time.monotonic()
    topic, size = plan.topic, 0
    if plan.ledger_id is not None:
        prefix = plan.prefix
        for entry in plan.files or []:
            _copy_part(src.objects, dst.objects, prefix, entry, f"ledger {plan.ledger_id} of topic {topic!r}")
            size += int(entry["bytes"])
        dst.objects.put(prefix + MANIFEST, plan.manifest or b"")  # after the parts: a ledger with a manifest is whole
    for key in plan.history or []:
        dst.objects.put(_history_target(key), src.objects.get(key))
    for key in plan.extras or []:
        dst.objects.put(key, src.objects.get(key))
    if plan.ledger_id is None:
        return TopicMoved(topic, None, seconds=time.monotonic() - started,
                          note="no current ledger on SRC: its history and policies copied")
    used = [plan.ledger_id, *(r.id for r in plan.pointer.retired), last_id(src.objects, topic) or 0]
    raise_last_id(dst.objects, topic, max(used))
    # Epoch 0: no daemon wrote it, so that whichever opens DST switches from it.
    write_pointer(dst.objects, topic, Pointer(plan.ledger_id), Pointer(None))
    return TopicMoved(topic, plan.ledger_id, len(plan.files or []), size, time.monotonic() - started)


def _copy_part(src: ObjectStore, dst: ObjectStore, prefix: str, entry: dict[str, Any], where: str) -> None:
    """Copy one part through a local file, checked against its manifest entry on SRC and again on DST.

    :raises LedgerCorrupt: it fails the check on either side, naming the part and where.
    """
    key = prefix + str(entry["name"])
    with tempfile.TemporaryDirectory(prefix="compactord-migrate-") as folder:
        path = Path(folder) / "part"
        with src.open_input(key) as reader, open(path, "wb") as out:
            shutil.copyfileobj(reader, out, _CHUNK)
        crc, size = file_crc32c(path), path.stat().st_size
        if (size, crc) != (entry.get("bytes"), entry.get("crc32c")):
            raise LedgerCorrupt(f"{where}: part {entry['name']} on SRC ({src.location(key)}) has {size} bytes, "
                                f"CRC-32C {crc}; its manifest records {entry.get('bytes')} bytes, CRC-32C "
                                f"{entry.get('crc32c')}: nothing of the topic is made current on DST")
        dst.put_file(key, path)
    problem = check_object(dst, prefix, entry)
    if problem is not None:
        raise LedgerCorrupt(f"{where}: part {entry['name']} as written to DST ({dst.location(key)}) {problem}; "
                            "the topic's pointer is not written on DST (run the migration again)")


def _history_target(key: str) -> str:
    """Where a history object of SRC goes on DST: an older layout's ``history/<topic>.jsonl`` to its place in
    this one (``upgrade.py``), any other where it is."""
    if key.startswith(layout.history_root()) and "/" not in key[len(layout.history_root()):]:
        return layout.history_file_key(key[len(layout.history_root()):].removesuffix(layout.LEGACY_HISTORY_SUFFIX))
    return key


def _get(objects: ObjectStore, key: str) -> bytes | None:
    try:
        return objects.get(key)
    except ObjectNotFound:
        return None
