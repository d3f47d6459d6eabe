"""Per-topic metric series go with their topic: every metric with a ``topic`` label is covered."""

from __future__ import annotations

from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from compactord.daemon.metrics import Metrics


def topics_in(metrics: Metrics) -> set[str]:
    text = metrics.render().decode()
    return {s.labels["topic"] for family in text_string_to_metric_families(text) for s in family.samples
            if "topic" in s.labels}


def test_forget_removes_every_series_of_the_topic() -> None:
    metrics = Metrics()
    per_topic = [m for m in vars(metrics).values()
                 if isinstance(m, MetricWrapperBase) and "topic" in m._labelnames]
    assert len(per_topic) >= 19  # every one, also those added later: found, not listed
    for topic in ("gone", "stays"):
        for metric in per_topic:
            values = {name: topic if name == "topic" else "succeeded" for name in metric._labelnames}
            child = metric.labels(**values)
            if hasattr(child, "observe"):
                child.observe(1)
            else:
                child.inc()
    assert topics_in(metrics) == {"gone", "stays"}
    metrics.forget("gone")
    assert topics_in(metrics) == {"stays"}
    metrics.forget("never-seen")  # nothing to remove is fine


def test_an_ended_task_counts_under_its_reason_and_sets_the_kept_ratio() -> None:
    from compactord.task import CompactionTaskCtx, Reason, TaskState

    metrics = Metrics()
    ctx = CompactionTaskCtx("orders")
    ctx.set_reason(Reason("max_lag", "oldest uncompacted record 700s old > threshold 600s"))
    for state in (TaskState.CREATING_RAW_READER, TaskState.RUNNING, TaskState.ENDING_WITH_SWITCH_LEDGER):
        ctx.transition(state)
    ctx.stats.records_read, ctx.stats.records_kept, ctx.stats.markers = 40, 9, 1
    ctx.stats.spilled_bytes = 8192
    ctx.stats.task_cpu_seconds, ctx.stats.task_wall_seconds = 1.5, 3.0
    ctx.transition(TaskState.SUCCEED)
    metrics.task_ended(ctx)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(metrics.render().decode()) for s in family.samples}
    assert samples[("compactord_tasks_total", (("reason", "max_lag"), ("result", "succeeded")))] == 1
    assert samples[("compactord_last_run_kept_ratio", (("topic", "orders"),))] == 0.25
    assert samples[("compactord_spilled_bytes_total", (("topic", "orders"),))] == 8192
    assert samples[("compactord_task_cpu_ratio", (("topic", "orders"),))] == 0.5


def test_past_the_bound_of_topics_no_series_per_topic_is_exported_and_the_totals_stay() -> None:
    from compactord.config import settings_from_properties

    bound = settings_from_properties({"metricsPerTopicMaxTopics": "2"}).metrics_per_topic_max_topics
    assert bound == 2 and settings_from_properties({}).metrics_per_topic_max_topics == 1000
    metrics = Metrics()
    metrics.backlog_records.labels("orders").set(5)
    metrics.uncleanable.set(1)
    metrics.per_topic_for(2, bound)
    assert topics_in(metrics) == {"orders"}
    metrics.per_topic_for(3, bound)
    assert topics_in(metrics) == set()
    metrics.backlog_records.labels("payments").set(7)  # made by the pass, kept nowhere
    metrics.compactions.labels("payments", "succeeded").inc()
    metrics.duration.labels("payments").observe(1.5)
    samples = {s.name: s.value for family in text_string_to_metric_families(metrics.render().decode())
               for s in family.samples if not s.labels}
    assert topics_in(metrics) == set() and samples["compactord_uncleanable_topics"] == 1
    assert samples["compactord_per_topic_series"] == 0
    metrics.per_topic_for(2, bound)
    metrics.backlog_records.labels("payments").set(7)
    assert topics_in(metrics) == {"payments"}


def test_series_per_topic_can_be_turned_off_whatever_the_count() -> None:
    metrics = Metrics()
    metrics.per_topic_for(1, 0)
    metrics.ledger_corrupt.labels("orders").set(1)
    assert topics_in(metrics) == set()
