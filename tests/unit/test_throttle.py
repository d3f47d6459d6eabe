"""The read throttle's token bucket and its sizing (a unit without I/O: a fake clock)."""

from __future__ import annotations

import pytest

from compactord.engine.throttle import (
    MIN_FETCH_BYTES,
    ReadThrottle,
    fetch_bytes,
    per_task_rate,
    running_share,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_bucket_never_lets_more_than_its_rate_through() -> None:
    clock = FakeClock()
    bucket = ReadThrottle(1000, clock=clock, sleep=clock.sleep)
    for _ in range(50):
        bucket.consume(300)  # 15,000 bytes at 1,000 bytes/s: at least 15 s
    assert clock.now == pytest.approx(15.0, abs=0.01)
    clock.now += 100  # idle: the bucket refills only up to one second of its rate
    start = clock.now
    bucket.consume(3000)
    assert clock.now - start == pytest.approx(2.0, abs=0.01)


def test_a_check_between_slices_stops_a_wait() -> None:
    clock = FakeClock()
    calls = []

    def check() -> None:
        calls.append(clock.now)
        if len(calls) == 3:
            raise RuntimeError("cancelled")

    bucket = ReadThrottle(100, check, clock=clock, sleep=clock.sleep)
    with pytest.raises(RuntimeError, match="cancelled"):
        bucket.consume(10_000)  # a 100 s wait, cut in slices
    assert clock.now < 1.0


def test_the_budget_is_shared_by_the_tasks_that_read_at_once() -> None:
    assert per_task_rate(0, 8, 2) == 0
    assert per_task_rate(1000, 8, 2) == 500  # two cores: two tasks at once
    assert per_task_rate(1000, 1, 4) == 1000  # one range: one task
    assert fetch_bytes(0, 8 << 20) == 8 << 20
    assert fetch_bytes(10, 8 << 20) == MIN_FETCH_BYTES
    assert fetch_bytes(1 << 20, 8 << 20) == 1 << 20
    with pytest.raises(ValueError, match="positive"):
        ReadThrottle(0)


def test_the_share_of_ended_tasks_goes_to_those_still_reading() -> None:
    assert running_share(1000, 8, 2, ended=0) == 500
    assert running_share(1000, 8, 2, ended=6) == 500  # two left, two cores
    assert running_share(1000, 8, 2, ended=7) == 1000  # the last one reads at the whole budget
    assert running_share(1000, 4, 4, ended=1) == pytest.approx(1000 / 3)
    assert running_share(1000, 4, 4, ended=4) == 1000  # none left: never a division by zero
    assert running_share(0, 4, 4, ended=3) == 0


def test_a_new_rate_applies_from_now_on() -> None:
    clock = FakeClock()
    bucket = ReadThrottle(1000, clock=clock, sleep=clock.sleep)
    bucket.consume(2000)
    assert clock.now == pytest.approx(2.0, abs=0.01)
    bucket.set_rate(4000)
    bucket.consume(8000)  # 2 s at the new rate
    assert clock.now == pytest.approx(4.0, abs=0.01)
    assert bucket.capacity == 4000
    with pytest.raises(ValueError, match="positive"):
        bucket.set_rate(0)
