"""The exact preview as a task on the real broker and Spark: it writes no ledger, switches nothing, and
is cancelled like a compaction."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from compactord.task import TaskState
from tests.support.probes import Hold
from tests.support.service import compact, succeeded, view


def test_a_preview_task_counts_without_writing_and_is_cancellable(kafka, make_factory):
    preview_counts_without_writing_and_is_cancellable(kafka, make_factory)


def preview_counts_without_writing_and_is_cancellable(kafka: Any, factory: Callable[..., Any]) -> None:
    """The exact preview of a topic compacted once, through ``factory`` (``make_factory``, or one on an S3 root):
    cancelled while it runs, it leaves nothing; run to its end, it counts what the next compaction keeps and
    writes nothing (every object of the topic at its version), switches nothing."""
    topic = kafka.topic()
    kafka.produce(topic, [(f"k{i % 5}", f"v{i}") for i in range(20)])
    base = factory()
    service = base.new_topic_compaction_service(topic)
    first = compact(service)

    def objects() -> list[tuple[str, str]]:  # every object of the topic, with its version
        return sorted((info.key, info.version) for info in base.store.objects.list(f"{topic}/"))

    before = (objects(), view(service))
    kafka.produce(topic, [(f"k{i % 8}", f"w{i}") for i in range(10)] + [("k0", None)])

    hold = Hold("running")
    held = factory(store=base.store, probe=hold).new_topic_compaction_service(topic)
    ctx = held.compact(kind="preview")
    assert hold.reached.wait(60), "the preview did not reach Running"
    ctx.cancel()
    assert ctx.state is TaskState.CANCELLED and ctx.worker_done.wait(60)
    assert ctx.preview is None

    done = succeeded(service.compact(kind="preview"))
    assert done.preview is not None and done.kind == "preview"
    assert done.preview["records_kept"] == 7  # k0..k7, k0 deleted
    assert done.preview["markers"] == 1  # k0's deletion, kept as a marker for its retention
    assert done.preview["records_removed"] == 5 + 11 - 7 - 1
    assert (objects(), view(service)) == before  # nothing written nor switched
    assert service.ledger_info().ledger_id == first.ledger_id
    compact(service)
    assert service.ledger_info().records_kept == done.preview["records_kept"]
