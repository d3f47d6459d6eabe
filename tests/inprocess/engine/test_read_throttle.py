"""Read throttling (``compactionMaxReadBytesPerSecond``) through the real job on the real broker.

The assertion is a bound, not a timing race: the token buckets guarantee that the readers, together,
never read faster than the budget (plus one poll each), so the measured rate stays under twice the cap
on any machine, however loaded. The tight figure is ``bench/compaction.py --throttle``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compactord.api.views import task_status
from compactord.engine.channel import RunChannel
from tests.support.channel import control_files
from tests.support.service import succeeded

CAP = 800_000  # bytes per second, for the whole compaction
VALUE = b"x" * 1000
# ~4 MB in 2 partitions of unequal sizes (3:1): >= 5 s at the cap; partition 1 ends first
RECORDS = [(f"k{i}", VALUE, int(i % 4 == 0)) for i in range(4000)]


@pytest.mark.slow
def test_a_throttled_compaction_reads_within_its_budget(kafka, make_factory, monkeypatch):
    factory = make_factory(compaction_max_read_bytes_per_second=CAP)
    throttled_run(kafka, factory, monkeypatch, RECORDS, CAP, lambda: control_files(Path(factory.store.root)))


def throttled_run(kafka: Any, factory: Any, monkeypatch: pytest.MonkeyPatch, records: list[tuple[str, bytes, int]],
                  cap: int, controls: Callable[[], list[Any]]) -> None:
    """Compact ``records`` (2 partitions, partition 0 the larger) with ``factory``, whose read budget is ``cap``,
    and check the rate, the task's report and the driver's hand-over; ``controls``: the control files or
    objects under the root, of which the run must leave none at any moment."""
    topic = kafka.topic(partitions=2)
    kafka.produce(topic, records)
    expected = sum(len(k) + len(v) for k, v, _ in records)
    shares: list[float] = []  # what the driver gave each reading task, as the tasks ended
    set_rate = RunChannel.set_rate

    def recorded(channel: RunChannel, rate: float) -> None:
        shares.append(rate)
        set_rate(channel, rate)

    monkeypatch.setattr(RunChannel, "set_rate", recorded)
    ctx = factory.new_topic_compaction_service(topic).compact()
    read_done_at = None
    seen_files = []  # control files under the root while the run reads: none, the tasks use the channel
    while not ctx.done:  # the first moment the readers are seen to have read everything (or later)
        if read_done_at is None and ctx.progress.bytes_read >= expected:
            read_done_at = time.time()
        seen_files += controls()
        time.sleep(0.1)
    succeeded(ctx)
    assert ctx.stats.bytes_read == expected
    started = ctx.progress.read_started_at
    assert started is not None
    rate = expected / ((read_done_at or ctx.finished_at) - started)
    assert rate <= 2 * cap, f"read {expected} bytes at {rate:.0f} B/s, cap {cap}"
    status = task_status(ctx)["read_throttle"]
    assert status["max_bytes_per_second"] == cap
    assert status["reading_tasks"] == 2 and status["per_task_bytes_per_second"] == cap // 2  # local[2]
    assert status["throttled_seconds"] > 0  # the buckets made the readers wait
    assert status["bytes_read"] == expected
    # The smaller partition ended first: the driver handed its share to the task still reading.
    assert shares == [float(cap)]
    assert not seen_files
    assert started < ctx.progress.read_ended_at <= ctx.finished_at
