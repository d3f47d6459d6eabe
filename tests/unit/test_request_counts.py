"""A run's requests to an S3 root, counted through the daemon's store observer: those made on the run's thread
within its scope, not those of other threads or after the run's counts are final."""

from __future__ import annotations

import threading

from compactord.daemon.metrics import Metrics
from compactord.task_report import RequestCounts, TaskStats, counting_requests


def test_a_run_counts_its_own_requests_by_operation(s3_server) -> None:
    store = s3_server.store(observer=Metrics().storage_request)
    counts = TaskStats().storage_requests
    store.put("before", b"x")  # outside any run: not counted
    with counting_requests(counts):
        store.put("a", b"1")
        store.put_if_absent("b", b"2")
        assert store.get("a") == b"1"
        store.list("")
        other = threading.Thread(target=store.head, args=("a",))  # another thread: not this run's
        other.start()
        other.join()
    store.get("a")  # after the scope: not counted
    assert counts.snapshot() == {"get": 1, "list": 1, "put": 1, "put_if_absent": 1}


def test_final_counts_no_longer_change() -> None:
    counts = RequestCounts()
    with counting_requests(counts):
        counts.add("get")
        assert counts.final() == {"get": 1}
        counts.add("put")  # e.g. the history record's own write, after the run's end
    assert counts.snapshot() == {"get": 1}
