"""``migrate-root``: a root's current ledgers, run histories and policies copied local -> S3 -> local with reads,
pointers and ids as on the first root; a part corrupted on its way to DST fails the topic before its pointer, and
a rerun resumes; a root a daemon holds, a DST that has the topic, and bad roots are refused."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compactord.config import Settings
from compactord.daemon.history import RunHistory
from compactord.daemon.policies import POLICIES, PolicyStore, TopicPolicies
from compactord.engine.strategies import allowed_strategies
from compactord.errors import InvalidArgument, LedgerCorrupt, LedgerRootLocked
from compactord.ledger import lease
from compactord.ledger.layout import CURRENT
from compactord.ledger.migrate import Root, TopicMoved, TopicState, migrate_root, open_root
from compactord.ledger.store import LedgerStore
from compactord.model import Entry
from compactord.storage import LocalStore, ObjectStore
from tests.daemon.test_doc_examples import code_block_after, command_words
from tests.support.s3_server import ACCESS_KEY, BUCKET, REGION, SECRET_KEY
from tests.unit.ledger.test_store import REPO, make_ledger, rows
from tests.unit.test_history import S, ended

STATE = TopicState((POLICIES,))
LEASE_S = 5.0


def _history(objects: ObjectStore) -> RunHistory:
    return RunHistory(objects, 1000, 30)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A root a daemon left: ``orders`` (two partitions, markers, a retired ledger, an id a failed run took,
    policies, three runs),
    ``audit`` (one ledger, no policies) and ``gone`` (its deletion pending)."""
    root = tmp_path / "src"
    with LedgerStore(root) as store:
        old = make_ledger(store, "orders", rows(0, range(5)))
        store.switch("orders", old)
        current = make_ledger(store, "orders", rows(0, range(40), frozenset({3, 7})), rows(1, range(25)))
        store.switch("orders", current, retire_for=600)
        store.allocate_ledger("orders")  # a run that failed: id 3 is used up, though no ledger has it
        store.switch("audit", make_ledger(store, "audit"))
        store.switch("gone", make_ledger(store, "gone"))
        store.mark_deleting("gone")
        policies = PolicyStore(store, allowed_strategies(Settings()))
        policies.put("orders", TopicPolicies(thresholdMessages=100000, strategy="event-time"))
        history = _history(store.objects)
        for _ in range(3):
            history.append(ended("orders", records_read=10))
    return root


def _s3_settings(s3_server: Any) -> Settings:
    return Settings(s3_region=REGION, s3_endpoint=s3_server.endpoint, s3_access_key_id=ACCESS_KEY,
                    s3_secret_access_key=SECRET_KEY)


def _root(text: str | Path, settings: Settings | None = None, role: str = "DST") -> Root:
    return open_root(str(text), settings or Settings(), role)


def _entries(store: LedgerStore, topic: str) -> list[Entry]:
    ledger_id = store.current_ledger_id(topic)
    assert ledger_id is not None
    reader = store.open_reader(topic, ledger_id, store.verify(topic, ledger_id))
    return list(reader.entries(include_markers=True))


def _migrate(source: Root, target: Root) -> list[TopicMoved]:
    return migrate_root(source, target, STATE, LEASE_S)


def _same_topics(a: Root, b: Root) -> None:
    """``b`` serves what ``a`` does: each topic's records, its policies and run history, a pointer of epoch 0
    naming the same ledger with nothing retired, and a last id at least ``a``'s."""
    src, dst = LedgerStore(a.text, a.objects), LedgerStore(b.text, b.objects)
    assert dst.topics() == ["audit", "orders"]
    for topic in ("audit", "orders"):
        assert _entries(dst, topic) == _entries(src, topic) != []
        pointer = dst.pointer(topic)
        assert (pointer.ledger, pointer.epoch, pointer.retired) == (src.current_ledger_id(topic), 0, ())
        assert dst.ledger_ids(topic) == [pointer.ledger]  # the retired ledger stays behind
        assert _history(b.objects).runs(topic) == _history(a.objects).runs(topic)
    assert len(_history(b.objects).runs("orders")) == 3
    assert b.objects.get(f"orders/{POLICIES}") == a.objects.get(f"orders/{POLICIES}")
    assert b.objects.head(f"audit/{POLICIES}") is None


