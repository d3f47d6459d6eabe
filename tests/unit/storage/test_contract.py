"""The contract every backend of ``compactord.storage`` passes, run against each of them (the ``store``
fixture's params: a local root, and a prefix of the session's S3 server), races of conditional writes
included. A backend is added by adding its param."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compactord.errors import InvalidArgument, ObjectNotFound, PreconditionFailed
from compactord.storage import LocalStore, ObjectStore, open_described

RACERS = 8


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "local":
        yield LocalStore(tmp_path / "root")
    elif request.param == "s3":  # a fresh prefix of the session's SeaweedFS
        yield request.getfixturevalue("s3_server").store()
    else:  # pragma: no cover - a new backend needs its fixture here
        raise AssertionError(f"no fixture for backend {request.param}")


def race(n: int, attempt: Callable[[int], str]) -> tuple[list[str], list[PreconditionFailed]]:
    """Run ``attempt(i)`` on ``n`` threads released at once; the versions of the winners and the losers' errors."""
    barrier = threading.Barrier(n)

    def one(i: int) -> str | PreconditionFailed:
        barrier.wait()
        try:
            return attempt(i)
        except PreconditionFailed as exc:
            return exc

    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(one, range(n)))
    return [r for r in results if isinstance(r, str)], [r for r in results if isinstance(r, PreconditionFailed)]


# -- reading and writing ---------------------------------------------------------------------------------


def test_put_then_get_head_and_list(store: ObjectStore) -> None:
    version = store.put("t/ledger-1/manifest.json", b'{"a": 1}')
    assert store.get("t/ledger-1/manifest.json") == b'{"a": 1}'
    info = store.head("t/ledger-1/manifest.json")
    assert info is not None and (info.key, info.size, info.version) == ("t/ledger-1/manifest.json", 8, version)
    assert info.modified > 0
    assert store.list("t/") == [info]


def test_every_write_of_other_bytes_makes_a_new_version(store: ObjectStore) -> None:
    versions = [store.put("k", f"bytes {i}".encode()) for i in range(5)]
    assert len(set(versions)) == 5
    assert store.head("k").version == versions[-1]  # type: ignore[union-attr]


def test_a_rewrite_of_the_same_bytes(store: ObjectStore) -> None:
    """A local root's version changes at every write; S3's is the ETag, which names the bytes, so a rewrite of
    the same bytes keeps it. Either way a compare-and-swap from the version read holds."""
    versions = [store.put("k", b"same bytes") for _ in range(3)]
    assert len(set(versions)) == (3 if isinstance(store, LocalStore) else 1)
    assert store.put_if_match("k", b"other bytes", versions[-1]) not in versions


def test_ranged_get(store: ObjectStore) -> None:
    store.put("r", bytes(range(100)))
    assert store.get("r", 10, 20) == bytes(range(10, 20))
    assert store.get("r", 95) == bytes(range(95, 100))
    assert store.get("r", 90, 1000) == bytes(range(90, 100))
    assert store.get("r", 100) == b""
    with pytest.raises(InvalidArgument):
        store.get("r", 20, 10)
    with pytest.raises(InvalidArgument):
        store.get("r", -1)


def test_a_missing_object(store: ObjectStore) -> None:
    assert store.head("nothing/here") is None
    with pytest.raises(ObjectNotFound) as caught:
        store.get("nothing/here")
    assert caught.value.key == "nothing/here"
    with pytest.raises(ObjectNotFound):
        store.open_input("nothing/here")
    store.delete("nothing/here")  # no error
    assert store.list("nothing/") == []


def test_a_prefix_is_not_an_object(store: ObjectStore) -> None:
    store.put("a/b/c", b"x")
    assert store.head("a/b") is None
    with pytest.raises(ObjectNotFound):
        store.get("a/b")
    store.delete("a/b")
    assert store.get("a/b/c") == b"x"


def test_list_by_prefix_is_sorted_and_exact(store: ObjectStore) -> None:
    for key in ["t1/ledger-2/p", "t1/ledger-10/p", "t1/CURRENT", "t10/CURRENT", "@compactord/epoch"]:
        store.put(key, b"x")
    assert [i.key for i in store.list("t1/")] == ["t1/CURRENT", "t1/ledger-10/p", "t1/ledger-2/p"]
    assert [i.key for i in store.list("t1")] == ["t1/CURRENT", "t1/ledger-10/p", "t1/ledger-2/p", "t10/CURRENT"]
    assert [i.key for i in store.list("t1/ledger-1")] == ["t1/ledger-10/p"]
    assert len(store.list()) == 5
    assert store.children() == ["@compactord/", "t1/", "t10/"]
    assert store.children("t1/") == ["CURRENT", "ledger-10/", "ledger-2/"]
    assert store.children("none/") == []


