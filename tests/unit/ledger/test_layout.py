"""The ledger root's layout (``compactord.ledger.layout``) over topic names built to collide: no two topics, and
no topic and the root, claim one object or folder; and a root the older layout wrote, upgraded at ``open()``
(``compactord.ledger.upgrade``) on a local folder and on S3, without losing a run or a quarantined ledger."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from compactord.daemon.history import RunHistory
from compactord.errors import LedgerRootUnwritable
from compactord.ledger import layout
from compactord.ledger.store import LedgerStore
from compactord.ledger.upgrade import upgrade_root
from compactord.model import validate_topic_name
from compactord.storage import LocalStore, ObjectStore
from tests.unit.test_history import ended

STAMP = "20260101T000000Z"
# Each a legal topic name, built to collide with another's key or a key of the root under some layout.
NAMES = ["coll", "coll.jsonl", "X", f"X-{STAMP}", f"X-{STAMP}-2", "A", "a", ".x", "x.", "..x", "x", "CURRENT",
         "policies.json", "DELETING", "UNLOADED", "ledger-1", "compacted.jsonl", "000000000001.json", "history",
         "quarantine", "ledger-ids", "lock", "epoch", "lease", "tmp", "check", "store-probe", "_", "-", "x" * 249]


def topic_keys(topic: str) -> list[str]:
    """Every object and folder (ending in ``/``) a topic can have."""
    return [layout.topic_prefix(topic), layout.pointer_key(topic), layout.ledger_prefix(topic, 1),
            layout.ledger_prefix(topic, 1) + "manifest.json", layout.policies_key(topic), layout.deleting_key(topic),
            layout.unloaded_key(topic), layout.last_id_key(topic), layout.history_prefix(topic),
            layout.history_file_key(topic), layout.run_key(topic, 1), layout.quarantine_prefix(topic),
            layout.quarantine_prefix(topic, STAMP), layout.quarantine_prefix(topic, f"{STAMP}-2")]


def overlap(a: str, b: str) -> bool:
    """Whether two keys claim one place: equal, or one a folder the other lies in (an object ``k`` is the
    folder ``k/`` on a local disk)."""
    folder_a, folder_b = a if a.endswith("/") else a + "/", b if b.endswith("/") else b + "/"
    return a == b or b.startswith(folder_a) or a.startswith(folder_b)


def test_the_names_are_legal_topic_names() -> None:
    assert [validate_topic_name(name) for name in NAMES] == NAMES


@pytest.mark.parametrize("first,second", itertools.combinations(NAMES, 2))
def test_two_topics_never_claim_one_key(first: str, second: str) -> None:
    clashes = [(a, b) for a in topic_keys(first) for b in topic_keys(second) if overlap(a, b)]
    assert clashes == []


@pytest.mark.parametrize("topic", NAMES)
def test_a_topic_never_claims_a_key_of_the_root(topic: str) -> None:
    containers = {layout.history_root(), layout.quarantine_root(), layout.last_ids_root()}
    own = [key for key in layout.root_keys() if key not in containers]
    assert [(r, k) for r in own for k in topic_keys(topic) if overlap(r, k)] == []
    for key in topic_keys(topic):  # within the root's folders of topics, the name below is the topic's alone
        for container in containers:
            if key.startswith(container):
                assert key[len(container):].split("/")[0] == topic, key
    assert not layout.topic_prefix(topic).startswith(layout.DAEMON_DIR)


def test_a_local_root_on_this_file_system_does_not_fold_case(tmp_path: Path) -> None:
    assert layout.case_folds(tmp_path) is False
    assert list(tmp_path.iterdir()) == []  # the probe went


def test_a_root_that_folds_case_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No case-insensitive file system can be mounted here: the answer of the probe is given.
    monkeypatch.setattr(layout, "case_folds", lambda folder: True)
    with pytest.raises(LedgerRootUnwritable, match=r"root .* is on a case-insensitive file system.*share") as err:
        LedgerStore(tmp_path / "root").open()
    assert str(tmp_path / "root") in str(err.value)
    monkeypatch.undo()
    LedgerStore(tmp_path / "root").open().close()  # refused before anything: the lock is free again


# -- a root of the older layout ----------------------------------------------------------------------


def _old_root(objects: ObjectStore, both: bool) -> dict[str, list[str]]:
    """Write a root as the older layout did, by hand; return each topic's task ids as recorded.

    ``history/orders.jsonl`` is ``orders``'s compacted file beside its folder of later runs; ``history/coll.jsonl/``
    is the topic ``coll.jsonl``'s folder of runs; with ``both`` (an object store) ``history/coll.jsonl`` is also
    ``coll``'s compacted file. ``quarantine/t-<time>/`` and ``quarantine/t-<time>-2/`` hold ``t``'s ledgers."""
    runs: dict[str, list[str]] = {}

    def line(topic: str, seq: int) -> bytes:
        record = ended(topic)
        runs.setdefault(topic, []).append(record.task_id)
        return json.dumps({**record.to_json(), "seq": seq}).encode() + b"\n"

    objects.put("@compactord/history/orders.jsonl", line("orders", 1) + line("orders", 2))
    objects.put("@compactord/history/orders/000000000003.json", line("orders", 3))
    objects.put("@compactord/history/coll.jsonl/000000000001.json", line("coll.jsonl", 1))
    if both:
        objects.put("@compactord/history/coll.jsonl", line("coll", 1) + line("coll", 2))
    objects.put("@compactord/history/coll/000000000003.json", line("coll", 3))
    for folder in (f"t-{STAMP}", f"t-{STAMP}-2"):
        objects.put(f"@compactord/quarantine/{folder}/ledger-1/manifest.json", b"{}")
        objects.put(f"@compactord/quarantine/{folder}/ledger-1/part-0.parquet", folder.encode())
    return runs


def _check_upgraded(objects: ObjectStore, runs: dict[str, list[str]]) -> None:
    history = RunHistory(objects, 1000, 30)
    for topic, ids in runs.items():
        assert [r.task_id for r in history.runs(topic)] == list(reversed(ids)), topic
    assert objects.children(layout.history_root()) == sorted(f"{topic}/" for topic in runs)
    assert objects.children(layout.quarantine_root()) == ["t/"]
    for stamp in (STAMP, f"{STAMP}-2"):
        assert objects.get(layout.quarantine_prefix("t", stamp) + "ledger-1/part-0.parquet") == f"t-{stamp}".encode()


def test_a_local_root_of_the_older_layout_is_upgraded_at_open(tmp_path: Path) -> None:
    root = tmp_path / "root"
    runs = _old_root(LocalStore(root), both=False)  # coll's file could not be written beside coll.jsonl's folder
    assert (root / "@compactord" / "history" / "orders.jsonl").is_file()
    assert (root / "@compactord" / "history" / "coll.jsonl").is_dir()
    with LedgerStore(root) as store:
        _check_upgraded(store.objects, runs)
        assert store.quarantined() == [f"t/{STAMP}", f"t/{STAMP}-2"]
        assert RunHistory(store.objects, 1000, 30).append(ended("coll")).seq == 4  # numbering goes on
        runs["coll"].append(RunHistory(store.objects, 1000, 30).runs("coll")[0].task_id)
    with LedgerStore(root) as store:  # a second start finds nothing to move
        _check_upgraded(store.objects, runs)
        assert not (root / "@compactord" / "history" / "orders.jsonl").exists()


def test_an_s3_root_of_the_older_layout_is_upgraded(s3_server: object) -> None:
    objects = s3_server.store()  # type: ignore[attr-defined]
    runs = _old_root(objects, both=True)
    upgrade_root(objects)
    _check_upgraded(objects, runs)
    assert objects.head("@compactord/history/coll.jsonl") is None  # only the folder of topic coll.jsonl is left
    assert RunHistory(objects, 1000, 30).append(ended("coll")).seq == 4


def test_an_upgrade_a_crash_interrupted_is_done_again_without_losing_a_run(tmp_path: Path) -> None:
    objects = LocalStore(tmp_path)
    runs = _old_root(objects, both=False)
    # the crash came after the file was written at its new place, before the old one was deleted; and after
    # one quarantined ledger was copied
    objects.put(layout.history_file_key("orders"), objects.get("@compactord/history/orders.jsonl"))
    objects.copy(f"@compactord/quarantine/t-{STAMP}/ledger-1/manifest.json",
                 layout.quarantine_prefix("t", STAMP) + "ledger-1/manifest.json")
    upgrade_root(objects)
    _check_upgraded(objects, runs)
