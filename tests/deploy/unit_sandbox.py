"""Run a command inside the confinement of ``deploy/systemd/compactord.service``, without systemd.

The test machine has no systemd as PID 1, so the unit itself cannot start. This script rebuilds the
parts of it that Spark's JVM could trip over, from the unit file's own values:

- ``ProtectSystem=strict``: a private mount namespace where ``/`` is read-only and only ``/tmp`` (the
  unit's ``PrivateTmp``) and the given writable folders (its ``ReadWritePaths``) are writable;
- ``CapabilityBoundingSet=`` and ``NoNewPrivileges=yes`` (``setpriv``);
- ``SystemCallFilter=`` (the groups expanded by ``systemd-analyze syscall-filter``),
  ``SystemCallErrorNumber=``, ``SystemCallArchitectures=native`` and ``RestrictAddressFamilies=``, as
  one seccomp filter built with libseccomp, as systemd builds it.

Usage (as root, which the mount namespace needs): ``python unit_sandbox.py UNIT WRITABLE -- COMMAND...``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import socket
import subprocess
import sys
from pathlib import Path

SCMP_ACT_ALLOW = 0x7FFF0000
AF_MAX = 46  # linux/socket.h


def scmp_act_errno(code: int) -> int:
    """libseccomp's scmp_act_errno(code)."""
    return 0x00050000 | (code & 0xFFFF)


class ScmpArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


SCMP_CMP_EQ = 4
SCMP_CMP_GE = 5


def service_settings(unit: Path) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    section = ""
    for line in unit.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


@functools.cache
def expand(name: str) -> frozenset[str]:
    """A system call or a ``@group``, as the system calls it stands for."""
    if not name.startswith("@"):
        return frozenset({name})
    out = subprocess.run(["systemd-analyze", "syscall-filter", "--no-pager", name],
                         capture_output=True, text=True, check=True).stdout
    calls: set[str] = set()
    for line in out.splitlines()[1:]:
        line = line.strip()
        if line and not line.startswith("#"):
            calls |= expand(line)
    return frozenset(calls)


def allowed_calls(filters: list[str]) -> set[str]:
    """systemd's semantics: the first line decides allow- or deny-list; later lines add or remove."""
    allowed: set[str] = set()
    for value in filters:
        deny = value.startswith("~")
        names = {call for word in value.lstrip("~").split() for call in expand(word)}
        allowed = allowed - names if deny else allowed | names
    return allowed


def load_seccomp(settings: dict[str, list[str]]) -> None:
    lib = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(ScmpArgCmp)]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    code = getattr(errno, settings["SystemCallErrorNumber"][-1])
    assert settings["SystemCallArchitectures"][-1] == "native"  # libseccomp's default: native only
    ctx = lib.seccomp_init(scmp_act_errno(code))
    assert ctx

    def rule(action: int, number: int, *cmps: ScmpArgCmp) -> None:
        array = (ScmpArgCmp * len(cmps))(*cmps) if cmps else None
        result = lib.seccomp_rule_add_array(ctx, action, number, len(cmps), array)
        assert result == 0, f"seccomp_rule_add: {os.strerror(-result)}"

    families = {getattr(socket, name) for name in settings["RestrictAddressFamilies"][-1].split()}
    socket_nr = lib.seccomp_syscall_resolve_name(b"socket")
    for name in sorted(allowed_calls(settings["SystemCallFilter"])):
        number = lib.seccomp_syscall_resolve_name(name.encode())
        if number < 0 or number == socket_nr:  # not a call of this architecture; socket() below
            continue
        rule(SCMP_ACT_ALLOW, number)
    # RestrictAddressFamilies: socket() of another family fails with EAFNOSUPPORT, as under systemd
    for family in range(AF_MAX):
        action = SCMP_ACT_ALLOW if family in families else scmp_act_errno(errno.EAFNOSUPPORT)
        rule(action, socket_nr, ScmpArgCmp(0, SCMP_CMP_EQ, family, 0))
    rule(scmp_act_errno(errno.EAFNOSUPPORT), socket_nr, ScmpArgCmp(0, SCMP_CMP_GE, AF_MAX, 0))
    result = lib.seccomp_load(ctx)
    assert result == 0, f"seccomp_load: {os.strerror(-result)}"


def main(argv: list[str]) -> int:
    split = argv.index("--")
    stage, unit, writable, command = argv[0], Path(argv[1]), argv[2], argv[split + 1:]
    settings = service_settings(unit)
    if stage == "mounts":  # root, in a new mount namespace (unshare --mount)
        assert settings["ProtectSystem"][-1] == "strict" and settings["PrivateTmp"][-1] == "yes"
        for path in ("/tmp", writable):
            subprocess.run(["mount", "--bind", path, path], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", "/"], check=True)
        assert settings["CapabilityBoundingSet"][-1] == "" and settings["NoNewPrivileges"][-1] == "yes"
        os.execvp("setpriv", ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs",
                              sys.executable, __file__, "seccomp", *argv[1:]])
    load_seccomp(settings)
    os.chdir(writable)
    os.environ["HOME"] = writable
    os.execvp(command[0], command)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
