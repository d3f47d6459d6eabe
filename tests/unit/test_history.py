"""The run history store (``compactord.daemon.history``) on a real folder: records made from real task
objects, appended durably, paged newest first, bounded by count and age, and tolerant of a torn line."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from compactord.daemon.history import RunHistory, RunRecord, UnrecordedRuns
from compactord.errors import InvalidArgument, InvalidTopicName, ObjectConflict, StorageUnavailable
from compactord.ledger import layout
from compactord.storage import LocalStore
from compactord.task import CompactionTaskCtx, Reason, TaskState
from tests.support.timeouts import STOP_TIMEOUT_S
from tests.support.waiting import wait_for

S = TaskState


class Clock:
    def __init__(self) -> None:
        self.now = time.time()  # the records carry the real end times of their tasks

    def __call__(self) -> float:
        return self.now


def ended(topic: str = "orders", final: TaskState = S.SUCCEED, **stats: int) -> RunRecord:
    """A record of a real task that went through the states to ``final``."""
    ctx = CompactionTaskCtx(topic)
    ctx.set_reason(Reason("backlog_records", "backlog 10 records > threshold 5"), caller=None)
    ctx.transition(S.CREATING_RAW_READER)
    ctx.previous_ledger_id = 3
    captured: list[RunRecord] = []
    ctx.add_end_recorder(lambda t, new: captured.append(RunRecord.of_task(t, new)))
    if final is S.SUCCEED:
        ctx.transition(S.RUNNING)
        for name, value in stats.items():
            setattr(ctx.stats, name, value)
        ctx.transition(S.ENDING_WITH_SWITCH_LEDGER)
        ctx.ledger_id = 4
        ctx.transition(S.SUCCEED)
    elif final is S.FAILED:
        ctx.progress.records_read = 7
        ctx.fail(RuntimeError("the broker went away"))
    else:
        ctx.cancel("cancelled by request")
    [record] = captured
    return record


@pytest.fixture
def clock() -> Clock:
    return Clock()


def history(tmp_path: Path, clock: Clock, max_runs: int = 1000, max_age_days: float = 30) -> RunHistory:
    return RunHistory(LocalStore(tmp_path), max_runs, max_age_days, clock=clock)


def test_a_record_holds_what_the_task_did(tmp_path: Path, clock: Clock) -> None:
    done = ended(records_read=12, records_kept=3, markers=1, removed=8, bytes_read=120, bytes_written=900,
                 spilled_bytes=4096)
    assert (done.state, done.reason, done.reason_detail) == ("Succeed", "backlog_records",
                                                             "backlog 10 records > threshold 5")
    assert (done.records_read, done.records_written, done.removed, done.bytes_read, done.bytes_written) == \
        (12, 4, 8, 120, 900)
    assert (done.ledger_before, done.ledger_after, done.error) == (3, 4, None)
    assert done.spilled_bytes == 4096  # the windows its reading tasks wrote to local disk
    # A record written before runs had spilled bytes reads back with none.
    old = {k: v for k, v in done.to_json().items() if k != "spilled_bytes"}
    assert RunRecord.from_json(old).spilled_bytes == 0
    assert done.started_at is not None and done.finished_at >= done.started_at
    failed = ended(final=S.FAILED)
    assert (failed.state, failed.error, failed.records_read, failed.records_written) == \
        ("Failed", "the broker went away", 7, 0)
    assert failed.ledger_after == 3  # nothing replaced the ledger it started from
    cancelled = ended(final=S.CANCELLED)
    assert (cancelled.state, cancelled.error_type) == ("Cancelled", "compaction_cancelled")


def test_appended_runs_are_read_back_newest_first_after_a_new_start(tmp_path: Path, clock: Clock) -> None:
    store = history(tmp_path, clock)
    first = store.append(ended())
    second = store.append(ended(final=S.FAILED))
    assert (first.seq, second.seq) == (1, 2)
    again = history(tmp_path, clock)  # what a restarted daemon reads
    assert [r.task_id for r in again.runs("orders")] == [second.task_id, first.task_id]
    assert again.last("orders") == second
    assert again.append(ended()).seq == 3  # numbering goes on
    assert again.runs("other") == [] and again.last("other") is None
    assert store.key("orders") == "@compactord/history/orders/compacted.jsonl"


def test_pages_go_from_newest_to_oldest(tmp_path: Path, clock: Clock) -> None:
    store = history(tmp_path, clock)
    ids = [store.append(ended()).task_id for _ in range(5)]
    seen, cursor, pages = [], None, 0
    while True:
        page = store.page("orders", 2, cursor)
        seen += [r.task_id for r in page.runs]
        pages += 1
        if page.next is None:
            break
        cursor = page.next
    assert seen == list(reversed(ids)) and pages == 3
    assert store.page("orders", 5).next is None  # exactly one full page: no next
    for bad in ("abc", "-1", "1.5", "9" * 40):
        with pytest.raises(InvalidArgument, match="cursor"):
            store.page("orders", 2, bad)
    for bad_limit in (0, 1001):
        with pytest.raises(InvalidArgument, match="limit"):
            store.page("orders", bad_limit)
    with pytest.raises(InvalidTopicName):
        store.page("../escape", 1)


def test_the_history_keeps_at_most_max_runs(tmp_path: Path, clock: Clock) -> None:
    store = history(tmp_path, clock, max_runs=10)
    ids = [store.append(ended()).task_id for _ in range(25)]
    assert [r.task_id for r in store.runs("orders")] == list(reversed(ids[-10:]))
    lines = (tmp_path / store.key("orders")).read_bytes().splitlines()
    assert len(lines) <= 10 + 1  # rewritten once past a tenth over the bound
    assert [r.seq for r in history(tmp_path, clock, max_runs=10).runs("orders")] == list(range(25, 15, -1))


def test_runs_older_than_max_age_are_dropped(tmp_path: Path, clock: Clock) -> None:
    store = history(tmp_path, clock, max_age_days=1)
    old = ended()
    store.append(RunRecord(**{**old.to_json(), "finished_at": clock.now - 2 * 86400}))
    recent = store.append(ended())
    assert [r.task_id for r in store.runs("orders")] == [recent.task_id]  # the old one is not answered
    # and the append dropped it from what is stored: the file was compacted without it
    stored = (tmp_path / store.key("orders")).read_bytes() + b"".join(
        p.read_bytes() for p in (tmp_path / "@compactord" / "history" / "orders").iterdir())
    assert old.task_id not in stored.decode() and recent.task_id in stored.decode()
    assert store.last("orders") == recent
    clock.now += 2 * 86400  # the recent one expires too
    assert store.last("orders") is None and store.runs("orders") == []


def test_a_torn_last_line_of_an_older_versions_file_is_skipped(tmp_path: Path, clock: Clock) -> None:
    kept = ended()
    path = tmp_path / "@compactord" / "history" / "orders" / "compacted.jsonl"
    path.parent.mkdir(parents=True)
    # An older version appended lines; a crash half-way through the second append tore it.
    path.write_bytes(json.dumps({**kept.to_json(), "seq": 1}).encode() + b"\n"
                     + json.dumps(ended().to_json()).encode()[:40])
    restarted = history(tmp_path, clock)
    assert [r.task_id for r in restarted.runs("orders")] == [kept.task_id]
    after = restarted.append(ended())
    assert [r.task_id for r in restarted.runs("orders")] == [after.task_id, kept.task_id]
    assert after.seq == 2


def test_each_run_is_an_object_until_the_runs_are_compacted_into_the_file(tmp_path: Path, clock: Clock) -> None:
    store = history(tmp_path, clock)
    first = store.append(ended())
    # Recorded as an object of its own, whole: what a crash right after the task's end leaves is read back.
    assert sorted(os.listdir(tmp_path / "@compactord" / "history" / "orders")) == ["000000000001.json"]
    assert [r.task_id for r in history(tmp_path, clock).runs("orders")] == [first.task_id]
    ids = [first.task_id] + [store.append(ended()).task_id for _ in range(40)]
    runs = tmp_path / "@compactord" / "history" / "orders"
    pending = sorted(set(os.listdir(runs)) - {"compacted.jsonl"})
    in_file = (tmp_path / store.key("orders")).read_bytes().splitlines()
    assert len(in_file) == 32 and len(pending) == 9  # compacted once 32 waited
    assert [r.task_id for r in history(tmp_path, clock).runs("orders")] == list(reversed(ids))


def test_a_crash_between_writing_the_file_and_deleting_the_run_objects_counts_each_run_once(
        tmp_path: Path, clock: Clock) -> None:
    store = history(tmp_path, clock)
    ids = [store.append(ended()).task_id for _ in range(3)]
    runs = tmp_path / "@compactord" / "history" / "orders"
    # The file is written with the three runs; the crash comes before their objects are deleted.
    (tmp_path / store.key("orders")).write_bytes(b"".join(p.read_bytes() for p in sorted(runs.iterdir())))
    restarted = history(tmp_path, clock)
    assert [r.task_id for r in restarted.runs("orders")] == list(reversed(ids))
    assert restarted.append(ended()).seq == 4


def test_delete_removes_the_topic_s_history_only(tmp_path: Path, clock: Clock) -> None:
    store = history(tmp_path, clock)
    store.append(ended("orders"))
    store.append(ended("prices"))
    store.delete("orders")
    store.delete("never-had-one")
    assert not (tmp_path / store.key("orders")).exists() and store.runs("orders") == []
    assert len(store.runs("prices")) == 1
    assert store.append(ended("orders")).seq == 1  # a new topic of the same name starts afresh
    assert sorted(os.listdir(tmp_path / "@compactord" / "history")) == ["orders", "prices"]


def test_runs_that_ended_while_the_store_was_down_are_recorded_oldest_first_and_bounded(
        tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    runs_of = history(tmp_path, clock)
    waiting = UnrecordedRuns(limit=3)
    runs = [ended(final=S.FAILED) for _ in range(4)]
    for run in runs:
        waiting.add(run)
    assert len(waiting) == 3  # the oldest went, named in the log
    assert f"run {runs[0].task_id} is not recorded in the run history: more than 3 runs" in caplog.text

    down = StorageUnavailable("local root: writing: the disk is gone")
    appended: list[RunRecord] = []

    def fails_at_the_second(run: RunRecord) -> None:
        if appended:
            raise down
        runs_of.append(run)
        appended.append(run)

    with pytest.raises(StorageUnavailable):
        waiting.record(fails_at_the_second)
    assert len(waiting) == 2  # the one recorded is let go of; the rest wait
    waiting.record(runs_of.append)
    assert len(waiting) == 0
    assert [r.task_id for r in runs_of.page("orders", limit=10).runs] == [r.task_id for r in reversed(runs[1:])]

    # A daemon that stops while the store is still down names the runs it could not record.
    waiting.add(runs[0])
    waiting.give_up("the store does not answer")
    assert len(waiting) == 0
    assert f"lacks 1 runs that ended while the store was down (orders/{runs[0].task_id}): the store" in caplog.text


def test_a_topic_whose_history_objects_are_unusable_fails_alone_and_never_as_the_store(
        tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    store = history(tmp_path, clock, max_runs=2)  # compacted once the objects hold 4 runs
    folder = tmp_path / "@compactord" / "history"
    # a folder where the compacted file goes: every run is still recorded, once, as an object of its own
    (folder / "coll" / "compacted.jsonl").mkdir(parents=True)
    ids = [store.append(ended("coll")).task_id for _ in range(6)]
    assert [r.task_id for r in history(tmp_path, clock, max_runs=1000).runs("coll")] == list(reversed(ids))
    assert "run history" in caplog.text and "not compacted" in caplog.text
    # a folder where the next run's object goes: that topic's error, not StorageUnavailable
    (folder / "coll" / "000000000007.json").mkdir()
    with pytest.raises(ObjectConflict):
        store.append(ended("coll"))
    # and among runs waiting for the store, it is let go of (logged); the other topic's runs are recorded
    waiting = UnrecordedRuns()
    waiting.add(ended("coll"))
    waiting.add(ended("prices"))
    waiting.record(store.append)
    assert len(waiting) == 0 and len(store.runs("prices")) == 1
    assert "topic coll: run" in caplog.text and "not recorded in the run history" in caplog.text


class HeldStore(LocalStore):
    """A real folder whose writes of one topic's history wait until the test lets them go (a slow disk there)."""

    def __init__(self, root: Path, held: str) -> None:
        super().__init__(root)
        self.prefix = layout.history_prefix(held)
        self.writing = threading.Event()
        self.go = threading.Event()

    def put_if_absent(self, key: str, data: bytes) -> str:
        if key.startswith(self.prefix):
            self.writing.set()
            self.go.wait()  # the test sets it, also when it fails
        return super().put_if_absent(key, data)


