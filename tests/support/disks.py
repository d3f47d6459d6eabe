"""Small file systems a test mounts for itself: a tmpfs that fills up, or one mounted read-only.

Mounting needs root (or CAP_SYS_ADMIN); where the test cannot mount, it is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["tmpfs"]


@contextlib.contextmanager
def tmpfs(mount_point: Path, size: str, *, read_only: bool = False) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (``mount -o size=``) at ``mount_point`` (created), unmount it after."""
    mount_point.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
                                 capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"this test needs a small tmpfs, and mount could not run: {exc}")
    if mounted.returncode != 0:
        pytest.skip(f"this test needs a small tmpfs, and mounting one is not permitted here "
                    f"(mount -t tmpfs as uid {os.getuid()}: {mounted.stderr.strip()})")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=60, check=False)
