"""Read throttling (``compactionMaxReadBytesPerSecond``) through the real job on the real broker.

The assertion is a bound, not a timing race: the token buckets guarantee that the readers, together,
never read faster than the budget (plus one poll each), so the measured rate stays under twice the cap
on any machine, however loaded. The tight figure is ``bench/compaction.py --throttle``.
"""

from __future__ import annotations

import contextlib
import time

import pytest

from compactord.api.views import task_status
from compactord.engine.kafka_source import RATE_FILE
from tests.support.service import succeeded

CAP = 800_000  # bytes per second, for the whole compaction
VALUE = b"x" * 1000
# ~4 MB in 2 partitions of unequal sizes (3:1): >= 5 s at the cap; partition 1 ends first
RECORDS = [(f"k{i}", VALUE, int(i % 4 == 0)) for i in range(4000)]


@pytest.mark.slow
def test_a_throttled_compaction_reads_within_its_budget(kafka, make_factory):
    topic = kafka.topic(partitions=2)
    kafka.produce(topic, RECORDS)
    expected = sum(len(k) + len(v) for k, v, _ in RECORDS)
    factory = make_factory(compaction_max_read_bytes_per_second=CAP)
    ctx = factory.new_topic_compaction_service(topic).compact()
    read_done_at = None
    shares = set()  # what the driver gave each reading task, as the tasks ended
    while not ctx.done:  # the first moment the readers are seen to have read everything (or later)
        if read_done_at is None and ctx.progress.bytes_read >= expected:
            read_done_at = time.time()
        with contextlib.suppress(OSError, ValueError):
            shares.add(float((factory.store.progress_dir(ctx.task_id) / RATE_FILE).read_text()))
        time.sleep(0.1)
    succeeded(ctx)
    assert ctx.stats.bytes_read == expected
    started = ctx.progress.read_started_at
    assert started is not None
    rate = expected / ((read_done_at or ctx.finished_at) - started)
    assert rate <= 2 * CAP, f"read {expected} bytes at {rate:.0f} B/s, cap {CAP}"
    status = task_status(ctx)["read_throttle"]
    assert status["max_bytes_per_second"] == CAP
    assert status["reading_tasks"] == 2 and status["per_task_bytes_per_second"] == CAP // 2  # local[2]
    assert status["throttled_seconds"] > 0  # the buckets made the readers wait
    assert status["bytes_read"] == expected
    # The smaller partition ended first: the driver handed its share to the task still reading.
    assert shares == {float(CAP)}
    assert started < ctx.progress.read_ended_at <= ctx.finished_at
