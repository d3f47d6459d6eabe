"""The ledger root's layout: every key of a root is built here, one function per kind of object.

Two rules keep the objects of two topics, and a topic's and the root's, apart for every pair of legal Kafka
topic names (``model.validate_topic_name``: 1-249 of ``[a-zA-Z0-9._-]``, not ``.`` or ``..``):

- the root's own objects are under ``@compactord/`` (``@`` is illegal in a topic name);
- a topic's objects are inside a folder named exactly by the topic (``<topic>/``,
  ``@compactord/history/<topic>/``, ``@compactord/quarantine/<topic>/``), or are one object named exactly by
  it (``@compactord/ledger-ids/<topic>``); nothing beside such a folder is named by a topic plus a suffix, so
  no topic's folder is another's object (``X`` and ``X.jsonl``, ``X`` and ``X-<time>``).

A topic's folder holds only fixed names (``CURRENT``, ``ledger-<id>/``, ``policies.json``, ``DELETING``,
``UNLOADED``; ``compacted.jsonl`` and ``<seq>.json`` in its history folder), one level below the topic folders,
so a topic named like one of them (``CURRENT``) is a folder of its own beside the others. Names differing only
in case (``A``, ``a``) are distinct on a case-sensitive store (S3, Linux file systems); a local root on a
case-insensitive file system is refused at the start (``case_folds``).

Layout (docs/upgrading.md, "The ledger root today"; ``upgrade.py`` moves a root written by the older one)::

    @compactord/lock  epoch  lease  cluster  ledger-seq  write-probe  store-probe  check/  progress/  tmp/
    @compactord/ledger-ids/<topic>
    @compactord/history/<topic>/compacted.jsonl
    @compactord/history/<topic>/<seq>.json
    @compactord/quarantine/<topic>/<time>/ledger-<id>/...
    <topic>/CURRENT  <topic>/ledger-<id>/...  <topic>/policies.json  <topic>/DELETING  <topic>/UNLOADED
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from compactord.errors import CompactordError, LedgerRootUnwritable
from compactord.model import validate_topic_name

__all__ = ["CURRENT", "DAEMON_DIR", "DELETING", "HISTORY_FILE", "LEDGER_RE", "LEGACY_HISTORY_SUFFIX", "MANIFEST", "POLICIES",
           "RUN_RE", "UNLOADED", "case_folds", "cluster_key", "deleting_key", "epoch_key", "history_file_key", "history_prefix", "history_root",
           "is_topic_name", "last_id_key", "last_ids_root", "lease_key", "ledger_dir_name", "ledger_prefix", "legacy_history_key",
           "legacy_seq_key", "lock_name", "pointer_key", "policies_key", "progress_name", "quarantine_prefix", "quarantine_root",
           "refuse_folded_case", "root_keys", "run_key", "store_probe_key", "topic_prefix", "unloaded_key", "write_probe_key"]

DAEMON_DIR = "@compactord"  # ``@`` is illegal in topic names: no topic folder is ever this one

# The fixed names inside a topic's folder.
CURRENT = "CURRENT"
POLICIES = "policies.json"
MANIFEST = "manifest.json"  # a ledger folder's list of its files
DELETING = "DELETING"
UNLOADED = "UNLOADED"
LEDGER_RE = re.compile(r"ledger-([1-9][0-9]*)")

# The fixed names inside a topic's history folder: the compacted file beside the runs recorded one by one.
HISTORY_FILE = "compacted.jsonl"
RUN_RE = re.compile(r"[0-9]{12}\.json")
LEGACY_HISTORY_SUFFIX = ".jsonl"  # the older layout's ``history/<topic>.jsonl``, beside the topic folders

_HISTORY, _QUARANTINE, _LAST_IDS = "history", "quarantine", "ledger-ids"
_CASE_PROBE = "case-Probe"


def _topic(topic: str) -> str:
    """:raises InvalidTopicName: ``topic`` is not a legal Kafka topic name."""
    return validate_topic_name(topic)


def is_topic_name(name: str) -> bool:
    """Whether ``name`` is a legal Kafka topic name (a folder under the root that is a topic's)."""
    try:
        validate_topic_name(name)
    except CompactordError:
        return False
    return True


# -- the root's own ---------------------------------------------------------------------------------

def lock_name() -> str:
    """The root's lock file, within ``@compactord`` (a local root's)."""
    return "lock"


def progress_name() -> str:
    """The folder of an older version's task progress files, within ``@compactord`` (removed at the start)."""
    return "progress"


def epoch_key() -> str:
    return f"{DAEMON_DIR}/epoch"


def lease_key() -> str:
    return f"{DAEMON_DIR}/lease"


def cluster_key() -> str:
    """The mark of a root shared by a cluster's daemons, naming the cluster (``ownership.py``): created once."""
    return f"{DAEMON_DIR}/cluster"


def legacy_seq_key() -> str:
    """An older version's root-wide last ledger id (read, never written)."""
    return f"{DAEMON_DIR}/ledger-seq"


def write_probe_key(writer: str = "") -> str:
    """The object a daemon writes and deletes at its start to find out that the root can be written: one of its
    own (``writer``), since the members of a cluster open one root at once and would delete each other's."""
    return f"{DAEMON_DIR}/write-probe" + (f"-{writer}" if writer else "")


def store_probe_key() -> str:
    """What the daemon's store watch asks for; it need not exist."""
    return f"{DAEMON_DIR}/store-probe"


def last_ids_root() -> str:
    return f"{DAEMON_DIR}/{_LAST_IDS}/"


def history_root() -> str:
    return f"{DAEMON_DIR}/{_HISTORY}/"


def quarantine_root() -> str:
    return f"{DAEMON_DIR}/{_QUARANTINE}/"


def root_keys() -> list[str]:
    """Every key and folder (ending in ``/``) of the root's own that is not a topic's: what no topic key may
    equal or lie in. ``@compactord/check/`` is an S3 store's own probe (``storage/s3.py``)."""
    return [f"{DAEMON_DIR}/{lock_name()}", epoch_key(), lease_key(), cluster_key(), legacy_seq_key(), write_probe_key(),
            store_probe_key(), f"{DAEMON_DIR}/{progress_name()}/", f"{DAEMON_DIR}/tmp/", f"{DAEMON_DIR}/check/",
            last_ids_root(), history_root(), quarantine_root()]


# -- a topic's --------------------------------------------------------------------------------------

def topic_prefix(topic: str) -> str:
    """The topic's folder: its pointer, ledgers, policies and marks."""
    return f"{_topic(topic)}/"


def pointer_key(topic: str) -> str:
    return f"{_topic(topic)}/{CURRENT}"


def ledger_dir_name(ledger_id: int) -> str:
    """The folder name of a ledger within its topic's folder."""
    return f"ledger-{ledger_id}"


def ledger_prefix(topic: str, ledger_id: int) -> str:
    """``<topic>/ledger-<id>/``: a ledger's parts and manifest (the id is the caller's to check)."""
    return f"{_topic(topic)}/{ledger_dir_name(ledger_id)}/"


def policies_key(topic: str) -> str:
    return f"{_topic(topic)}/{POLICIES}"


def deleting_key(topic: str) -> str:
    return f"{_topic(topic)}/{DELETING}"


def unloaded_key(topic: str) -> str:
    return f"{_topic(topic)}/{UNLOADED}"


def last_id_key(topic: str) -> str:
    """The topic's last ledger id: outside its folder, so that it outlives the topic's deletion."""
    return f"{last_ids_root()}{_topic(topic)}"


def history_prefix(topic: str) -> str:
    """The topic's run history folder: ``compacted.jsonl`` and the runs recorded since (``<seq>.json``)."""
    return f"{history_root()}{_topic(topic)}/"


def history_file_key(topic: str) -> str:
    return f"{history_prefix(topic)}{HISTORY_FILE}"


def run_key(topic: str, seq: int) -> str:
    return f"{history_prefix(topic)}{seq:012d}.json"


def quarantine_prefix(topic: str, stamp: str = "") -> str:
    """The topic's quarantine folder, or with ``stamp`` the folder of one quarantine of it."""
    return f"{quarantine_root()}{_topic(topic)}/" + (f"{stamp}/" if stamp else "")


def legacy_history_key(topic: str) -> str:
    """The older layout's compacted history file, ``@compactord/history/<topic>.jsonl`` (read to upgrade it)."""
    return f"{history_root()}{_topic(topic)}{LEGACY_HISTORY_SUFFIX}"


def case_folds(folder: Path) -> bool:
    """Whether the file system of ``folder`` (the root's ``@compactord``, which exists) takes a name and its
    other case for one file: then topics ``A`` and ``a`` would share a folder. A probe file is written under
    one case and looked up under the other, then removed.

    :raises OSError: the probe cannot be written or removed.
    """
    probe = folder / _CASE_PROBE
    probe.touch()
    try:
        return os.path.lexists(folder / _CASE_PROBE.swapcase())
    finally:
        probe.unlink(missing_ok=True)


def refuse_folded_case(root: Path, daemon_dir: Path) -> None:
    """:raises LedgerRootUnwritable: the root's file system folds case (``case_folds``: topics ``A`` and ``a``
    would share a folder)."""
    if case_folds(daemon_dir):
        raise LedgerRootUnwritable(
            f"ledger root {root} is on a case-insensitive file system (a name and its other case are one file "
            "there), where topics whose names differ only in case would share their files; compactedLedgerRoot "
            "must be a directory on a case-sensitive file system", root=str(root))
