"""The value parsers of broker.conf keys: each ``Parser`` takes (key, raw string) and returns the typed value
or raises ``ConfigError`` naming the key, the value and what is allowed, its ``allowed`` text, which the
configuration reference shows too. A leaf module of ``config``."""

from __future__ import annotations

import ipaddress
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar
from urllib.parse import urlsplit

from compactord.errors import ConfigError
from compactord.event_time import EVENT_TIME_SOURCES, validate_event_time_source

__all__ = [
    "LISTENER_SCHEMES",
    "Parser",
    "Rejected",
    "bind_address",
    "boolean",
    "bootstrap",
    "choice",
    "class_ref",
    "class_refs",
    "cluster_name",
    "event_time_source",
    "float_range",
    "host_list",
    "http_url",
    "iceberg_catalog_kind",
    "iceberg_catalog_uri",
    "iceberg_namespace",
    "int_range",
    "is_loopback",
    "ledger_root",
    "listener_addresses",
    "listener_list",
    "pem_file",
    "regex",
    "s3_location",
    "spark_master",
    "text",
    "tls_context",
]

T = TypeVar("T")


class Rejected(ValueError):
    """Raised by a ``Parser``'s conversion: the raw text is not allowed; ``what`` names the bad part."""

    def __init__(self, what: str = "") -> None:
        super().__init__(what)
        self.what = what


@dataclass(frozen=True, slots=True)
class Parser(Generic[T]):
    """A key's parser and the text of what it allows: the configuration reference shows ``allowed`` and
    the error for a bad value says it, so the two cannot tell different stories. ``advice``: for a value
    accepted but not recommended (below a production minimum), the warning the daemon logs at start."""

    allowed: str
    convert: Callable[[str], T]  # raw text -> value; raises Rejected
    advice: Callable[[T], str | None] | None = None

    def __call__(self, key: str, raw: str) -> T:
        try:
            return self.convert(raw)
        except Rejected as exc:
            problem = f"{exc.what}: expected" if exc.what else "expected"
            raise ConfigError(key, raw, f"{problem} {self.allowed}") from None

    def warning(self, value: T) -> str | None:
        """What is wrong with an accepted ``value`` (None: nothing)."""
        return self.advice(value) if self.advice is not None else None


def _text(raw: str) -> str:
    return raw


text = Parser("any text", _text)


