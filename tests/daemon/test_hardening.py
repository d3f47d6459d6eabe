"""Issue 10, points 0 to 2, against the real daemon: one rule for refusing to start, no code loaded
over HTTP, and an API that is not open by accident.

A refused start is ``python -m compactord run --config FILE`` in a subprocess (no broker is asked: the
daemon refuses before it connects); the HTTP tests share daemons started once for the module.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import write_conf

EXIT_CONFIG = 2
EXIT_IOERR = 74
REFUSE_TIMEOUT_S = 120.0


def refused_start(tmp_path: Path, **conf: object) -> tuple[int, list[str]]:
    """Run the daemon with ``conf`` (broker.conf keys) and expect it to refuse: its exit status and the
    lines it wrote on stderr."""
    values: dict[str, object] = {"kafkaBootstrapServers": "127.0.0.1:9", "httpPort": 0,
                                 "compactedLedgerRoot": tmp_path / "ledgers", "sparkMaster": "local[1]"}
    values.update(conf)
    config = write_conf(tmp_path / "refused.conf", values)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTORD_")}
    result = subprocess.run([sys.executable, "-m", "compactord", "run", "--config", str(config)],
                            capture_output=True, text=True, timeout=REFUSE_TIMEOUT_S, check=False,
                            env=environment, stdin=subprocess.DEVNULL, cwd=tmp_path)
    return result.returncode, result.stderr.splitlines()


def assert_refused(result: tuple[int, list[str]], status: int, *words: str) -> str:
    code, lines = result
    assert code == status and len(lines) == 1, (code, lines)
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


# -- 0. one rule for refusing to start ------------------------------------------------------------


def test_a_bad_value_in_the_file_exits_2_with_one_line_naming_key_value_and_allowed(tmp_path: Path) -> None:
    assert_refused(refused_start(tmp_path, httpPort="eighty"), EXIT_CONFIG,
                   "httpPort", "eighty", "whole number")


def test_a_bad_plugin_found_while_the_daemon_is_built_exits_2_with_one_line(tmp_path: Path) -> None:
    assert_refused(refused_start(tmp_path, compactionServiceFactoryClassName="no_such_module_x:Factory"),
                   EXIT_CONFIG, "compactionServiceFactoryClassName", "no_such_module_x:Factory", "cannot be imported")


def test_a_ledger_root_that_cannot_be_written_exits_74_with_one_line(tmp_path: Path) -> None:
    locked = tmp_path / "read-only"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("this user (root?) may write a 0555 folder: the root cannot be made unwritable here")
        line = assert_refused(refused_start(tmp_path, compactedLedgerRoot=locked / "ledgers"), EXIT_IOERR,
                              str(locked / "ledgers"))
        assert "compactedLedgerRoot" in line
    finally:
        locked.chmod(0o755)


def test_a_ledger_root_under_a_file_exits_74(tmp_path: Path) -> None:
    # What a root user meets too (a 0555 folder stops only others): the path cannot be a folder.
    (tmp_path / "not-a-folder").write_text("")
    assert_refused(refused_start(tmp_path, compactedLedgerRoot=tmp_path / "not-a-folder" / "ledgers"),
                   EXIT_IOERR, "not-a-folder", "compactedLedgerRoot")
