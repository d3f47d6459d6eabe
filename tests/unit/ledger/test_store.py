"""LedgerStore on real files: the root's lock (also held by another process), ids, finalize, verify,
the atomic pointer, orphans, and the names and paths it refuses."""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crc32c
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compactord.errors import (
    InsufficientDiskSpace,
    InvalidArgument,
    InvalidTopicName,
    LedgerCorrupt,
    LedgerRootLocked,
)
from compactord.ledger.store import LedgerStore
from compactord.model import RECORD_SCHEMA, LedgerManifest, StrategySettings

REPO = Path(__file__).resolve().parents[3]


def rows(partition: int, offsets: range, markers: frozenset[int] = frozenset()) -> list[dict[str, Any]]:
    return [
        {"partition": partition, "offset": o, "key": b"k%d" % o, "value": b"v%d" % o, "marker": o in markers}
        for o in offsets
    ]


def spark_write(ledger_dir: Path, *parts: list[dict[str, Any]]) -> None:
    """Write part files the way Spark leaves them: with ``_SUCCESS`` and ``.crc`` side files."""
    ledger_dir.mkdir(parents=True)
    for i, part in enumerate(parts):
        name = f"part-{i:05d}-c000.snappy.parquet"
        pq.write_table(pa.Table.from_pylist(part, schema=RECORD_SCHEMA), ledger_dir / name, row_group_size=50)
        (ledger_dir / f".{name}.crc").write_bytes(b"crc")
    (ledger_dir / "_SUCCESS").write_bytes(b"")
    (ledger_dir / "._SUCCESS.crc").write_bytes(b"crc")


def manifest(topic: str, ledger_id: int) -> LedgerManifest:
    return LedgerManifest(ledger_id, topic, horizon={0: 99}, strategy=StrategySettings(), files=[])


def make_ledger(store: LedgerStore, topic: str, *parts: list[dict[str, Any]]) -> int:
    ledger_id, path = store.allocate_ledger(topic)
    spark_write(path, *(parts or (rows(0, range(10)),)))
    store.finalize_ledger(topic, ledger_id, manifest(topic, ledger_id))
    return ledger_id


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LedgerStore]:
    with LedgerStore(tmp_path / "root") as s:
        yield s


# -- the root's lock ---------------------------------------------------------------------------


