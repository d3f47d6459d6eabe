"""``GET /v1/topics/{topic}/compaction/preview``: what the next compaction of a topic would do.

Sampled (the default): the factory's estimate (``interfaces.SampledPreviews``), on the request's thread, in
seconds.
Exact (``exact=True``): a preview task through the registry, so that it waits for a slot of
``compactionMaxConcurrentTasks``, is the topic's live task (``DELETE .../compaction`` cancels it) and
never runs beside a compaction of the same topic.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from compactord.errors import CompactionCancelled, CompactionFailed, InvalidArgument
from compactord.interfaces import SampledPreviews
from compactord.task import TaskState

if TYPE_CHECKING:
    from compactord.daemon.core import Daemon

__all__ = ["preview"]


def preview(daemon: Daemon, topic: str, *, exact: bool) -> dict[str, Any]:
    """The reply of the preview endpoint (``records_kept``, ``records_removed``, ``bytes_kept``,
    ``bytes_removed``, ``exact``, ``sample_records``, ``dirty_ratio``, ``estimated_seconds``).

    :raises CompactionAlreadyRunning: (exact) the topic has a live task.
    :raises CompactionCancelled: (exact) the preview task was cancelled.
    :raises TopicRecreated: (sampled) the topic's ledger is of an earlier incarnation of the topic.
    """
    daemon.topics.require_topic(topic)
    body = _exact(daemon, topic) if exact else _sampled(daemon, topic)
    read = body["records_kept"] + body["records_removed"]
    tail = body.pop("tail_records")
    body["dirty_ratio"] = round(tail / read, 6) if read else 0.0
    body["estimated_seconds"] = _estimate(daemon, topic, read)
    return {"topic": topic, **body}


def _exact(daemon: Daemon, topic: str) -> dict[str, Any]:
    ctx = daemon.registry.trigger(topic, kind="preview")
    state = ctx.result(daemon.settings.task_timeout_seconds + 60)
    if state is TaskState.CANCELLED:
        raise CompactionCancelled(f"the preview of topic {topic!r} (task {ctx.task_id}) was cancelled")
    if state is not TaskState.SUCCEED or ctx.preview is None:
        raise CompactionFailed(f"the preview of topic {topic!r} (task {ctx.task_id}) failed: {ctx.error}")
    found = ctx.preview
    return {"records_kept": found["records_kept"], "records_removed": found["records_removed"],
            "bytes_kept": found["bytes_kept"], "bytes_removed": found["bytes_removed"], "exact": True,
            "sample_records": None, "markers": found["markers"], "kept_digest": found["kept_digest"],
            "full_rebuild": found["full_rebuild"], "task_id": ctx.task_id, "tail_records": found["tail_records"]}


def _sampled(daemon: Daemon, topic: str) -> dict[str, Any]:
    factory = daemon.factory
    if not isinstance(factory, SampledPreviews):
        raise InvalidArgument("this compaction service factory cannot estimate a preview; ask for ?exact=true")
    # A ledger of an earlier incarnation of the topic is no base for an estimate (410 topic_recreated).
    found = factory.sampled_preview(topic, daemon.admin.offsets(topic),
                                    lambda manifest: daemon.identities.check(topic, manifest))
    return {**found, "exact": False}


def _estimate(daemon: Daemon, topic: str, records: int) -> float | None:
    """Seconds for ``records`` at the median throughput of the last successful runs (this topic's, else
    any topic's); None when no run has succeeded since the daemon started."""
    def rates(tasks: list[Any]) -> list[float]:
        return [t.stats.records_read / (t.finished_at - t.started_at) for t in tasks
                if t.kind == "compaction" and t.state is TaskState.SUCCEED and not t.stats.skipped
                and t.started_at and t.finished_at and t.finished_at > t.started_at and t.stats.records_read]

    found = rates(daemon.registry.history(topic))[-5:] or rates(daemon.registry.tasks())[-5:]
    if not found:
        return None
    return round(records / statistics.median(found), 1)
