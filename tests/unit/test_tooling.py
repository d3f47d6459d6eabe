"""The linter and the type checker pass, with the settings in ``pyproject.toml``: ruff over the package, the tests
and the benchmarks, mypy over the package. Run here, the README's test command is CI's only command and covers
them; a finding fails with the tool's own output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_tool(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """The tool installed beside this Python (the ``test`` extra pins it), run from the repository's root,
    where it finds its settings and mypy its cache (``.mypy_cache``)."""
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_ruff_finds_nothing() -> None:
    done = run_tool("ruff", "check", "--no-cache", "compactord", "tests", "bench", timeout=120)
    if done.returncode != 0:
        pytest.fail(f"ruff check (exit {done.returncode}):\n{done.stdout}{done.stderr}", pytrace=False)


def test_mypy_finds_nothing() -> None:
    # A cold run takes about a minute on 2 busy cores; with the cache a few seconds.
    done = run_tool("mypy", timeout=600)
    if done.returncode != 0:
        pytest.fail(f"mypy (exit {done.returncode}):\n{done.stdout}{done.stderr}", pytrace=False)