def test_a_root_moves_to_s3_and_back_with_every_read_equal(source: Path, s3_server: Any, tmp_path: Path) -> None:
    settings = _s3_settings(s3_server)
    local = _root(source, role="SRC")
    s3 = _root(f"s3://{BUCKET}/migrate-{tmp_path.name}", settings)
    moved = _migrate(local, s3)
    assert [(m.topic, m.note) for m in moved] == [
        ("audit", ""), ("gone", "skipped: its deletion is pending on SRC"), ("orders", "")]
    orders = next(m for m in moved if m.topic == "orders")
    assert (orders.parts, orders.bytes) == (2, LedgerStore(source).load_manifest("orders", orders.ledger_id or 0).bytes)
    _same_topics(local, s3)

    back = _root(tmp_path / "back")
    _migrate(_root(s3.text, settings, "SRC"), back)
    _same_topics(local, back)
    # A daemon opening the new root serves the copies (none quarantined) and takes ids above every one used.
    with LedgerStore(tmp_path / "back") as store:
        assert store.quarantined() == []
        assert _entries(store, "orders") == _entries(LedgerStore(source), "orders")
        assert store.current_ledger_id("orders") == 2 and store.allocate_ledger("orders")[0] == 4
        store.switch("orders", make_ledger(store, "orders"))  # epoch 0 on the pointer: this daemon may switch