def test_open_creates_root_and_names_the_holder(tmp_path: Path) -> None:
    with LedgerStore(tmp_path / "a" / "root") as s:
        assert s.is_open and s.root.is_absolute()
        holder = json.loads((s.root / "@compactord" / "lock").read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    assert not s.is_open
    LedgerStore(tmp_path / "a" / "root").open().close()  # released: free again


def test_second_store_in_the_same_process_is_refused(store: LedgerStore) -> None:
    with pytest.raises(LedgerRootLocked, match=f"pid {os.getpid()}"):
        LedgerStore(store.root).open()


def test_lock_held_by_another_process_then_free_after_sigkill(tmp_path: Path) -> None:
    root = tmp_path / "root"
    code = (
        "import sys, time\n"
        "from compactord.ledger.store import LedgerStore\n"
        "LedgerStore(sys.argv[1]).open()\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(root)], cwd=REPO, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        readable, _, _ = select.select([proc.stdout], [], [], 60)
        assert readable and proc.stdout.readline().strip() == b"ready"
        with pytest.raises(LedgerRootLocked) as info:
            LedgerStore(root).open()
        assert f"pid {proc.pid}" in str(info.value) and socket.gethostname() in str(info.value)
        assert str(root) in str(info.value)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    # The holder died without closing: flock released its lock with it.
    with LedgerStore(root) as s:
        assert json.loads((root / "@compactord" / "lock").read_text())["pid"] == os.getpid()
        assert s.is_open


# -- ids ---------------------------------------------------------------------------------------


def test_allocate_creates_the_topic_dir_but_not_the_ledger_dir(store: LedgerStore) -> None:
    ledger_id, path = store.allocate_ledger("orders")
    assert ledger_id == 1 and path == store.root / "orders" / "ledger-1"
    assert store.topic_dir("orders").is_dir() and not path.exists()
    assert store.topics() == []  # a topic is listed once it holds an object, as on an object store
    store.switch("orders", make_ledger(store, "orders"))
    assert store.topics() == ["orders"]


def test_ids_increase_per_topic_and_are_never_reused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    seen: list[int] = []
    with LedgerStore(root) as s:
        assert [s.allocate_ledger("a")[0], s.allocate_ledger("b")[0]] == [1, 1]  # per topic
        current = make_ledger(s, "a")
        s.switch("a", current)
        seen += [current, make_ledger(s, "a")]  # the last one becomes an orphan
    with LedgerStore(root) as s:  # orphans removed at open
        assert not s.ledger_path("a", seen[-1]).exists()
        seen.append(s.allocate_ledger("a")[0])
        s.delete_ledger("a", seen[-2])
        seen.append(s.allocate_ledger("a")[0])
        s.delete_topic("a")  # its ledgers, pointer and folder go; its last id stays
        assert not s.topic_dir("a").exists() and s.topics() == []
        seen.append(s.allocate_ledger("a")[0])
        threads_ids: list[int] = []
        workers = [
            threading.Thread(target=lambda: threads_ids.append(s.allocate_ledger("c")[0])) for _ in range(20)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert seen == sorted(seen) and len(set(seen)) == len(seen) == 5 and seen[0] == 2
    assert sorted(threads_ids) == list(range(1, 21))


def test_a_lost_counter_never_reuses_an_id_of_the_topic(store: LedgerStore) -> None:
    ledger_id = make_ledger(store, "t")
    store.switch("t", ledger_id)
    (store.root / "@compactord" / "ledger-ids" / "t").unlink()
    assert store.allocate_ledger("t")[0] == ledger_id + 1


def test_ids_stay_above_an_older_versions_root_counter(store: LedgerStore) -> None:
    (store.root / "@compactord" / "ledger-seq").write_text("41\n")
    assert store.allocate_ledger("t")[0] == 42
    assert store.allocate_ledger("t")[0] == 43
    assert store.allocate_ledger("u")[0] == 42


def test_a_garbled_counter_is_reported(store: LedgerStore) -> None:
    (store.root / "@compactord" / "ledger-seq").write_text("twelve")
    with pytest.raises(LedgerCorrupt, match="ledger-seq"):
        store.allocate_ledger("t")


# -- finalize and verify -----------------------------------------------------------------------


def test_finalize_counts_checksums_and_removes_spark_leftovers(store: LedgerStore) -> None:
    ledger_id, path = store.allocate_ledger("t")
    spark_write(path, rows(0, range(120), frozenset({3, 7})), rows(1, range(30), frozenset({0})))
    result = store.finalize_ledger("t", ledger_id, manifest("t", ledger_id))
    assert sorted(p.name for p in path.iterdir()) == [
        "manifest.json", "part-00000-c000.snappy.parquet", "part-00001-c000.snappy.parquet"
    ]
    assert [f["name"] for f in result.files] == sorted(f["name"] for f in result.files)
    for f in result.files:
        data = (path / f["name"]).read_bytes()
        assert f["bytes"] == len(data) and f["crc32c"] == crc32c.crc32c(data)
        assert f["rows"] == pq.read_metadata(path / f["name"]).num_rows
    assert [f["rows"] for f in result.files] == [120, 30]
    assert (result.markers, result.records_kept) == (3, 147)
    assert result.bytes == sum(f["bytes"] for f in result.files)
    assert store.load_manifest("t", ledger_id) == result
    assert json.loads((path / "manifest.json").read_text()) == result.to_json()
    assert store.verify("t", ledger_id) == result


def test_finalize_reads_the_parts_at_once(store: LedgerStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sealing describes the part files that come without their writer's seal side by side: each part's read
    (the store's time) waits here until the other part's has started too, which one part after the other
    never reaches (the barrier breaks)."""
    both = threading.Barrier(2, timeout=10)
    synced: list[str] = []
    real_get = store.objects.get

    def get(key: str, *args: object) -> bytes:
        if key.endswith(".parquet"):
            both.wait()
            synced.append(key.rpartition("/")[2])
        return real_get(key, *args)

    monkeypatch.setattr(store.objects, "get", get)
    ledger_id, path = store.allocate_ledger("t")
    spark_write(path, rows(0, range(50)), rows(1, range(20)))
    result = store.finalize_ledger("t", ledger_id, manifest("t", ledger_id))
    assert sorted(synced) == ["part-00000-c000.snappy.parquet", "part-00001-c000.snappy.parquet"]
    assert [f["rows"] for f in result.files] == [50, 20]  # in the parts' order, whichever finished first
    assert store.verify("t", ledger_id) == result


def test_finalize_without_files_writes_one_empty_file(store: LedgerStore) -> None:
    ledger_id, path = store.allocate_ledger("t")
    result = store.finalize_ledger("t", ledger_id, manifest("t", ledger_id))
    assert len(result.files) == 1 and result.files[0]["rows"] == 0
    assert (result.records_kept, result.markers) == (0, 0)
    assert pq.read_schema(path / result.files[0]["name"]).names == RECORD_SCHEMA.names
    store.verify("t", ledger_id)


def test_finalize_refuses_a_manifest_of_another_ledger(store: LedgerStore) -> None:
    ledger_id, _ = store.allocate_ledger("t")
    with pytest.raises(InvalidArgument, match="must match"):
        store.finalize_ledger("t", ledger_id, manifest("t", ledger_id + 1))


def test_finalize_reports_a_part_that_is_not_parquet(store: LedgerStore) -> None:
    ledger_id, path = store.allocate_ledger("t")
    path.mkdir()
    (path / "part-00000.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(LedgerCorrupt, match="part-00000.parquet"):
        store.finalize_ledger("t", ledger_id, manifest("t", ledger_id))


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[:-10])


def _flip(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x01
    file.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "problem"),
    [(Path.unlink, "is missing"), (_truncate, "has size"), (_flip, "fails its checksum")],
)
def test_verify_catches_damage(store: LedgerStore, damage: Any, problem: str) -> None:
    ledger_id = make_ledger(store, "t", rows(0, range(100)), rows(1, range(100)))
    victim = sorted(store.ledger_path("t", ledger_id).glob("part-*"))[1]
    damage(victim)
    with pytest.raises(LedgerCorrupt) as info:
        store.verify("t", ledger_id)
    message = str(info.value)
    assert problem in message and victim.name in message
    assert f"ledger {ledger_id} of topic 't'" in message


@pytest.mark.parametrize("content", [None, b"{not json", b'{"ledger_id": 1}'])
def test_a_missing_or_unparseable_manifest_is_corrupt(store: LedgerStore, content: bytes | None) -> None:
    ledger_id = make_ledger(store, "t")
    path = store.ledger_path("t", ledger_id) / "manifest.json"
    if content is None:
        path.unlink()
    else:
        path.write_bytes(content)
    with pytest.raises(LedgerCorrupt, match=str(path)):
        store.verify("t", ledger_id)


# -- the pointer -------------------------------------------------------------------------------


def test_switch_replaces_the_pointer(store: LedgerStore) -> None:
    assert store.current_ledger_id("t") is None
    first, second = make_ledger(store, "t"), make_ledger(store, "t")
    store.switch("t", first)
    assert json.loads((store.topic_dir("t") / "CURRENT").read_text()) == {"ledger": first, "epoch": 1, "retired": []}
    store.switch("t", second)
    assert store.current_ledger_id("t") == second
    assert not (store.topic_dir("t") / "CURRENT.tmp").exists()


def test_switch_refuses_a_ledger_that_was_not_finalized(store: LedgerStore) -> None:
    ledger_id, path = store.allocate_ledger("t")
    spark_write(path, rows(0, range(3)))
    with pytest.raises(InvalidArgument, match="finalized"):
        store.switch("t", ledger_id)


def test_concurrent_readers_always_see_a_whole_pointer(store: LedgerStore) -> None:
    ids = {make_ledger(store, "t"), make_ledger(store, "t")}
    store.switch("t", min(ids))
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            for ledger_id in ids:
                store.switch("t", ledger_id)

    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        seen = {store.current_ledger_id("t") for _ in range(2000)}
    finally:
        stop.set()
        flipper.join()
    assert seen <= ids


def test_a_process_killed_while_switching_leaves_a_whole_pointer(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with LedgerStore(root) as s:
        s.switch("t", make_ledger(s, "t"))
    # Each run adds a ledger, then flips CURRENT between it and the current one until it is killed.
    code = (
        "import sys\n"
        "from compactord.ledger.store import LedgerStore\n"
        "from compactord.model import LedgerManifest, StrategySettings\n"
        "s = LedgerStore(sys.argv[1]).open()\n"
        "old = s.current_ledger_id('t')\n"
        "new, _ = s.allocate_ledger('t')\n"
        "s.finalize_ledger('t', new, LedgerManifest(new, 't', {}, StrategySettings(), []))\n"
        "print(old, new, flush=True)\n"
        "while True:\n"
        "    s.switch('t', new)\n"
        "    s.switch('t', old)\n"
    )
    for delay in (0.0, 0.05, 0.13):
        proc = subprocess.Popen([sys.executable, "-c", code, str(root)], cwd=REPO, stdout=subprocess.PIPE)
        try:
            assert proc.stdout is not None
            readable, _, _ = select.select([proc.stdout], [], [], 60)
            assert readable
            ids = {int(i) for i in proc.stdout.readline().split()}
            time.sleep(delay)
            assert proc.poll() is None, "the switching process died before it was killed"
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        with LedgerStore(root) as s:  # also removes a CURRENT.tmp the kill left, and the other ledger
            current = s.current_ledger_id("t")
            assert len(ids) == 2 and current in ids
            assert sorted(p.name for p in s.topic_dir("t").iterdir()) == ["CURRENT", f"ledger-{current}"]
            s.verify("t", current)


@pytest.mark.parametrize("content", ["", "ledger-\n", "ledger-0\n", "ledger-1\nledger-2\n", "garbage"])
def test_a_malformed_pointer_is_corrupt(store: LedgerStore, content: str) -> None:
    store.topic_dir("t").mkdir()
    (store.topic_dir("t") / "CURRENT").write_text(content)
    with pytest.raises(LedgerCorrupt, match="CURRENT"):
        store.current_ledger_id("t")


# -- orphans -----------------------------------------------------------------------------------


def test_remove_orphans_keeps_the_current_ledger_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "root"
    with LedgerStore(root) as s:
        old, current, partial = make_ledger(s, "t"), make_ledger(s, "t"), s.allocate_ledger("t")[1]
        spark_write(partial, rows(0, range(5)))
        s.switch("t", current)
        (s.topic_dir("t") / "CURRENT.tmp").write_text("ledger-")
        (s.ledger_path("t", current) / "manifest.json.tmp").write_text("{")
        s.allocate_ledger("never-switched")
        spark_write(s.allocate_ledger("never-switched")[1], rows(0, range(5)))  # not finalized: cleaned
    with caplog.at_level(logging.WARNING, logger="compactord.ledger.store"), LedgerStore(root) as s:
        assert sorted(p.name for p in s.topic_dir("t").iterdir()) == ["CURRENT", f"ledger-{current}"]
        assert sorted(p.name for p in s.ledger_path("t", current).iterdir()) == [
            "manifest.json", "part-00000-c000.snappy.parquet"
        ]
        assert list(s.topic_dir("never-switched").iterdir()) == [] and s.topics() == ["t"]
        s.verify("t", current)
    logged = caplog.text
    for name in (f"ledger-{old}", partial.name, "CURRENT.tmp", "manifest.json.tmp"):
        assert name in logged
    assert s.remove_orphans("t") == []


def test_open_keeps_every_ledger_of_a_topic_with_a_malformed_pointer(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with LedgerStore(root) as s:
        ledger_id = make_ledger(s, "t")
        (s.topic_dir("t") / "CURRENT").write_text("oops")
    with LedgerStore(root) as s:
        assert s.ledger_path("t", ledger_id).is_dir()
        with pytest.raises(LedgerCorrupt):
            s.remove_orphans("t")


# -- names and paths ---------------------------------------------------------------------------

BAD_NAMES = ["..", ".", "../x", "a/b", "/etc", "x" * 250, "", "@compactord", "a b", "ü"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_topic_names_never_reach_the_file_system(store: LedgerStore, name: str) -> None:
    for call in (store.topic_dir, store.current_ledger_id, store.allocate_ledger, store.delete_topic):
        with pytest.raises(InvalidTopicName):
            call(name)
    with pytest.raises(InvalidTopicName):
        store.ledger_path(name, 1)
    assert sorted(p.name for p in store.root.iterdir() if not p.name.startswith(".~")) == ["@compactord"]


def test_a_topic_dir_linking_outside_the_root_is_refused(store: LedgerStore, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (store.root / "t").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(InvalidArgument, match="outside"):
        store.topic_dir("t")


@pytest.mark.parametrize("ledger_id", [0, -1, True, "1", 1.0])
def test_ledger_ids_are_positive_integers(store: LedgerStore, ledger_id: Any) -> None:
    with pytest.raises(InvalidArgument, match="positive integer"):
        store.ledger_path("t", ledger_id)


def test_topics_lists_valid_topic_dirs_only(store: LedgerStore) -> None:
    for name in ("b.topic", "a_topic", "not a topic", "empty"):
        (store.root / name).mkdir()
        if name != "empty":
            (store.root / name / "policies.json").write_text("{}")
    (store.root / "file-not-dir").write_text("")
    assert store.topics() == ["a_topic", "b.topic"]
    assert LedgerStore(store.root / "missing").topics() == []


# -- space and removal -------------------------------------------------------------------------


def test_check_free_space(store: LedgerStore) -> None:
    store.check_free_space(0)
    store.check_free_space(1024)
    with pytest.raises(InsufficientDiskSpace, match=r"has \d+ bytes free; the next ledger needs 10{18}\b"):
        store.check_free_space(10**18)
    with pytest.raises(InvalidArgument):
        store.check_free_space(-1)


def test_delete_ledger_refuses_the_current_one(store: LedgerStore) -> None:
    old, current = make_ledger(store, "t"), make_ledger(store, "t")
    store.switch("t", current)
    with pytest.raises(InvalidArgument, match="current ledger"):
        store.delete_ledger("t", current)
    store.delete_ledger("t", old)
    store.delete_ledger("t", old)  # missing is fine
    assert not store.ledger_path("t", old).exists() and store.ledger_path("t", current).exists()


def test_discard_removes_a_partial_ledger_only_inside_a_topic_dir(store: LedgerStore, tmp_path: Path) -> None:
    current = make_ledger(store, "t")
    store.switch("t", current)
    _, partial = store.allocate_ledger("t")
    spark_write(partial, rows(0, range(5)))
    store.discard(partial)
    store.discard(partial)  # missing is fine
    assert not partial.exists()
    outside = tmp_path / "outside"
    outside.mkdir()
    refused = [
        outside,
        store.root,
        store.root / "@compactord" / "lock",
        store.topic_dir("t"),
        store.topic_dir("t") / "CURRENT",
        store.ledger_path("t", current),
        store.ledger_path("t", current) / "manifest.json",
        store.topic_dir("t") / ".." / ".." / "outside",
    ]
    for path in refused:
        with pytest.raises(InvalidArgument, match="refusing to discard"):
            store.discard(path)
    assert outside.exists() and store.verify("t", current)


def test_delete_topic(store: LedgerStore) -> None:
    store.switch("t", make_ledger(store, "t"))
    store.delete_topic("t")
    store.delete_topic("t")  # missing is fine
    assert store.topics() == [] and store.current_ledger_id("t") is None