def test_deleted_objects_leave_no_prefix_behind(store: ObjectStore) -> None:
    store.put("t/ledger-1/a", b"1")
    store.put("t/ledger-1/b", b"2")
    store.put("t/CURRENT", b"3")
    store.delete_many(["t/ledger-1/a", "t/ledger-1/b", "t/ledger-1/absent"])
    assert store.children("t/") == ["CURRENT"]
    store.put("t/ledger-1/c", b"4")
    assert store.delete_prefix("t/") == ["t/CURRENT", "t/ledger-1/c"]
    assert store.children() == []
    with pytest.raises(InvalidArgument):
        store.delete_prefix("t")


def test_put_file_and_random_access_for_parquet(store: ObjectStore, tmp_path: Path) -> None:
    local = tmp_path / "part.parquet"
    table = pa.table({"partition": list(range(1000)), "v": [str(i) for i in range(1000)]})
    pq.write_table(table, local, row_group_size=100)
    version = store.put_file("t/ledger-1/part-0.parquet", local)
    assert store.head("t/ledger-1/part-0.parquet").version == version  # type: ignore[union-attr]
    with store.open_input("t/ledger-1/part-0.parquet") as f:
        pf = pq.ParquetFile(f)
        assert pf.metadata.num_row_groups == 10
        assert pf.read_row_group(7).column("partition").to_pylist() == list(range(700, 800))
    assert store.get("t/ledger-1/part-0.parquet") == local.read_bytes()
    with pytest.raises(FileNotFoundError):
        store.put_file("t/x", tmp_path / "absent")


def test_copy(store: ObjectStore) -> None:
    store.put("t/ledger-1/part", b"rows")
    version = store.copy("t/ledger-1/part", "@compactord/quarantine/t-1/ledger-1/part")
    store.delete("t/ledger-1/part")
    assert store.get("@compactord/quarantine/t-1/ledger-1/part") == b"rows"
    assert store.head("@compactord/quarantine/t-1/ledger-1/part").version == version  # type: ignore[union-attr]
    with pytest.raises(ObjectNotFound):
        store.copy("t/ledger-1/part", "elsewhere")


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/../b", "./a", "a/", "a/.", "a\\b"])
def test_bad_keys_are_refused(store: ObjectStore, key: str) -> None:
    with pytest.raises(InvalidArgument, match="key"):
        store.put(key, b"x")
    with pytest.raises(InvalidArgument, match="key"):
        store.head(key)


# -- conditional writes ----------------------------------------------------------------------------------


def test_put_if_absent_creates_once(store: ObjectStore) -> None:
    version = store.put_if_absent("t/LAST_ID", b"1")
    with pytest.raises(PreconditionFailed) as caught:
        store.put_if_absent("t/LAST_ID", b"2")
    assert caught.value.key == "t/LAST_ID" and caught.value.current == version
    assert store.get("t/LAST_ID") == b"1"


def test_put_if_match_needs_the_current_version(store: ObjectStore) -> None:
    first = store.put("t/CURRENT", b"a")
    second = store.put_if_match("t/CURRENT", b"b", first)
    assert second != first and store.get("t/CURRENT") == b"b"
    with pytest.raises(PreconditionFailed) as caught:
        store.put_if_match("t/CURRENT", b"c", first)
    assert caught.value.current == second
    assert store.get("t/CURRENT") == b"b"
    with pytest.raises(PreconditionFailed):
        store.put_if_match("t/absent", b"c", first)
    assert store.head("t/absent") is None


def test_a_deleted_object_matches_no_version(store: ObjectStore) -> None:
    version = store.put("k", b"a")
    store.delete("k")
    with pytest.raises(PreconditionFailed):
        store.put_if_match("k", b"b", version)
    assert store.head("k") is None


