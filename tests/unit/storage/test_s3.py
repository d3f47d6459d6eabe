"""What only the S3 backend does, on the session's SeaweedFS: the start's checks (a missing bucket, wrong
credentials, an unreachable endpoint, a store that ignores conditional writes), the budgets of reads and writes
through a fault-injecting proxy (503 SlowDown, 500, a reset mid-upload, a hung endpoint), multipart uploads,
the observer, and no secret in what the store says."""

from __future__ import annotations

import os
import socket
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from compactord.errors import LedgerRootUnwritable, ObjectNotFound, PreconditionFailed, StorageUnavailable
from compactord.storage.s3 import S3Store
from tests.support.fault_proxy import FaultProxy
from tests.support.s3_server import SECRET_KEY, S3Server

MIB = 1024 * 1024


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(int(s3_server.endpoint.rsplit(":", 1)[1])) as p:
        yield p


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once it is closed


# -- the start's checks --------------------------------------------------------------------------------


def test_a_good_store_passes_the_check_and_leaves_nothing(s3_server: S3Server) -> None:
    store = s3_server.store()
    store.check()
    assert store.list() == [] and store.children() == []


def test_a_missing_bucket_is_refused(s3_server: S3Server) -> None:
    with pytest.raises(LedgerRootUnwritable) as caught:
        s3_server.store(bucket="no-such-bucket").check()
    message = str(caught.value)
    assert message.startswith("compactedLedgerRoot=s3://no-such-bucket/")
    assert f"the bucket does not exist at {s3_server.endpoint}" in message and "\n" not in message


def test_wrong_credentials_are_refused_without_the_secret(s3_server: S3Server) -> None:
    wrong = s3_server.options(secret_access_key="not-the-secret-key")
    with pytest.raises(LedgerRootUnwritable, match=r"compactedLedgerRoot=s3://ledgers/.*access denied.*wrong "
                                                   r"credentials") as caught:
        s3_server.store(options=wrong).check()
    assert "not-the-secret-key" not in str(caught.value) and "not-the-secret-key" not in repr(caught.value)
    unknown = s3_server.options(access_key_id="AKIDUNKNOWN")
    with pytest.raises(LedgerRootUnwritable, match="access denied"):
        s3_server.store(options=unknown).check()


def test_an_unreachable_endpoint_is_refused(s3_server: S3Server) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(LedgerRootUnwritable, match=rf"compactedLedgerRoot=.*{endpoint} cannot be reached"):
        s3_server.store(endpoint=endpoint).check()


def test_a_store_that_ignores_conditional_writes_is_refused(s3_server: S3Server, proxy: FaultProxy) -> None:
    store = s3_server.store(endpoint=proxy.endpoint)
    store.check()  # relayed faithfully, the server's conditions hold
    proxy.ignore_conditions = True
    with pytest.raises(LedgerRootUnwritable, match=rf"the store at {proxy.endpoint} ignores conditional writes"):
        store.check()


# -- budgets through the fault proxy ----------------------------------------------------------------


def test_a_read_retries_once(s3_server: S3Server, proxy: FaultProxy) -> None:
    store = s3_server.store(endpoint=proxy.endpoint)
    store.put("k", b"value")
    proxy.fail(1, 503)
    assert store.get("k") == b"value"
    proxy.fail(2, 500)
    with pytest.raises(StorageUnavailable, match=r"reading 'k' failed after 2 attempts \(InternalError"):
        store.get("k")
    assert store.get("k") == b"value"


def test_a_read_of_a_hung_endpoint_gives_up_within_its_budget(s3_server: S3Server, proxy: FaultProxy) -> None:
    calls: list[tuple[str, float]] = []
    store = s3_server.store(endpoint=proxy.endpoint, observer=lambda op, s: calls.append((op, s)))
    store.put("k", b"value")
    proxy.hang()
    try:
        with pytest.raises(StorageUnavailable, match="reading 'k' failed after 2 attempts"):
            store.get("k")
    finally:
        proxy.heal()
    assert [op for op, _ in calls if op == "get"] == ["get", "get"]  # two attempts, each timed out
    config = store._io.reader.meta.config  # each attempt's waits are cut from the budget: two fit in it
    assert 2 * (config.connect_timeout + config.read_timeout) < store._io.read_budget
    assert store.get("k") == b"value"


