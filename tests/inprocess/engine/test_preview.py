"""The exact preview as a task on the real broker and Spark: it writes no ledger, switches nothing, and
is cancelled like a compaction."""

from __future__ import annotations

from compactord.task import TaskState
from tests.support.probes import Hold
from tests.support.service import compact, ledger_dirs, succeeded, view


def test_a_preview_task_counts_without_writing_and_is_cancellable(kafka, make_factory):
    topic = kafka.topic()
    kafka.produce(topic, [(f"k{i % 5}", f"v{i}") for i in range(20)])
    base = make_factory()
    service = base.new_topic_compaction_service(topic)
    compact(service)
    before = (ledger_dirs(base.store.root, topic), view(service))
    kafka.produce(topic, [(f"k{i % 8}", f"w{i}") for i in range(10)] + [("k0", None)])

    hold = Hold("running")
    held = make_factory(store=base.store, probe=hold).new_topic_compaction_service(topic)
    ctx = held.compact(kind="preview")
    assert hold.reached.wait(60), "the preview did not reach Running"
    ctx.cancel()
    assert ctx.state is TaskState.CANCELLED and ctx.worker_done.wait(60)
    assert ctx.preview is None

    done = succeeded(service.compact(kind="preview"))
    assert done.preview is not None and done.kind == "preview"
    assert done.preview["records_kept"] == 7  # k0..k7, k0 deleted
    assert done.preview["records_removed"] == 5 + 11 - 7
    assert (ledger_dirs(base.store.root, topic), view(service)) == before  # nothing written nor switched
    assert service.ledger_info().ledger_id == int(before[0][-1].split("-")[-1])
    compact(service)
    assert service.ledger_info().records_kept == done.preview["records_kept"]
