"""Spark's JVM survives the systemd unit's confinement: the demo (a Spark session, its warm-up, a
compaction, the HTTP API and ``CompactedReader``) runs to the end inside it.

No systemd runs as PID 1 here, so ``unit_sandbox.py`` rebuilds the confinement from the unit file's own
values (read-only file system, no capabilities, the system call filter and the address families).
"""

from __future__ import annotations

import ctypes.util
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
UNIT = HERE.parents[1] / "deploy" / "systemd" / "compactord.service"
SANDBOX = HERE / "unit_sandbox.py"


def _skip_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return "the unit's confinement is Linux's"
    for tool, package in (("systemd-analyze", "systemd"), ("unshare", "util-linux"),
                          ("setpriv", "util-linux"), ("mount", "mount"), ("java", "openjdk-17-jre-headless")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed on this machine (Debian: apt-get install {package})"
    if ctypes.util.find_library("seccomp") is None:
        return "libseccomp is not installed on this machine (Debian: apt-get install libseccomp2)"
    probe = subprocess.run(["unshare", "--mount", "true"], check=False, capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create a mount namespace here (needs root with CAP_SYS_ADMIN): {probe.stderr.strip()}"
    return None


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """The unit's StateDirectory: writable, and outside /tmp (which the sandbox keeps writable anyway)."""
    with tempfile.TemporaryDirectory(prefix="compactord-state-", dir="/var/tmp") as path:
        yield Path(path)


def confined(state: Path, *command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, str(SANDBOX), "mounts",
         str(UNIT), str(state), "--", *command],
        check=False, capture_output=True, text=True, timeout=timeout)


PROBE = """
import socket
for path in ("/etc/compactord-probe", "probe"):
    try:
        open(path, "w").close()
        print(path, "writable")
    except OSError as exc:
        print(path, exc.errno)
for family in ("AF_NETLINK", "AF_INET"):
    try:
        socket.socket(getattr(socket, family), socket.SOCK_DGRAM).close()
        print(family, "allowed")
    except OSError as exc:
        print(family, exc.errno)
print(open("/proc/self/status").read())
"""


@pytest.mark.slow
def test_spark_compacts_inside_the_systemd_units_confinement(state_dir: Path) -> None:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    # First, the confinement is really there (else the demo below would prove nothing).
    probe = confined(state_dir, sys.executable, "-c", PROBE, timeout=60)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    lines = probe.stdout.splitlines()
    assert "/etc/compactord-probe 30" in lines, "EROFS outside the writable paths"
    assert "probe writable" in lines, "the state directory is writable"
    assert "AF_NETLINK 97" in lines and "AF_INET allowed" in lines, "EAFNOSUPPORT outside the families"
    status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
    assert status["Seccomp"].strip() == "2" and status["NoNewPrivs"].strip() == "1"
    assert int(status["CapBnd"], 16) == 0 and int(status["CapEff"], 16) == 0

    ledgers = state_dir / "ledgers"
    demo = confined(state_dir, sys.executable, "-m", "compactord", "demo", "--ticks", "2000",
                    "--ledger-root", str(ledgers), timeout=600)
    output = demo.stdout + demo.stderr
    assert demo.returncode == 0, output[-5000:]
    assert ": Succeed in " in output and "6 entries from the ledger" in output, output[-5000:]
    assert list(ledgers.rglob("*.parquet")), "the compacted ledger was written"
