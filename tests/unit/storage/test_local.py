"""What only the local backend does: the roots ``open_store`` takes, its own files kept out of listings, and
the file system's errors mapped to the store's."""

from __future__ import annotations

from pathlib import Path

import pytest

from compactord.errors import ConfigError, InsufficientDiskSpace, InvalidArgument, StorageUnavailable
from compactord.storage import LocalStore, open_store
from tests.support.disks import tmpfs


def test_a_plain_path_is_a_local_root(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "root"))
    assert isinstance(store, LocalStore) and store.root == (tmp_path / "root").resolve()
    assert store.describe() == f"local root {(tmp_path / 'root').resolve()}"


@pytest.mark.parametrize("root", ["s3a://bucket/x", "file:///tmp/x", "hdfs://nn/x"])
def test_other_schemes_are_refused_naming_what_is_allowed(root: str) -> None:
    with pytest.raises(ConfigError, match=r"compactedLedgerRoot.*not supported.*plain path") as caught:
        open_store(root)
    assert caught.value.key == "compactedLedgerRoot"


def test_a_local_store_has_no_request_budget_to_cut(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    assert store.within(1.0) is store
    with pytest.raises(ValueError, match="seconds must be positive, got: 0"):
        store.within(0)


def test_the_stores_own_files_are_never_listed(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put_if_absent("t/CURRENT", b"x")  # takes the lock: its file exists from now on
    (tmp_path / "t" / ".~CURRENT.1-2-3.tmp").write_bytes(b"a put a crash interrupted")
    assert [i.key for i in store.list()] == ["t/CURRENT"]
    assert store.children() == ["t/"] and store.children("t/") == ["CURRENT"]
    with pytest.raises(InvalidArgument, match="own"):
        store.put("t/.~mine", b"x")


def test_a_read_only_root_is_unavailable(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "1m", read_only=True) as root:
        store = LocalStore(root)
        with pytest.raises(StorageUnavailable, match=r"local root .*writing 'k': Read-only file system"):
            store.put("k", b"x")


def test_a_full_disk_is_insufficient_space(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "64k") as root:
        store = LocalStore(root)
        with pytest.raises(InsufficientDiskSpace, match="no space left"):
            store.put("big", b"x" * 200_000)
        assert store.list() == []  # the temporary file went with the failure


def test_recover_removes_what_interrupted_writes_left(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("t/CURRENT", b"x")
    (tmp_path / "t" / ".~CURRENT.1-2-3.tmp").write_bytes(b"a put a crash interrupted")
    (tmp_path / "t" / "ledger-2").mkdir()  # a ledger a crash left before its first file
    store.put("u/ledger-1/part", b"p")
    store.delete("u/ledger-1/part")
    store.recover()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".~")) == ["t"]
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["CURRENT"]
