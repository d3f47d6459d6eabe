"""The value parsers of broker.conf keys: each takes (key, raw string) and returns the typed value or
raises ``ConfigError`` naming the key, the value and what is allowed. A leaf module of ``config``."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable

from compactord.errors import ConfigError
from compactord.event_time import validate_event_time_source

__all__ = [
    "bind_address",
    "boolean",
    "bootstrap",
    "choice",
    "class_ref",
    "class_refs",
    "event_time_source",
    "float_range",
    "host_list",
    "int_range",
    "is_loopback",
    "local_path",
    "regex",
    "text",
]

def text(key: str, raw: str) -> str:
    return raw


def int_range(lo: int, hi: int | None = None) -> Callable[[str, str], int]:
    def parse(key: str, raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ConfigError(key, raw, "expected a whole number") from None
        if value < lo or (hi is not None and value > hi):
            bound = f"from {lo} to {hi}" if hi is not None else f">= {lo}"
            raise ConfigError(key, raw, f"expected a whole number {bound}")
        return value

    return parse


def float_range(lo: float, hi: float) -> Callable[[str, str], float]:
    def parse(key: str, raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ConfigError(key, raw, "expected a number") from None
        if not lo <= value <= hi:
            raise ConfigError(key, raw, f"expected a number from {lo} to {hi}")
        return value

    return parse


def boolean(key: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise ConfigError(key, raw, "expected true or false")


def choice(*allowed: str) -> Callable[[str, str], str]:
    def parse(key: str, raw: str) -> str:
        if raw.strip() not in allowed:
            raise ConfigError(key, raw, f"expected one of {', '.join(allowed)}")
        return raw.strip()

    return parse


def class_ref(key: str, raw: str) -> str:
    return raw.strip()


def class_refs(key: str, raw: str) -> str:
    refs = [r.strip() for r in raw.split(",") if r.strip()]
    for ref in refs:
        module_name, sep, qualname = ref.partition(":") if ":" in ref else ref.rpartition(".")
        if not sep or not module_name or not qualname:
            raise ConfigError(key, raw, f"{ref!r} is not a reference: expected module:Class[,module:Class...]")
    return ",".join(refs)


def local_path(key: str, raw: str) -> str:
    value = raw.strip()
    if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*://", value) or re.match(r"(hdfs|s3a?|gs|abfss?|wasbs?):", value):
        raise ConfigError(key, raw, "expected a file-system path (on a cluster: a shared mount at the same path "
                                    "on every executor); URLs such as hdfs:// or s3a:// are not supported")
    return value


def regex(key: str, raw: str) -> str:
    try:
        re.compile(raw)
    except re.error as exc:
        raise ConfigError(key, raw, f"expected a Python regular expression ({exc})") from None
    return raw


def bind_address(key: str, raw: str) -> str:
    value = raw.strip()
    if value in ("localhost", "0.0.0.0", "::"):
        return value
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ConfigError(key, raw, "expected an IP address such as 127.0.0.1 or 0.0.0.0") from None
    return value


def is_loopback(address: str) -> bool:
    """``address`` (an ``httpBindAddress``) is reachable from this machine only."""
    return address == "localhost" or ipaddress.ip_address(address).is_loopback


def host_list(key: str, raw: str) -> str:
    hosts = [h.strip().lower() for h in raw.split(",") if h.strip()]
    for host in hosts:
        if not re.fullmatch(r"[a-z0-9._-]+(:[0-9]{1,5})?|\[[0-9a-f:.]+\](:[0-9]{1,5})?", host):
            raise ConfigError(key, raw, f"{host!r} is not a host name: expected name[:port][,name[:port]...], "
                                        "e.g. compactord.example.com,10.0.0.5:8642")
    return ",".join(hosts)


def bootstrap(key: str, raw: str) -> str:
    servers = [s.strip() for s in raw.split(",") if s.strip()]
    if not servers:
        raise ConfigError(key, raw, "expected host:port[,host:port...]")
    for server in servers:
        host, sep, port = server.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(key, raw, f"{server!r} is not host:port (port 1 to 65535)")
    return ",".join(servers)


def event_time_source(key: str, raw: str) -> str:
    return validate_event_time_source(raw.strip(), key)
