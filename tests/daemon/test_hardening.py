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

from tests.daemon.conftest import Launcher, assert_error
from tests.support.daemon import DaemonProcess, write_conf
from tests.support.plugins import IMPORT_MARKS_ENV

EXIT_CONFIG = 2
EXIT_IOERR = 74
REFUSE_TIMEOUT_S = 120.0
ADMIN_TOKEN = "admin-t0ken"
LISTED = "tests.support.plugins.listed:ListedOrder"
UNLISTED = "tests.support.plugins.unlisted:UnlistedOrder"


@pytest.fixture(scope="module")
def marks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the plug-in modules of tests/support/plugins write a file when a daemon imports them."""
    return tmp_path_factory.mktemp("import-marks")


@pytest.fixture(scope="module")
def daemon(launch: Launcher, marks: Path) -> DaemonProcess:
    """On loopback, with an admin token and one strategy plug-in listed."""
    prepared = launch.prepare("hardening", token=ADMIN_TOKEN, compactionStrategyPlugins=LISTED)
    prepared.env[IMPORT_MARKS_ENV] = str(marks)
    return prepared.start().wait_ready()


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


def test_a_plugin_that_exits_on_import_refuses_the_start_with_2_not_its_own_code(tmp_path: Path) -> None:
    assert_refused(refused_start(tmp_path, compactionStrategyPlugins="tests.support.plugins.exits:X"),
                   EXIT_CONFIG, "compactionStrategyPlugins", "tests.support.plugins.exits:X", "SystemExit")


# -- 1. HTTP must not load code ---------------------------------------------------------------------


def test_a_listed_plugin_is_loaded_at_start_and_may_be_chosen(daemon: DaemonProcess, marks: Path) -> None:
    assert (marks / "tests.support.plugins.listed").read_text() == str(daemon.pid)  # loaded at start-up
    response = daemon.http.put("/v1/topics/hardening-listed/policies", json={"strategy": LISTED})
    assert response.status_code == 200, response.text
    assert response.json()["effective"]["strategy"] == LISTED
    assert daemon.http.delete("/v1/topics/hardening-listed/policies").status_code == 200


@pytest.mark.parametrize("strategy", [UNLISTED, "unittest.__main__:X", "compactord.__main__:main"])
def test_a_strategy_that_is_not_allowed_answers_422_imports_nothing_and_the_daemon_stays_up(
        daemon: DaemonProcess, marks: Path, strategy: str) -> None:
    body = assert_error(daemon.http.put("/v1/topics/hardening-unlisted/policies", json={"strategy": strategy}),
                        422, "invalid_argument")
    assert strategy in body["message"] and "publishing-order" in body["message"] and LISTED in body["message"]
    assert not (marks / "tests.support.plugins.unlisted").exists(), "the daemon imported a module a request named"
    assert daemon.process is not None and daemon.process.poll() is None, daemon.log_tail()
    assert daemon.http.get("/healthz").status_code == 200
    assert daemon.http.get("/v1/topics/hardening-unlisted/policies").json()["policies"]["strategy"] is None