def test_racing_put_if_match_on_one_version_has_one_winner(store: ObjectStore, request: pytest.FixtureRequest) -> None:
    if request.node.callspec.params.get("store") == "s3":
        # The test server does not hold If-Match under races: on SeaweedFS 4.48 (`weed mini`), racing plain
        # boto3 put_object(IfMatch=...) calls on one ETag, without retries and without S3Store, had two winners
        # in 69 of 160 rounds of 2 racers and 17 of 160 rounds of 8 (If-None-Match: one winner in 160 of 160).
        # S3 itself promises one winner (a concurrent conditional write answers 412 or 409). Through S3Store
        # the winners were single attempts too (no retry read back as a win). Kept, not strict: it passes on a
        # store that holds the promise, and it shows the day the test server does.
        request.applymarker(pytest.mark.xfail(reason="SeaweedFS 4.48 lets two racing If-Match writes win",
                                              strict=False))
    base = store.put("t/CURRENT", b"base")
    for _ in range(5):  # a race is a matter of chance: run it a few times
        won, lost = race(RACERS, lambda i, base=base: store.put_if_match("t/CURRENT", f"writer {i}".encode(), base))
        assert len(won) == 1 and len(lost) == RACERS - 1
        assert store.head("t/CURRENT").version == won[0]  # type: ignore[union-attr]
        assert all(exc.current == won[0] for exc in lost)  # each loser saw the winner's write, not the base
        base = won[0]


def test_racing_put_if_absent_has_one_winner(store: ObjectStore) -> None:
    for n in range(5):
        won, lost = race(RACERS, lambda i, n=n: store.put_if_absent(f"t/ledger-{n}/claim", f"writer {i}".encode()))
        assert len(won) == 1 and len(lost) == RACERS - 1
        assert store.head(f"t/ledger-{n}/claim").version == won[0]  # type: ignore[union-attr]


def test_a_compare_and_swap_counter_loses_no_increment(store: ObjectStore) -> None:
    store.put_if_absent("counter", b"0")
    rounds = 20

    def bump(_: int) -> str:
        for _ in range(rounds):
            while True:
                info = store.head("counter")
                assert info is not None
                value = int(store.get("counter"))
                try:
                    store.put_if_match("counter", str(value + 1).encode(), info.version)
                    break
                except PreconditionFailed:
                    continue
        return "done"

    done, _ = race(4, bump)
    assert len(done) == 4
    assert int(store.get("counter")) == 4 * rounds


# -- what a backend declares -----------------------------------------------------------------------------------


def test_a_local_root_declares_its_folder_and_free_space_an_object_store_neither(store: ObjectStore) -> None:
    local = isinstance(store, LocalStore)
    assert store.local_root == (store.root if local else None)
    assert store.local_path("t/ledger-1/x") == (store.root / "t/ledger-1/x" if local else None)
    free = store.free_bytes()
    assert (free > 0) if local else free is None  # type: ignore[operator]
    store.check()  # the session's server enforces conditional writes; a local root has nothing to check


def test_a_folder_is_made_where_folders_exist(store: ObjectStore) -> None:
    store.make_folder("t/")
    if isinstance(store, LocalStore):
        assert (store.root / "t").is_dir()
    assert store.list() == []  # a folder is no object


def test_a_scratch_file_put_becomes_the_object_and_nothing_else_is_listed(store: ObjectStore) -> None:
    scratch = store.scratch_file("t/ledger-1/part-1.parquet")
    try:
        scratch.write_bytes(b"parquet bytes")
        version = store.put_file("t/ledger-1/part-1.parquet", scratch)
    finally:
        scratch.unlink(missing_ok=True)
    assert store.get("t/ledger-1/part-1.parquet") == b"parquet bytes"
    assert [(i.key, i.version) for i in store.list()] == [("t/ledger-1/part-1.parquet", version)]
    if isinstance(store, LocalStore):
        assert not scratch.exists() and sorted(p.name for p in scratch.parent.iterdir()) == ["part-1.parquet"]


def test_a_store_opened_from_its_descriptor_reads_the_same_objects(store: ObjectStore) -> None:
    store.put("t/CURRENT", b"pointer")
    descriptor = store.descriptor()
    assert "secret_access_key" not in json.dumps(descriptor) and "access_key_id" not in json.dumps(descriptor)
    again = open_described(json.loads(json.dumps(descriptor)), store.credentials())
    assert again.describe() == store.describe() and again.get("t/CURRENT") == b"pointer"
