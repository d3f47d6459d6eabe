"""Waiting for a condition: one poll loop for every tier, failing with what it waited for."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar

import pytest

__all__ = ["wait_for"]

T = TypeVar("T")


class HasLog(Protocol):
    def log_tail(self) -> str: ...


def wait_for(predicate: Callable[[], T], timeout: float, what: str, log: HasLog | None = None,
             interval: float = 0.1) -> T:
    """Poll ``predicate`` until it returns something truthy and return that; after ``timeout`` seconds
    fail the test naming ``what`` (and showing the end of ``log``, a daemon's, if given)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}" +
                        (f"\n{log.log_tail()}" if log is not None else ""))
        time.sleep(interval)
