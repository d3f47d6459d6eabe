"""The OpenAPI schema fuzzed with schemathesis against the shared running daemon: no request gets a
5xx. Bounded (a few examples per operation, a fixed seed) so that it takes seconds.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemon import DaemonProcess

from .conftest import SHARED_TOKEN

pytestmark = pytest.mark.slow

SEED = 20260226
EXAMPLES_PER_OPERATION = 5


def test_openapi_fuzz_has_no_server_error(shared_daemon: DaemonProcess, tmp_path: Path) -> None:
    st = Path(sys.executable).with_name("st")
    result = subprocess.run(
        [str(st), "run", f"{shared_daemon.url}/openapi.json",
         "--header", f"Authorization: Bearer {SHARED_TOKEN}",
         "--checks", "not_a_server_error",
         "--phases", "examples,coverage,fuzzing",
         "--max-examples", str(EXAMPLES_PER_OPERATION),
         "--seed", str(SEED), "--workers", "1", "--request-timeout", "60",
         "--generation-database", "none", "--no-color"],
        check=False, cwd=tmp_path, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{output[-8000:]}\n{shared_daemon.log_tail()}"
    generated = re.search(r"(\d+) generated", output)
    assert generated is not None, output[-4000:]
    assert 0 < int(generated.group(1)) <= 1000, output[-4000:]
    # still alive and ready, and nothing was written outside the ledger root
    with shared_daemon.client(token=None) as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 200
    assert sorted(p.name for p in shared_daemon.root.parent.iterdir()) == sorted(
        ["broker.conf", "daemon.log", "ledgers", "token"])
