"""A listing's broker calls wait at most their deadline (``OneCallAtATime``): a call that hangs answers
``BrokerUnavailable`` by its deadline, holds the one thread the calls have until it ends, and its error or
answer reaches the caller when it comes in time."""

from __future__ import annotations

import threading

import pytest

from compactord.daemon.broker_watch import OneCallAtATime
from compactord.errors import BrokerUnavailable, TopicNotFound


def test_a_hung_call_is_refused_at_its_deadline_and_holds_the_only_thread_until_it_ends() -> None:
    calls = OneCallAtATime()
    release = threading.Event()
    started: list[str] = []

    def hung() -> str:
        started.append(threading.current_thread().name)
        release.wait(30)
        return "late"

    with pytest.raises(BrokerUnavailable, match="a list of its topics within 0.2s"):
        calls.call(hung, 0.2, "a list of its topics")
    # The next caller finds the thread taken: refused by its own deadline, its call never started.
    with pytest.raises(BrokerUnavailable):
        calls.call(lambda: started.append("second") or "x", 0.2, "topic t's offsets")
    assert started == ["broker-call"]
    release.set()
    # Once the hung call has ended, calls run again.
    assert calls.call(lambda: "now", 10, "a list of its topics") == "now"


def test_an_answer_or_an_error_in_time_reaches_the_caller() -> None:
    calls = OneCallAtATime()
    assert calls.call(lambda: ["a", "b"], 10, "a list of its topics") == ["a", "b"]

    def missing() -> None:
        raise TopicNotFound("t")

    with pytest.raises(TopicNotFound):
        calls.call(missing, 10, "topic t's offsets")
    assert calls.call(lambda: 1, 10, "again") == 1
