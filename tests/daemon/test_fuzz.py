"""The OpenAPI schema fuzzed with schemathesis against running daemons, with auth on (the shared
daemon, its token sent) and off (a daemon without a token): no request gets a 5xx, the daemon stays up,
and nothing is created under the ledger root for a topic the broker does not have. The schema gives the
``{topic}`` parameter its real pattern, so that generated cases reach the handlers. Bounded (a few
examples per operation, a fixed seed) so that each run takes seconds.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess

from .conftest import SHARED_TOKEN

pytestmark = pytest.mark.slow

SEED = 20260226
EXAMPLES_PER_OPERATION = 5


def _topic_dirs(daemon: DaemonProcess) -> set[str]:
    return {p.name for p in daemon.root.iterdir() if not p.name.startswith("@")} if daemon.root.exists() else set()


@pytest.mark.parametrize("auth", ["token", "open"])
def test_openapi_fuzz_has_no_server_error(auth: str, shared_daemon: DaemonProcess, open_daemon: DaemonProcess,
                                          kafka: Any, tmp_path: Path) -> None:
    daemon = shared_daemon if auth == "token" else open_daemon
    before = _topic_dirs(daemon)
    with daemon.client(token=None) as c:
        schema = c.get("/openapi.json", headers={"Authorization": f"Bearer {SHARED_TOKEN}"}).json()
    topic_params = [p for ops in schema["paths"].values() for op in ops.values() for p in op.get("parameters", [])
                    if p.get("in") == "path" and p.get("name") == "topic"]
    assert topic_params and all(p["schema"]["pattern"] == r"^[a-zA-Z0-9._-]{1,249}$" for p in topic_params)

    headers = ["--header", f"Authorization: Bearer {SHARED_TOKEN}"] if auth == "token" else []
    st = Path(sys.executable).with_name("st")
    result = subprocess.run(
        [str(st), "run", f"{daemon.url}/openapi.json", *headers,
         "--checks", "not_a_server_error",
         "--phases", "examples,coverage,fuzzing",
         "--max-examples", str(EXAMPLES_PER_OPERATION),
         "--seed", str(SEED), "--workers", "1", "--request-timeout", "60",
         "--generation-database", "none", "--no-color"],
        check=False, cwd=tmp_path, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{output[-8000:]}\n{daemon.log_tail()}"
    generated = re.search(r"(\d+) generated", output)
    assert generated is not None, output[-4000:]
    assert 0 < int(generated.group(1)) <= 1000, output[-4000:]
    # still alive and ready, nothing written outside the ledger root, no folder for a topic that is nowhere
    with daemon.client(token=None) as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 200
    expected = ["broker.conf", "daemon.log", "ledgers"] + (["token"] if auth == "token" else [])
    assert sorted(p.name for p in daemon.root.parent.iterdir()) == sorted(expected)
    created = _topic_dirs(daemon) - before
    assert created <= set(kafka.admin.list_topics()), f"folders for topics the broker lacks: {created}"