def _flip_one_byte(objects: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make ``objects`` write each part with its middle byte flipped, as a bad disk or network would."""
    written: list[str] = []
    put_file = objects.put_file

    def flipped(key: str, path: Path) -> str:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        written.append(key)
        return put_file(key, path)

    monkeypatch.setattr(objects, "put_file", flipped)
    return written


def test_a_part_corrupted_on_dst_fails_before_its_pointer_and_a_rerun_resumes(
        source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, dst = _root(source, role="SRC"), _root(tmp_path / "dst")
    with monkeypatch.context() as patch:
        written = _flip_one_byte(dst.objects, patch)
        with pytest.raises(LedgerCorrupt) as failed:
            _migrate(src, dst)
    [part] = written  # the first topic's one part: the copy stops there
    assert part.startswith("audit/ledger-") and part.rpartition("/")[2] in str(failed.value)
    assert "fails its checksum" in str(failed.value) and "DST" in str(failed.value)
    assert dst.objects.head(f"audit/{CURRENT}") is None
    assert LedgerStore(dst.text, dst.objects).topics() == ["audit"]

    done = [m.topic for m in _migrate(src, dst) if not m.note]
    assert done == ["audit", "orders"]
    _same_topics(src, dst)


def test_a_rerun_after_an_interruption_skips_the_topics_already_complete(
        source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, dst = _root(source, role="SRC"), _root(tmp_path / "dst")
    pointers = []

    def stop_before_orders(moved: TopicMoved) -> None:
        pointers.append(dst.objects.head(f"{moved.topic}/{CURRENT}"))
        if moved.topic == "gone":
            raise KeyboardInterrupt  # the operator's ^C, between two topics

    with pytest.raises(KeyboardInterrupt):
        migrate_root(src, dst, STATE, LEASE_S, stop_before_orders)
    assert dst.objects.head(f"orders/{CURRENT}") is None and pointers[0] is not None
    again = _migrate(src, dst)
    assert [(m.topic, m.note) for m in again] == [
        ("audit", "already on DST, the same ledger byte for byte"), ("gone", "skipped: its deletion is pending on SRC"),
        ("orders", "")]
    assert dst.objects.head(f"audit/{CURRENT}") == pointers[0]  # not written again
    _same_topics(src, dst)
    assert all(m.note for m in _migrate(src, dst))


def test_a_dst_with_another_ledger_of_a_topic_is_refused_before_anything_is_copied(
        source: Path, tmp_path: Path) -> None:
    with LedgerStore(tmp_path / "dst") as store:
        store.switch("orders", make_ledger(store, "orders"))
    dst = _root(tmp_path / "dst")
    with pytest.raises(InvalidArgument, match=r"already has topic\(s\) orders \(its pointer names ledger 1, "
                                              r"SRC's \d+\).*pick an empty DST"):
        _migrate(_root(source, role="SRC"), dst)
    assert LedgerStore(dst.text, dst.objects).topics() == ["orders"]


@pytest.mark.parametrize("held", ["SRC", "DST"])
def test_a_root_a_daemon_holds_is_refused(source: Path, tmp_path: Path, held: str) -> None:
    roots = {"SRC": source, "DST": tmp_path / "dst"}
    with LedgerStore(roots[held]), pytest.raises(  # the store as a running daemon holds it
            LedgerRootLocked, match=rf"ledger root {roots[held]} is locked by another compactord \(pid \d+ on host"):
        _migrate(_root(source, role="SRC"), _root(tmp_path / "dst"))
    assert LedgerStore(tmp_path / "dst").topics() == []


def test_an_s3_root_whose_lease_a_daemon_renews_is_refused(source: Path, s3_server: Any, tmp_path: Path) -> None:
    settings = _s3_settings(s3_server)
    dst = _root(f"s3://{BUCKET}/migrate-held-{tmp_path.name}", settings)
    held = lease.acquire(dst.objects, LEASE_S)  # as a running daemon holds it: renewed by its own thread
    try:
        with pytest.raises(LedgerRootLocked, match=r"pid \d+"):
            _migrate(_root(source, role="SRC"), dst)
    finally:
        held.release()
    assert LedgerStore(dst.text, dst.objects).topics() == []
    _migrate(_root(source, role="SRC"), dst)  # released: the root is free again
    assert LedgerStore(dst.text, dst.objects).topics() == ["audit", "orders"]


def test_no_daemon_can_open_either_local_root_while_it_copies(source: Path, tmp_path: Path) -> None:
    refused: list[str] = []

    def try_to_open(moved: TopicMoved) -> None:
        for root in (source, tmp_path / "dst"):
            with pytest.raises(LedgerRootLocked) as locked:
                LedgerStore(root).open()
            refused.append(str(locked.value))

    migrate_root(_root(source, role="SRC"), _root(tmp_path / "dst"), STATE, LEASE_S, try_to_open)
    assert len(refused) == 6 and all(f"pid {os.getpid()} " in text for text in refused)
    LedgerStore(source).open().close()  # both free again once it is done
    LedgerStore(tmp_path / "dst").open().close()


def test_a_topic_without_a_ledger_moves_its_policies_and_history(tmp_path: Path) -> None:
    with LedgerStore(tmp_path / "src") as store:
        PolicyStore(store, allowed_strategies(Settings())).put("fresh", TopicPolicies(thresholdBytes=5))
        _history(store.objects).append(ended("fresh", final=S.FAILED))
    src, dst = _root(tmp_path / "src", role="SRC"), _root(tmp_path / "dst")
    [moved] = _migrate(src, dst)
    assert (moved.topic, moved.note) == ("fresh", "no current ledger on SRC: its history and policies copied")
    assert dst.objects.get(f"fresh/{POLICIES}") == src.objects.get(f"fresh/{POLICIES}")
    assert [r.state for r in _history(dst.objects).runs("fresh")] == ["Failed"]
    assert dst.objects.head(f"fresh/{CURRENT}") is None


def test_the_history_of_a_source_of_the_older_layout_lands_where_this_layout_reads_it(tmp_path: Path) -> None:
    with LedgerStore(tmp_path / "src") as store:
        _history(store.objects).append(ended("coll", final=S.FAILED))
    objects = LocalStore(tmp_path / "src")
    # what the older layout wrote: coll's compacted file, where topic coll.jsonl's runs would go
    objects.put("@compactord/history/coll.jsonl", objects.get("@compactord/history/coll/000000000001.json"))
    objects.delete("@compactord/history/coll/000000000001.json")
    for topic in ("coll", "coll.jsonl"):  # topics of the root, each with a folder
        objects.put(f"{topic}/{POLICIES}", b"{}")
    src, dst = _root(tmp_path / "src", role="SRC"), _root(tmp_path / "dst")
    assert sorted(m.topic for m in _migrate(src, dst)) == ["coll", "coll.jsonl"]
    assert [r.state for r in _history(dst.objects).runs("coll")] == ["Failed"]
    assert _history(dst.objects).runs("coll.jsonl") == []
    assert dst.objects.head("@compactord/history/coll/compacted.jsonl") is not None


def test_bad_roots_are_refused(source: Path, tmp_path: Path) -> None:
    src = _root(source, role="SRC")
    for target, problem in [(source, "are the same root"), (source / "inner", "one is inside the other"),
                            (source.parent, "one is inside the other")]:
        with pytest.raises(InvalidArgument, match=problem):
            _migrate(src, _root(target))
    with pytest.raises(InvalidArgument, match=r"SRC .*missing does not exist"):
        _migrate(_root(tmp_path / "missing", role="SRC"), _root(tmp_path / "dst"))
    with pytest.raises(InvalidArgument, match=r"SRC 'file:///x' is not a ledger root: give a local path or s3://"):
        _root("file:///x", role="SRC")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidArgument, match=r"SRC .*empty holds no topics"):
        _migrate(_root(tmp_path / "empty", role="SRC"), _root(tmp_path / "dst"))
    with pytest.raises(InvalidArgument, match=r"DST s3://ledgers/x is an S3 root: give --config a broker.conf "
                                              r"that sets s3Region"):
        _root(f"s3://{BUCKET}/x")


# -- the command ---------------------------------------------------------------------------------


def _doc_example(source: Path, target: Path) -> list[str]:
    """docs/cli.md's example between two local roots (``migrate-root SRC DST``), its paths ``source`` and
    ``target``."""
    markdown = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    block = code_block_after(markdown, "## Moving a ledger root")
    [line] = [line for line in block if line.startswith("compactord migrate-root /")]
    words = command_words(line)[2:]
    assert len(words) == 2, line
    return [str(source), str(target)]


def _command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "compactord", "migrate-root", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def held_dst(tmp_path: Path) -> Iterator[Path]:
    with LedgerStore(tmp_path / "held"):
        yield tmp_path / "held"


def test_the_command_prints_a_line_per_topic_and_exits_2_on_what_it_refuses(
        source: Path, tmp_path: Path, held_dst: Path) -> None:
    done = _command(*_doc_example(source, tmp_path / "dst"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("audit: ledger 1, 1 part, ") and lines[2].startswith("orders: ledger 2, 2 parts, ")
    assert lines[1] == "gone: skipped: its deletion is pending on SRC"
    assert lines[3].startswith("total: 2 of 3 topics copied, 3 parts, ")
    assert _entries(LedgerStore(tmp_path / "dst"), "orders") == _entries(LedgerStore(source), "orders")
    rerun = _command(str(source), str(tmp_path / "dst"))
    assert rerun.returncode == 0 and rerun.stdout.splitlines()[-1].startswith("total: 0 of 3 topics copied, 0 parts")

    for args, problem in [((str(source), str(source)), "are the same root"),
                          ((str(source), str(held_dst)), f"ledger root {held_dst} is locked by another compactord"),
                          ((str(tmp_path / "nothing"), str(tmp_path / "d2")), "does not exist"),
                          ((str(source), f"s3://{BUCKET}/p"), "is an S3 root: give --config")]:
        refused = _command(*args)
        assert refused.returncode == 2, refused.stderr
        assert len(refused.stderr.splitlines()) == 1 and problem in refused.stderr

    [part] = [f["name"] for f in LedgerStore(source).load_manifest("audit", 1).files]
    path = source / "audit" / "ledger-1" / part
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the disk under SRC rotted
    path.write_bytes(bytes(data))
    failed = _command(str(source), str(tmp_path / "d3"))
    assert failed.returncode == 1 and len(failed.stderr.splitlines()) == 1
    assert f"part {part} on SRC" in failed.stderr and "its manifest records" in failed.stderr
    assert not (tmp_path / "d3" / "audit" / CURRENT).exists()
