"""The footer cache: a ledger on an S3 root is read with one ranged GET per row group and no HEAD or LIST once
its footers are cached; the cache's bound in bytes, its LRU order, and its metric."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families

from compactord.daemon.metrics import Metrics
from compactord.errors import InvalidArgument, ObjectNotFound
from compactord.ledger import LedgerStore, footer_cache
from compactord.ledger.footer_cache import DEFAULT_MAX_BYTES, FooterCache, load_footer
from compactord.model import RECORD_SCHEMA, Entry, LedgerManifest, StrategySettings
from compactord.storage import LocalStore, ObjectStore
from tests.unit.ledger.test_reader import row

TOPIC = "orders"
# Partition 0: offsets 0..1199, partition 1: 0..599 with each 9th a marker; 2 files of 100-row groups.
ROWS = [row(0, o) for o in range(1200)] + [row(1, o, marker=o % 9 == 4) for o in range(600)]


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    """Each test starts from an empty shared cache of the default size, and leaves it so."""
    footer_cache.SHARED.resize(DEFAULT_MAX_BYTES)
    footer_cache.SHARED.clear()
    yield
    footer_cache.SHARED.resize(DEFAULT_MAX_BYTES)
    footer_cache.SHARED.clear()


def write_ledger(objects: ObjectStore) -> tuple[LedgerStore, int]:
    """A sealed ledger of ``ROWS`` in two part files, written through ``objects`` and verified."""
    store = LedgerStore(objects.describe(), objects)
    ledger_id, _ = store.allocate_ledger(TOPIC)
    half = len(ROWS) // 2
    for i, chunk in enumerate((ROWS[:half], ROWS[half:])):
        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pylist(chunk, schema=RECORD_SCHEMA), sink, row_group_size=100)
        objects.put(f"{TOPIC}/ledger-{ledger_id}/part-{i:05d}.parquet", sink.getvalue().to_pybytes())
    manifest = LedgerManifest(ledger_id, TOPIC, horizon={}, strategy=StrategySettings(), files=[])
    store.finalize_ledger(TOPIC, ledger_id, manifest)
    store.verify(TOPIC, ledger_id)
    return store, ledger_id


def expected(partition: int) -> list[Entry]:
    return [Entry.from_row(r) for r in ROWS if r["partition"] == partition and not r["marker"]]


def test_on_s3_a_page_is_at_most_two_gets_and_last_one_once_the_footers_are_cached(s3_server) -> None:
    requests: collections.Counter[str] = collections.Counter()
    objects = s3_server.store(observer=lambda op, seconds: requests.update([op]))
    store, ledger_id = write_ledger(objects)
    manifest = store.load_manifest(TOPIC, ledger_id)
    store.open_reader(TOPIC, ledger_id, manifest)  # fills the cache: the footers of both files

    requests.clear()
    reader = store.open_reader(TOPIC, ledger_id, manifest)
    assert requests == {}, f"a ledger opened again read its footers: {dict(requests)}"

    # A page inside one row group, one across two row groups, one across the two files.
    for partition, start, n in ((0, 310, 50), (0, 150, 100), (0, 880, 60)):
        requests.clear()
        page = reader.read_slice(partition, start, n).entries
        assert page == [e for e in expected(partition) if e.offset >= start][:n]
        assert requests["get"] <= 2 and requests["head"] == 0 and requests["list"] == 0, dict(requests)
    for partition in (0, 1):
        requests.clear()
        assert reader.last(partition) == expected(partition)[-1]
        assert requests["get"] <= 1 and set(requests) <= {"get"}, dict(requests)


def test_a_ledger_opened_again_reads_its_footers_again_when_the_cache_is_off(s3_server) -> None:
    requests: collections.Counter[str] = collections.Counter()
    objects = s3_server.store(observer=lambda op, seconds: requests.update([op]))
    store, ledger_id = write_ledger(objects)
    manifest = store.load_manifest(TOPIC, ledger_id)
    footer_cache.SHARED.resize(0)
    store.open_reader(TOPIC, ledger_id, manifest)
    requests.clear()
    reader = store.open_reader(TOPIC, ledger_id, manifest)
    # One ranged GET of each file's end (the manifest gives the sizes: no HEAD); the reads are as correct.
    assert requests == {"get": 2}
    assert reader.read(1, 0, 1000) == expected(1)
    assert footer_cache.SHARED.stats().entries == 0


def test_a_local_root_reads_through_the_same_cache(tmp_path) -> None:
    store, ledger_id = write_ledger(LocalStore(tmp_path))
    manifest = store.load_manifest(TOPIC, ledger_id)
    start = footer_cache.SHARED.stats()  # the counts are the daemon's totals: compared by difference
    first = store.open_reader(TOPIC, ledger_id, manifest)
    before = footer_cache.SHARED.stats()
    assert (before.misses - start.misses, before.entries) == (2, 2)
    second = store.open_reader(TOPIC, ledger_id, manifest)
    assert footer_cache.SHARED.stats().hits == before.hits + 2
    assert list(second) == list(first) == expected(0) + expected(1)


def _footers(tmp_path: Any, n: int) -> tuple[LocalStore, list[str]]:
    objects = LocalStore(tmp_path)
    keys = []
    for i in range(n):
        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pylist(ROWS[:200], schema=RECORD_SCHEMA), sink, row_group_size=50)
        keys.append(f"f{i}.parquet")
        objects.put(keys[-1], sink.getvalue().to_pybytes())
    return objects, keys


def test_the_cache_keeps_the_most_recently_used_footers_within_its_bound(tmp_path) -> None:
    objects, keys = _footers(tmp_path, 4)
    weight = load_footer(objects, keys[0]).weight
    cache = FooterCache(weight * 2)  # room for two
    loads: list[str] = []

    def get(key: str) -> None:
        cache.get(key, lambda: loads.append(key) or load_footer(objects, key))

    get(keys[0])
    get(keys[1])
    get(keys[0])  # a hit: keys[0] is now the most recent
    get(keys[2])  # evicts keys[1], the least recently used
    get(keys[0])
    get(keys[1])
    assert loads == [keys[0], keys[1], keys[2], keys[1]]
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.entries) == (2, 4, 2)
    assert stats.bytes <= weight * 2 and stats.evictions == 2
    cache.resize(0)
    assert cache.stats().entries == 0 and cache.stats().bytes == 0


def test_a_row_group_read_through_its_footer_is_the_file_s_row_group(tmp_path) -> None:
    objects, keys = _footers(tmp_path, 1)
    footer = load_footer(objects, keys[0])
    whole = pq.read_table(objects.location(keys[0]))
    assert len(footer.spans) == 4
    for i in range(4):
        assert footer_cache.read_row_group(objects, keys[0], footer, i).equals(whole.slice(50 * i, 50))


@pytest.mark.parametrize("bad", [-1, 4 * 1024 ** 3 + 1, 1.5, True, "64"])
def test_a_bound_outside_zero_to_four_gib_is_refused(bad: Any) -> None:
    with pytest.raises(InvalidArgument, match=r"an integer of bytes in 0\.\.4294967296"):
        FooterCache(bad)


def test_the_cache_s_lookups_and_bytes_are_metrics(tmp_path) -> None:
    store, ledger_id = write_ledger(LocalStore(tmp_path))
    manifest = store.load_manifest(TOPIC, ledger_id)
    metrics = Metrics()

    def samples() -> dict[tuple[str, str | None], float]:
        return {(s.name, s.labels.get("result")): s.value
                for family in text_string_to_metric_families(metrics.render().decode()) for s in family.samples}

    before = samples()
    store.open_reader(TOPIC, ledger_id, manifest)
    store.open_reader(TOPIC, ledger_id, manifest)
    after = samples()
    for result in ("miss", "hit"):
        key = ("compactord_storage_metadata_cache_lookups_total", result)
        assert after[key] - before[key] == 2
    assert after[("compactord_storage_metadata_cache_bytes", None)] == footer_cache.SHARED.stats().bytes > 0


def test_a_footer_of_a_missing_object_is_object_not_found(tmp_path) -> None:
    objects = LocalStore(tmp_path)
    with pytest.raises(ObjectNotFound, match="does not exist") as raised:
        load_footer(objects, "orders/gone.parquet")  # no size given: the HEAD finds nothing
    assert raised.value.key == "orders/gone.parquet"
