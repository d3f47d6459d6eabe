"""What the store's recovery of a topic (after ``open()``, before the topic's first use) finds after a crash:
deletions it completes, ledgers that lost their ``CURRENT`` (quarantined, never wiped), and a first run's
leftovers (cleaned)."""

from __future__ import annotations

import contextlib
import logging
import subprocess
from pathlib import Path

import pytest

from compactord.errors import LedgerRootUnwritable
from compactord.ledger.store import DELETING, LedgerStore
from tests.support.disks import tmpfs
from tests.unit.ledger.test_store import make_ledger, rows, spark_write

# -- durable deletion --------------------------------------------------------------------------


def test_a_deletion_interrupted_before_anything_was_removed_completes_at_open(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with LedgerStore(root) as s:
        s.switch("t", make_ledger(s, "t"))
        (s.topic_dir("t") / "policies.json").write_text('{"strategy": null}')
        s.switch("other", make_ledger(s, "other"))
        s.mark_deleting("t")
        assert s.deletion_pending("t") and not s.deletion_pending("other")
        # the process dies here: nothing of the topic was removed yet
    with LedgerStore(root) as s:
        assert not s.topic_dir("t").exists()
        assert s.topics() == ["other"] and s.verify("other", s.current_ledger_id("other") or 0)


def test_a_deletion_interrupted_half_way_completes_at_open(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with LedgerStore(root) as s:
        ledger_id = make_ledger(s, "t")
        s.switch("t", ledger_id)
        s.mark_deleting("t")
        (s.topic_dir("t") / "CURRENT").unlink()  # as if the crash came after the pointer went
    with LedgerStore(root) as s:
        assert not s.topic_dir("t").exists()
        assert s.quarantined() == []  # a deletion, not a lost pointer


def test_the_mark_goes_last_and_a_withdrawn_mark_deletes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with LedgerStore(root) as s:
        s.switch("t", make_ledger(s, "t"))
        s.mark_deleting("t")
        assert (s.topic_dir("t") / DELETING).is_file()
        s.unmark_deleting("t")
        assert not s.deletion_pending("t")
    with LedgerStore(root) as s:
        assert s.current_ledger_id("t") is not None
        s.mark_deleting("t")
        s.delete_topic("t")
        assert not s.topic_dir("t").exists() and s.topics() == []


def test_marking_a_topic_without_a_folder_creates_it(tmp_path: Path) -> None:
    # A task may be about to write the topic's first ledger: the mark must be there to catch it.
    root = tmp_path / "root"
    with LedgerStore(root) as s:
        s.mark_deleting("fresh")
        assert s.deletion_pending("fresh")
        s.allocate_ledger("fresh")
    with LedgerStore(root) as s:
        assert not s.deletion_pending("fresh")  # its recovery, before any use of it, completed the deletion
        assert s.topics() == []


# -- quarantine --------------------------------------------------------------------------------


def test_finalized_ledgers_without_current_are_quarantined_not_wiped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "root"
    with LedgerStore(root) as s:
        first, second = make_ledger(s, "t"), make_ledger(s, "t")
        s.switch("t", second)
        (s.topic_dir("t") / "policies.json").write_text("{}")
        (s.topic_dir("t") / "CURRENT").unlink()  # the pointer is lost
    with caplog.at_level(logging.WARNING, logger="compactord.ledger.store"), LedgerStore(root) as s:
        assert s.current_ledger_id("t") is None
        assert sorted(p.name for p in s.topic_dir("t").iterdir()) == ["policies.json"]  # policies stay
        [folder] = s.quarantined()
        assert folder.startswith("t/")
        kept = root / "@compactord" / "quarantine" / folder
        assert sorted(p.name for p in kept.iterdir()) == [f"ledger-{first}", f"ledger-{second}"]
        assert (kept / f"ledger-{second}" / "manifest.json").is_file()
    assert "quarantine" in caplog.text and "no CURRENT" in caplog.text
    with LedgerStore(root) as s:  # a second start leaves the quarantine alone
        assert s.quarantined() == [folder]


def test_an_unfinished_first_run_is_cleaned_as_before(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with LedgerStore(root) as s:
        spark_write(s.allocate_ledger("t")[1], rows(0, range(5)))  # written, never finalized
    with LedgerStore(root) as s:
        assert list(s.topic_dir("t").iterdir()) == [] and s.topics() == [] and s.quarantined() == []


def test_remove_orphans_never_removes_a_finalized_ledger_without_current(tmp_path: Path) -> None:
    with LedgerStore(tmp_path / "root") as s:
        ledger_id = make_ledger(s, "t")
        assert s.remove_orphans("t") == []
        assert s.ledger_path("t", ledger_id).is_dir()


# -- a root that cannot be written ---------------------------------------------------------------


def test_a_read_only_root_refuses_to_open(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    with tmpfs(disk, "1m"):
        LedgerStore(disk / "root").open().close()  # made while writable
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True, capture_output=True, timeout=30)
        with pytest.raises(LedgerRootUnwritable, match="compactedLedgerRoot must be a writable") as caught:
            LedgerStore(disk / "root").open()
        assert caught.value.status == 503 and isinstance(caught.value, OSError)
        with pytest.raises(LedgerRootUnwritable, match="cannot be created"):
            LedgerStore(disk / "other-root").open()


def test_a_full_root_refuses_to_open(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    with tmpfs(disk, "256k"):
        LedgerStore(disk / "root").open().close()
        with contextlib.suppress(OSError), open(disk / "filler", "wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 4096)
        with pytest.raises(LedgerRootUnwritable, match="No space left on device"):
            LedgerStore(disk / "root").open()
        (disk / "filler").unlink()
        store = LedgerStore(disk / "root").open()  # the disk has room again
        assert store.is_open and not list((store.root / "@compactord").glob("write-probe*"))
        store.close()


def test_a_full_disk_does_not_stop_a_deletion(tmp_path: Path) -> None:
    # deleting is what frees a full disk: without room for the mark, it goes on without one
    disk = tmp_path / "disk"
    with tmpfs(disk, "256k"), LedgerStore(disk / "root") as s:
        s.switch("t", make_ledger(s, "t"))
        with contextlib.suppress(OSError), open(disk / "filler", "wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 4096)
        assert s.mark_deleting("t") is False
        s.delete_topic("t")
        assert s.topics() == [] and not s.topic_dir("t").exists()