def test_a_topic_s_run_is_recorded_while_another_topic_s_record_is_being_written(
        tmp_path: Path, clock: Clock) -> None:
    objects = HeldStore(tmp_path, "orders")
    runs_of = RunHistory(objects, 1000, 30, clock=clock)
    held = threading.Thread(target=runs_of.append, args=(ended("orders"),), daemon=True)
    held.start()
    try:
        assert objects.writing.wait(STOP_TIMEOUT_S), "the orders run's record was not written"
        other = threading.Thread(target=runs_of.append, args=(ended("prices"),), daemon=True)
        other.start()
        wait_for(lambda: not other.is_alive(), STOP_TIMEOUT_S, "the prices run recorded while the orders write is held")
        assert [r.topic for r in runs_of.runs("prices")] == ["prices"]
        assert held.is_alive()  # the orders write still waits
    finally:
        objects.go.set()
        held.join(STOP_TIMEOUT_S)
    assert [r.seq for r in runs_of.runs("orders")] == [1]


def test_two_writers_of_one_topic_s_history_never_overwrite_a_run_and_each_run_names_its_member(
        tmp_path: Path, clock: Clock) -> None:
    # Two cluster members on one root: the topic's previous owner records a late run while its new owner,
    # which read the history before, records its own; neither run is lost, each has a number of its own.
    store = LocalStore(tmp_path)
    old = RunHistory(store, 1000, 30, clock=clock, member="http://a:8642")
    new = RunHistory(store, 1000, 30, clock=clock, member="http://b:8642")
    first = old.append(ended())  # the old owner knows of its run 1
    mine = new.append(ended())  # the new owner reads the history: its run is 2
    late = old.append(ended())  # the old owner's late run finds 2 taken, reads again: 3
    assert (first.seq, mine.seq, late.seq) == (1, 2, 3)
    runs = RunHistory(store, 1000, 30, clock=clock).runs("orders")  # newest first
    assert [(r.seq, r.member) for r in runs] == [(3, "http://a:8642"), (2, "http://b:8642"), (1, "http://a:8642")]
    # A single daemon's runs name no member.
    assert RunHistory(store, 1000, 30, clock=clock).append(ended()).member is None