def int_range(lo: int, hi: int | None = None, *, or_zero: bool = False,
              recommended: int | None = None) -> Parser[int]:
    """``or_zero``: 0 is allowed too (an "off" below the range). ``recommended``: the production minimum; a
    value from ``lo`` up to it is accepted with a warning (tests run a daemon with shorter timings)."""
    def convert(raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise Rejected() from None
        if (value < lo or (hi is not None and value > hi)) and not (or_zero and value == 0):
            raise Rejected()
        return value

    def advice(value: int) -> str | None:
        if recommended is None or value >= recommended or (or_zero and value == 0):
            return None
        return f"below the recommended minimum {recommended}: accepted, but meant for tests, not production"

    bound = f"from {lo} to {hi}" if hi is not None else f">= {lo}"
    hint = f" ({recommended} or more recommended; less is accepted with a warning)" if recommended else ""
    return Parser(f"{'0 or ' if or_zero else ''}a whole number {bound}{hint}", convert, advice)


def float_range(lo: float, hi: float) -> Parser[float]:
    def convert(raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise Rejected() from None
        if not lo <= value <= hi:  # NaN included
            raise Rejected()
        return value

    return Parser(f"a number from {lo} to {hi}", convert)


def _boolean(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered not in ("true", "false"):
        raise Rejected()
    return lowered == "true"


boolean = Parser("true or false", _boolean)


def choice(*allowed: str) -> Parser[str]:
    def convert(raw: str) -> str:
        if raw.strip() not in allowed:
            raise Rejected()
        return raw.strip()

    return Parser(f"one of {', '.join(allowed)}", convert)


def _class_ref(raw: str) -> str:
    return raw.strip()


# Resolved when the daemon starts (``refs.py``), where a reference that names nothing refuses the start.
class_ref = Parser("a built-in name or module:Class, resolved when the daemon starts", _class_ref)


def _class_refs(raw: str) -> str:
    refs = [r.strip() for r in raw.split(",") if r.strip()]
    for ref in refs:
        module_name, sep, qualname = ref.partition(":") if ":" in ref else ref.rpartition(".")
        if not sep or not module_name or not qualname:
            raise Rejected(f"{ref!r} is not a reference")
    return ",".join(refs)


class_refs = Parser("module:Class[,module:Class...]", _class_refs)


_S3_SCHEME = "s3://"
# S3's bucket names: 3 to 63 lowercase letters, digits, dots and hyphens, a letter or digit at each end.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def s3_location(root: str) -> tuple[str, str] | None:
    """(bucket, prefix) of an ``s3://BUCKET/PREFIX`` ledger root (the prefix without its slashes), or None for
    a path. A root that ``ledger_root`` accepted only."""
    if not root.startswith(_S3_SCHEME):
        return None
    bucket, _, prefix = root[len(_S3_SCHEME):].partition("/")
    return bucket, prefix.strip("/")


def _ledger_root(raw: str) -> str:
    value = raw.strip()
    if value.startswith(_S3_SCHEME):
        bucket, _, prefix = value[len(_S3_SCHEME):].partition("/")
        if not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise Rejected(f"{bucket!r} is not an S3 bucket name (3-63 lowercase letters, digits, '.', '-')")
        parts = prefix.strip("/").split("/") if prefix.strip("/") else []
        if any(part in ("", ".", "..") for part in parts) or "\\" in prefix:
            raise Rejected(f"the prefix {prefix!r} has an empty, '.' or '..' segment")
        return _S3_SCHEME + bucket + ("/" + "/".join(parts) if parts else "")
    if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*://", value) or re.match(r"(hdfs|s3a?|gs|abfss?|wasbs?):", value):
        raise Rejected()
    return value


ledger_root = Parser("a file-system path (on a cluster: a shared mount at the same path on every executor), or "
                     "s3://BUCKET/PREFIX (see the s3* keys); other URLs such as s3a://, hdfs:// or file:// are not "
                     "supported", _ledger_root)


def _regex(raw: str) -> str:
    try:
        re.compile(raw)
    except re.error as exc:
        raise Rejected(f"not a regular expression ({exc})") from None
    return raw


regex = Parser("a Python regular expression", _regex)


def _bind_address(raw: str) -> str:
    value = raw.strip()
    if value in ("localhost", "0.0.0.0", "::"):
        return value
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise Rejected() from None
    return value


bind_address = Parser("an IP address such as 127.0.0.1 or 0.0.0.0, or localhost", _bind_address)


def is_loopback(address: str) -> bool:
    """``address`` (an ``httpBindAddress``) is reachable from this machine only."""
    return address == "localhost" or ipaddress.ip_address(address).is_loopback


def _host_list(raw: str) -> str:
    hosts = [h.strip().lower() for h in raw.split(",") if h.strip()]
    for host in hosts:
        if not re.fullmatch(r"[a-z0-9._-]+(:[0-9]{1,5})?|\[[0-9a-f:.]+\](:[0-9]{1,5})?", host):
            raise Rejected(f"{host!r} is not a host name")
    return ",".join(hosts)


host_list = Parser("name[:port][,name[:port]...], e.g. compactord.example.com,10.0.0.5:8642", _host_list)


def _bootstrap(raw: str) -> str:
    servers = [s.strip() for s in raw.split(",") if s.strip()]
    if not servers:
        raise Rejected()
    for server in servers:
        host, sep, port = server.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise Rejected(f"{server!r} is not host:port")
    return ",".join(servers)


bootstrap = Parser("host:port[,host:port...] (port 1 to 65535)", _bootstrap)


def _event_time_source(raw: str) -> str:
    try:
        return validate_event_time_source(raw.strip())
    except ConfigError:
        raise Rejected() from None


event_time_source = Parser(EVENT_TIME_SOURCES, _event_time_source)


# The masters Spark itself accepts (SparkContext.createTaskScheduler), checked here so that a typo fails when the
# config loads, with what is allowed, not when the JVM starts.
_LOCAL_MASTER = re.compile(r"local(\[([1-9][0-9]*|\*)(\s*,\s*[1-9][0-9]*)?\])?")
_HOST_PORT = re.compile(r"([A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):([0-9]{1,5})")


def _spark_master(raw: str) -> str:
    value = raw.strip()
    if _LOCAL_MASTER.fullmatch(value) or value == "yarn":
        return value
    if value.startswith("spark://"):
        for server in value[len("spark://"):].split(","):
            found = _HOST_PORT.fullmatch(server)
            if not found or not 0 < int(found.group(2)) < 65536:
                raise Rejected(f"{server!r} is not host:port")
        return value
    if value.startswith("k8s://") and len(value) > len("k8s://"):
        return value
    raise Rejected()


spark_master = Parser("local, local[N], local[*], local[N,F] or local[*,F] (N threads, F attempts of a task), "
                      "spark://HOST:PORT[,HOST:PORT...], yarn, or k8s://API-SERVER", _spark_master)


# Kafka's topic names: letters, digits, '.', '_', '-', at most 249 characters; the coordination topic is this
# prefix and the cluster's name.
COORDINATION_TOPIC_PREFIX = "__compactord-"
_TOPIC_NAME_MAX = 249
_CLUSTER_NAME = re.compile(r"[a-zA-Z0-9._-]+")


def _cluster_name(raw: str) -> str:
    value = raw.strip()
    if not _CLUSTER_NAME.fullmatch(value):
        raise Rejected()
    if len(COORDINATION_TOPIC_PREFIX + value) > _TOPIC_NAME_MAX:
        raise Rejected(f"its coordination topic's name would be {len(COORDINATION_TOPIC_PREFIX + value)} "
                       "characters long")
    return value


cluster_name = Parser(f"letters, digits, '.', '_' and '-' (part of a Kafka topic name: "
                      f"{COORDINATION_TOPIC_PREFIX}NAME at most {_TOPIC_NAME_MAX} characters), or empty for a "
                      "single daemon", _cluster_name)


def _http_url(raw: str) -> str:
    value = raw.strip()
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError:
        raise Rejected() from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment \
            or parts.username is not None:
        raise Rejected()
    return value.rstrip("/")


http_url = Parser("an http:// or https:// URL (scheme, host, optional port and path; no query, user or "
                  "fragment), e.g. https://compactord-0.compactord:8642", _http_url)


# A Kafka listener's address: SCHEME://host:port, the host a name, an IPv4 address, [IPv6] or empty (every address).
_LISTENER = re.compile(r"([A-Z_]+)://([A-Za-z0-9._-]*|\[[0-9A-Fa-f:.]+\]):([0-9]{1,5})")
LISTENER_SCHEMES = ("PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL")


def listener_addresses(raw: str) -> list[tuple[str, str, int]]:
    """``kafkaListeners`` (or ``kafkaAdvertisedListeners``) as (scheme, host, port): host "" for every address,
    an IPv6 address without its brackets.

    :raises Rejected: an address is not SCHEME://host:port with a scheme of ``LISTENER_SCHEMES``."""
    found = []
    for address in (a.strip() for a in raw.split(",") if a.strip()):
        match = _LISTENER.fullmatch(address)
        if match is None or not 0 <= int(match[3]) <= 65535:
            raise Rejected(f"{address!r} is not SCHEME://host:port")
        if match[1] not in LISTENER_SCHEMES:
            raise Rejected(f"{address!r}: {match[1]} is not one of {', '.join(LISTENER_SCHEMES)}")
        found.append((match[1], match[2].strip("[]"), int(match[3])))
    return found


def _kafka_listeners(raw: str) -> str:
    listener_addresses(raw)
    return ",".join(a.strip() for a in raw.split(",") if a.strip())


listener_list = Parser("SCHEME://host:port[,SCHEME://host:port...], SCHEME one of PLAINTEXT, SASL_PLAINTEXT, SSL "
                       "and SASL_SSL (host empty for every address; port 0 to 65535), or empty", _kafka_listeners)


def _pem_file(raw: str) -> str:
    path = raw.strip().removeprefix("file:")
    if not path or "://" in path:  # a URL names no file this process opens
        raise Rejected()
    return path


pem_file = Parser("the path of a local PEM file, written /path or file:/path, or empty", _pem_file)


def _no_password() -> bytes:
    return b""  # an encrypted key fails to load, never prompts on a terminal


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """The server context of the Kafka listener's SSL and SASL_SSL listeners (``kafkaTlsCertFile``,
    ``kafkaTlsKeyFile``): TLS 1.2 at least, no client certificate asked.

    :raises ConfigError: the certificate or its key do not load (the message names the files, never a key's
        contents).
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file, password=_no_password)
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc.strerror or type(exc).__name__
        raise ConfigError("kafkaTlsCertFile", cert_file, f"a PEM certificate whose private key is kafkaTlsKeyFile="
                          f"{key_file} (PEM, not encrypted): they do not load together ({reason})") from None
    return context


class _SecretParser(Parser[T]):
    """A parser whose errors never show the value (a catalog URI may hold a database password)."""

    def __call__(self, key: str, raw: str) -> T:
        try:
            return self.convert(raw)
        except Rejected as exc:
            problem = f"{exc.what}: expected" if exc.what else "expected"
            raise ConfigError(key, "<not shown>", f"{problem} {self.allowed}") from None


_SQL_CATALOG = re.compile(r"(sqlite|postgresql)(\+[a-z0-9_]+)?://.+")


def iceberg_catalog_kind(uri: str) -> str:
    """``sql`` or ``rest``: the kind of catalog a valid ``icebergCatalogUri`` names ("" when it is empty)."""
    if not uri:
        return ""
    return "rest" if uri.startswith(("http://", "https://")) else "sql"


def _iceberg_catalog_uri(raw: str) -> str:
    value = raw.strip()
    if value.startswith(("http://", "https://")):
        return _http_url(value)  # a REST catalog: its base URL (no user, query or fragment: the token is apart)
    if not _SQL_CATALOG.fullmatch(value):
        scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", value)
        raise Rejected(f"the scheme {scheme.group(1)}:// is not supported" if scheme else "")
    return value


iceberg_catalog_uri = _SecretParser(
    "a SQL catalog's SQLAlchemy URL: sqlite:////PATH/catalog.db (one daemon) or postgresql://USER:PASSWORD@HOST/DB; "
    "or a REST catalog's http:// or https:// URL (its token in icebergCatalogToken); file:/path reads it from a "
    "file; empty: off", _iceberg_catalog_uri)


def _iceberg_namespace(raw: str) -> str:
    value = raw.strip()
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,127}", value):
        raise Rejected()
    return value


iceberg_namespace = Parser("letters, digits, '_' and '-' (1 to 128, not starting with '-'): one level of the "
                           "catalog's namespaces", _iceberg_namespace)