def test_a_write_succeeds_after_a_few_throttles(s3_server: S3Server, proxy: FaultProxy) -> None:
    calls: list[str] = []
    store = s3_server.store(endpoint=proxy.endpoint, observer=lambda op, s: calls.append(op))
    proxy.fail(3, 503)
    version = store.put_if_absent("t/CURRENT", b'{"ledger": 1}')
    assert calls == ["put_if_absent"] * 4
    assert store.head("t/CURRENT").version == version  # type: ignore[union-attr]


def test_a_write_gives_up_once_its_budget_is_spent(s3_server: S3Server, proxy: FaultProxy) -> None:
    calls: list[str] = []
    store = s3_server.store(endpoint=proxy.endpoint, write_budget=1.0, observer=lambda op, s: calls.append(op))
    proxy.fail(1000, 503)
    with pytest.raises(StorageUnavailable, match=r"writing 'k' failed after \d+ attempts \(SlowDown") as caught:
        store.put("k", b"x")
    assert caught.value.code == "storage_unavailable" and caught.value.status == 503
    assert 2 < len(calls) < 1000  # retried with backoff, then stopped by the budget, not by the faults
    proxy.heal()
    assert store.head("k") is None


def test_a_hung_write_through_within_gives_up_within_that_budget(s3_server: S3Server, proxy: FaultProxy) -> None:
    calls: list[str] = []
    store = s3_server.store(endpoint=proxy.endpoint, observer=lambda op, s: calls.append(op))  # writes: 60 s
    version = store.put("k", b"old")
    hurried = store.within(1.0)
    assert (hurried.read_budget, hurried.write_budget) == (1.0, 1.0) and hurried.describe() == store.describe()
    proxy.hang()
    try:
        with pytest.raises(StorageUnavailable, match="writing 'k' failed"):
            hurried.put_if_match("k", b"new", version)
    finally:
        proxy.heal()
    assert "put_if_match" in calls  # the store's observer hears the hurried store's requests
    config = hurried._io.writer.meta.config  # an attempt's waits are cut from that budget
    assert config.connect_timeout + config.read_timeout < 2 * hurried.write_budget
    assert (store.read_budget, store.write_budget) == (2.0, 60.0)  # the store itself keeps its own
    assert store.get("k") == b"old"


def test_a_conditional_write_whose_answer_was_lost_is_still_a_win(s3_server: S3Server, proxy: FaultProxy) -> None:
    store = s3_server.store(endpoint=proxy.endpoint)
    base = store.put("t/CURRENT", b"a")
    proxy.lose_answers(1)  # the server writes; the retry then finds the ETag changed (412), by its own write
    version = store.put_if_match("t/CURRENT", b"b", base)
    assert store.head("t/CURRENT").version == version and store.get("t/CURRENT") == b"b"  # type: ignore[union-attr]
    proxy.lose_answers(1)
    with pytest.raises(PreconditionFailed):  # another writer's bytes are no win
        store.put_if_match("t/CURRENT", b"c", base)
    assert store.get("t/CURRENT") == b"b"


def test_a_reset_mid_upload_is_retried(s3_server: S3Server, proxy: FaultProxy, tmp_path: Path) -> None:
    store = s3_server.store(endpoint=proxy.endpoint, part_size=5 * MIB)
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(11 * MIB))  # three parts
    proxy.reset_uploads(2)
    store.put_file("t/ledger-1/part-0.parquet", source)
    # read back straight from the server: the upload is what is checked, not the proxy's speed under load
    direct = s3_server.store(store.prefix)
    assert direct.get("t/ledger-1/part-0.parquet") == source.read_bytes()


def test_a_failed_multipart_upload_is_aborted(s3_server: S3Server, proxy: FaultProxy, tmp_path: Path) -> None:
    store = s3_server.store(endpoint=proxy.endpoint, part_size=5 * MIB, write_budget=1.0)
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(6 * MIB))
    proxy.reset_uploads(1000)
    with pytest.raises(StorageUnavailable, match="uploading 't/big' failed"):
        store.put_file("t/big", source)
    proxy.heal()
    uploads = store._io.reader.list_multipart_uploads(Bucket=store.bucket, Prefix=store.prefix + "/")
    assert uploads.get("Uploads", []) == [] and store.head("t/big") is None


