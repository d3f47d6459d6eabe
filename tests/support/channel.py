"""A run's channel on loopback, as a run opens it (``engine.channel.RunChannel``), for tests that drive
reading tasks themselves; the files a driver and its tasks must not exchange under a ledger root."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from compactord.engine.channel import DriverAddress, RunChannel

LOOPBACK = DriverAddress("127.0.0.1", "127.0.0.1")


@contextlib.contextmanager
def run_channel(client_secrets: Mapping[str, Any] | None = None,
                store_secrets: Mapping[str, Any] | None = None) -> Iterator[RunChannel]:
    """A registered run (its ``endpoint(LOOPBACK)`` is what a task's spec carries), closed at the end."""
    channel = RunChannel(client_secrets, store_secrets)
    channel.endpoint(LOOPBACK)
    try:
        yield channel
    finally:
        channel.close()


# What the driver and its tasks exchanged as files under the root before the channel: a run's folder of
# progress reports, and the cancel, rate and plan files in it.
_CONTROL_NAMES = {"CANCEL", "RATE", "PLAN"}


def control_files(root: Path) -> list[Path]:
    """The progress, cancel, rate and plan files (and their folders) under the ledger ``root``."""
    found = []
    for folder, dirs, files in os.walk(root):  # a folder removed meanwhile is skipped, not an error
        for name in dirs + files:
            path = Path(folder) / name
            in_progress = path.relative_to(root).parts[:2] == ("@compactord", "progress")
            if in_progress or name.split(".")[0] in _CONTROL_NAMES:
                found.append(path)
    return found


def control_keys(objects: Any) -> list[str]:
    """``control_files`` of a ledger root in an object store (``objects``: the root's ``ObjectStore``)."""
    return [info.key for info in objects.list() if info.key.startswith("@compactord/progress/")
            or info.key.rpartition("/")[2].split(".")[0] in _CONTROL_NAMES]
