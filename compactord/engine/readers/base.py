"""The interface of a range reader backend (see ``readers/__init__.py``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

__all__ = ["Polled", "RangeReader"]


@dataclass(slots=True)
class Polled:
    """The data records of one poll, as columns in offset order (control records never appear).

    ``timestamps``: milliseconds (negative or None when the record has none); ``headers``: per record a
    sequence of (name, value) pairs, or None/empty when it has none.
    """

    offsets: list[int]
    timestamps: list[Any]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[Any]

    def __len__(self) -> int:
        return len(self.offsets)

    def below(self, end: int) -> Polled:
        """The records whose offset is below ``end`` (offsets grow: a prefix)."""
        n = bisect_left(self.offsets, end)
        if n == len(self.offsets):
            return self
        return Polled(self.offsets[:n], self.timestamps[:n], self.keys[:n], self.values[:n], self.headers[:n])


class RangeReader(ABC):
    """A consumer assigned to one partition, positioned at the range's start when it is made.

    Made by ``open_range_reader``: assigned without a group, read_committed, auto-commit off, no offset
    reset (a start the log no longer holds raises from ``poll``), CRCs checked.
    """

    _batch: int  # the records a poll returns at most (the backend sets it)

    @abstractmethod
    def poll(self, timeout_s: float, max_records: int | None = None) -> Polled | None:
        """The next records (at most the batch size and ``max_records``), or None when none came within
        ``timeout_s``. A poll returns before its timeout once it has ``max_records``.

        :raises RuntimeError: the broker refused the read (offset out of range, unknown partition, auth).
        """

    def _wanted(self, max_records: int | None) -> int:
        """The records one poll asks for: the batch size, or ``max_records`` when smaller (at least one)."""
        return self._batch if max_records is None else max(1, min(self._batch, max_records))

    @abstractmethod
    def position(self) -> int | None:
        """The offset the next poll reads from: past the last record *and* past transaction markers
        (they occupy offsets); None before the client knows it."""

    @abstractmethod
    def high_watermark(self) -> int | None:
        """The log end the broker reported in its last fetch answer (None before one)."""

    @abstractmethod
    def close(self) -> None:
        """Leave the broker (nothing is committed)."""