def test_recover_aborts_unfinished_uploads(s3_server: S3Server) -> None:
    store = s3_server.store()
    store._io.writer.create_multipart_upload(Bucket=store.bucket, Key=f"{store.prefix}/t/ledger-3/part-0")
    store.recover()
    uploads = store._io.reader.list_multipart_uploads(Bucket=store.bucket, Prefix=store.prefix + "/")
    assert uploads.get("Uploads", []) == []


# -- large objects, listings, the observer -----------------------------------------------------------


def test_a_large_file_goes_up_in_parts_and_reads_back_by_ranges(s3_server: S3Server, tmp_path: Path) -> None:
    import pyarrow as pa

    calls: Counter[str] = Counter()
    store = s3_server.store(part_size=5 * MIB, observer=lambda op, s: calls.update([op]))
    table = pa.table({"partition": list(range(300_000)), "v": [os.urandom(24).hex() for _ in range(300_000)]})
    local = tmp_path / "part.parquet"
    pq.write_table(table, local, row_group_size=50_000, compression="none")
    assert local.stat().st_size > 10 * MIB
    store.put_file("t/ledger-1/part-0.parquet", local)
    assert calls["put_file"] == 2 + -(-local.stat().st_size // (5 * MIB))  # create, the parts, complete
    with store.open_input("t/ledger-1/part-0.parquet") as f:
        pf = pq.ParquetFile(f)
        assert pf.read_row_group(3).column("partition").to_pylist() == list(range(150_000, 200_000))
    assert calls["get"] < 10  # the footer and one row group, not the file


def test_listings_page_past_a_thousand(s3_server: S3Server) -> None:
    calls: Counter[str] = Counter()
    store = s3_server.store(observer=lambda op, s: calls.update([op]))
    keys = [f"t/ledger-1/part-{i:05d}" for i in range(1100)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: store.put(k, b"x"), keys))
    calls.clear()
    assert [info.key for info in store.list("t/")] == keys
    assert calls["list"] == 2
    store.delete_prefix("t/")
    assert calls["delete"] == 2  # batches of 1000 (the keys, then the rest with the folder markers)
    assert store.list() == [] and store.children() == []


def test_the_daemons_metrics_count_the_stores_requests(s3_server: S3Server) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from compactord.daemon.metrics import Metrics

    metrics = Metrics()
    store = s3_server.store(observer=metrics.storage_request)
    store.put("k", b"x")
    store.get("k")
    store.get("k", 0, 1)
    samples = {(s.name, s.labels.get("op"), s.labels.get("le")): s.value
               for family in text_string_to_metric_families(metrics.render().decode()) for s in family.samples}
    assert samples[("compactord_storage_requests_total", "put", None)] == 1
    assert samples[("compactord_storage_requests_total", "get", None)] == 2
    assert samples[("compactord_storage_request_seconds_count", "get", None)] == 2
    assert samples[("compactord_storage_request_seconds_bucket", "get", "+Inf")] == 2


def test_a_missing_object_through_open_input(s3_server: S3Server) -> None:
    with pytest.raises(ObjectNotFound, match=r"s3://ledgers/.* has no object 'absent'"):
        s3_server.store().open_input("absent")


def test_no_secret_in_what_the_store_says(s3_server: S3Server) -> None:
    store = s3_server.store()
    assert SECRET_KEY not in repr(store) and SECRET_KEY not in repr(store.options)
    assert SECRET_KEY not in store.describe()


def test_budgets_and_part_size_are_checked(s3_server: S3Server) -> None:
    with pytest.raises(ValueError, match="budgets must be positive"):
        s3_server.store(read_budget=0)
    with pytest.raises(ValueError, match="part_size must be at least"):
        s3_server.store(part_size=1024)


def test_a_store_built_by_hand_names_its_endpoint(s3_server: S3Server) -> None:
    store = S3Store("ledgers", "x/y/", s3_server.options())
    assert store.describe() == "s3://ledgers/x/y"
    assert repr(store) == f"S3Store('s3://ledgers/x/y', endpoint='{s3_server.endpoint}')"
