"""broker.conf (Java properties) -> one frozen, validated ``Settings``.

- The file is parsed as ``java.util.Properties.load`` does (``properties.py``).
- Pulsar's key names where they exist; an empty value means the default.
- ``COMPACTORD_CONF_<key>`` in the environment overrides a key (``spark.*`` keys: file only).
- Secrets may be written ``file:/path``: the value is the file's content, without a trailing newline.
- An unknown key or a bad value fails with the key, the value and what is allowed.

The keys themselves are the fields of ``Settings`` (``config_keys``).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from compactord.config_keys import (
    DEFAULT_FACTORY,
    ENV_PREFIX,
    KEYS,
    KEYS_BY_NAME,
    PULSAR_DEFAULT_FACTORY,
    PULSAR_EVENT_TIME_FACTORY,
    Settings,
)
from compactord.config_values import iceberg_catalog_kind, is_loopback, listener_addresses, s3_location, tls_context
from compactord.errors import ConfigError, ConfigFileError
from compactord.properties import load_properties

__all__ = ["load_settings", "settings_from_properties", "start_warnings"]


# An unknown key's value is never shown in its error (a misspelled secret key's value is the secret), nor the
# value of any key whose name looks like a secret's.
_NOT_SHOWN = "<not shown>"
_SECRET_NAME = re.compile(r"secret|passw|pwd|token|credential|private|access.?key", re.IGNORECASE)


def _shown(name: str, raw: str) -> str:
    """``raw`` as an error about key ``name`` may show it."""
    return _NOT_SHOWN if _SECRET_NAME.search(name) else raw


def _unknown_key(name: str) -> str:
    """The error text for an unknown key ``name``, with the nearest known key when one is close (a typo)."""
    # Above difflib's default cutoff (0.6): most keys share the prefix "compaction", which alone would match.
    nearest = difflib.get_close_matches(name, KEYS_BY_NAME, n=1, cutoff=0.8)
    hint = f"; did you mean {nearest[0]}?" if nearest else ""
    return f"unknown key {name}{hint} (docs/configuration.md lists every key)"


def _read_secret(key: str, raw: str) -> str:
    if not raw.startswith("file:"):
        return raw
    path = Path(raw[len("file:") :])
    try:
        secret = path.read_text(encoding="utf-8").rstrip("\r\n")
    except OSError as exc:
        raise ConfigError(key, raw, f"the secret file cannot be read ({exc.strerror})") from None
    if not secret.strip():  # an empty token file must not turn authentication off
        raise ConfigError(key, raw, "the secret file is empty (or holds only white space); write the secret "
                                    "into it, or leave the key unset")
    return secret


def _check_http(values: dict[str, Any]) -> None:
    """The rules between the HTTP keys: no API open by accident."""
    address, token, read_token = values["http_bind_address"], values["http_auth_token"], values["http_read_token"]
    if _open_by_accident(address, values):
        raise ConfigError("httpBindAddress", address, "a non-loopback address needs httpAuthToken (anyone who "
                          "reaches the port could cancel, delete and rebuild), or httpAllowUnauthenticated=true "
                          "to serve the API open on purpose")
    if read_token and not token:
        raise ConfigError("httpAuthToken", token, "must be set when httpReadToken is (without it the endpoints "
                          "that the read token does not allow would be open)")
    if read_token and read_token == token:
        raise ConfigError("httpReadToken", "<the value of httpAuthToken>", "must differ from httpAuthToken")


def _open_by_accident(host: str, values: dict[str, Any]) -> bool:
    """A server on ``host`` would be open to other machines without a token, and no one said that is on purpose:
    the one rule of the HTTP API and the Kafka listener."""
    return not _loopback_host(host) and not values["http_auth_token"] and not values["http_allow_unauthenticated"]


def _check_listener(values: dict[str, Any]) -> None:
    """The Kafka listener fails closed as the API does: with a token every listener takes SASL/PLAIN, without one
    none can (no password to check) and a non-loopback one is refused unless on purpose; TLS has its files; and
    it relays to the broker over PLAINTEXT only."""
    raw = values["kafka_listeners"]
    listeners = listener_addresses(raw)
    if not listeners:
        return
    for scheme, host, port in listeners:
        shown = f"{scheme}://{host}:{port}"
        sasl = scheme.startswith("SASL_")
        if values["http_auth_token"] and not sasl:
            raise ConfigError("kafkaListeners", raw, f"{shown} takes no password while httpAuthToken is set: use "
                              f"SASL_PLAINTEXT:// or SASL_SSL:// (SASL/PLAIN, the password token:<httpAuthToken>)")
        if not values["http_auth_token"] and sasl:
            raise ConfigError("kafkaListeners", raw, f"{shown} needs httpAuthToken (its SASL/PLAIN password is "
                              "token:<httpAuthToken>); without a token use PLAINTEXT:// or SSL://")
        if _open_by_accident(host, values):
            raise ConfigError("kafkaListeners", raw, f"{shown}: a non-loopback address needs httpAuthToken (and "
                              "SASL_PLAINTEXT:// or SASL_SSL://), or httpAllowUnauthenticated=true to serve the "
                              "compacted view open on purpose")
    _check_listener_tls(values, [scheme for scheme, _, _ in listeners])
    if values["kafka_security_protocol"] != "PLAINTEXT":
        raise ConfigError("kafkaListeners", raw, "empty while kafkaSecurityProtocol is "
                          f"{values['kafka_security_protocol']}: the listener relays to the broker over PLAINTEXT "
                          "only (not supported yet)")
    advertised = values["kafka_advertised_listeners"]
    if not advertised:
        return
    schemes = [scheme for scheme, _, _ in listener_addresses(advertised)]
    if len(schemes) != len(listeners):
        raise ConfigError("kafkaAdvertisedListeners", advertised,
                          f"one address for each of kafkaListeners ({len(listeners)}), or empty")
    for (scheme, host, port), told in zip(listeners, schemes, strict=True):
        if told != scheme:
            raise ConfigError("kafkaAdvertisedListeners", advertised, f"the scheme of each of kafkaListeners in "
                              f"order: {told}:// is advertised for {scheme}://{host}:{port}")


def _check_listener_tls(values: dict[str, Any], schemes: list[str]) -> None:
    """SSL listeners have a certificate and its key, files this process can read that load together."""
    if not any(scheme.endswith("SSL") for scheme in schemes):
        return
    for key, attr in (("kafkaTlsCertFile", "kafka_tls_cert_file"), ("kafkaTlsKeyFile", "kafka_tls_key_file")):
        path = values[attr]
        if not path:
            raise ConfigError(key, path, "required by an SSL:// or SASL_SSL:// listener of kafkaListeners: set "
                              "kafkaTlsCertFile and kafkaTlsKeyFile (PEM files)")
        if not os.access(path, os.R_OK):
            raise ConfigError(key, path, "a readable PEM file: this file does not exist or cannot be read")
    tls_context(values["kafka_tls_cert_file"], values["kafka_tls_key_file"])


def _loopback_host(host: str) -> bool:
    try:
        return host == "localhost" or is_loopback(host)
    except ValueError:  # a host name, or "" (every address): not known to be loopback
        return False


def _check_s3(values: dict[str, Any]) -> None:
    """The rules between the storage keys: an s3:// root has what it needs, and the s3* keys an s3:// root."""
    root = values["compacted_ledger_root"]
    if s3_location(root) is None:
        return
    if not values["s3_region"].strip():
        raise ConfigError("s3Region", values["s3_region"], f"required when compactedLedgerRoot is an s3:// root "
                          f"({root}): the bucket's region, e.g. us-east-1 (never looked up)")
    if bool(values["s3_access_key_id"]) != bool(values["s3_secret_access_key"]):
        missing = "s3SecretAccessKey" if values["s3_access_key_id"] else "s3AccessKeyId"
        raise ConfigError(missing, "", "set s3AccessKeyId and s3SecretAccessKey together, or neither (the "
                          "standard AWS credential chain)")
    if values["s3_kms_key_id"] and values["s3_server_side_encryption"] != "aws:kms":
        raise ConfigError("s3KmsKeyId", values["s3_kms_key_id"], "needs s3ServerSideEncryption=aws:kms")
    if values["s3_endpoint"] and not values["s3_endpoint"].startswith(("http://", "https://")):
        raise ConfigError("s3Endpoint", values["s3_endpoint"], "an http:// or https:// URL")


def _check_cluster(values: dict[str, Any]) -> None:
    """The cluster's CA bundle is read when a member first calls another: a path that names no readable file
    refuses the start instead."""
    ca_file = values["cluster_tls_ca_file"]
    if ca_file and not os.access(ca_file, os.R_OK):
        raise ConfigError("clusterTlsCaFile", ca_file, "a readable CA bundle (PEM), or empty for the system's: "
                          "this file does not exist or cannot be read")


def _check_iceberg(values: dict[str, Any]) -> None:
    """The catalog's token goes to a REST catalog only, and a SQLite file serves one daemon: the members of a
    cluster would each write their own copy of it (or lock one another out of a shared one)."""
    uri = values["iceberg_catalog_uri"]
    if values["iceberg_catalog_token"] and iceberg_catalog_kind(uri) != "rest":
        raise ConfigError("icebergCatalogToken", _NOT_SHOWN, "is sent to a REST catalog only: set icebergCatalogUri "
                          "to its http:// or https:// URL, or leave icebergCatalogToken empty")
    if values["cluster_name"] and uri.startswith("sqlite"):
        raise ConfigError("icebergCatalogUri", _NOT_SHOWN, f"a SQLite catalog cannot be shared by the members of "
                          f"cluster {values['cluster_name']} (clusterName): use a PostgreSQL catalog "
                          "(postgresql://USER:PASSWORD@HOST/DB) or a REST catalog (https://...)")


def _resolve_factory_alias(values: dict[str, Any], explicit: set[str]) -> None:
    factory = values["compaction_service_factory_class_name"]
    if factory == PULSAR_DEFAULT_FACTORY:
        values["compaction_service_factory_class_name"] = DEFAULT_FACTORY
    elif factory == PULSAR_EVENT_TIME_FACTORY:
        values["compaction_service_factory_class_name"] = DEFAULT_FACTORY
        if "compactionStrategy" in explicit and values["compaction_strategy"] != "event-time":
            raise ConfigError(
                "compactionStrategy", values["compaction_strategy"],
                f"compactionServiceFactoryClassName={PULSAR_EVENT_TIME_FACTORY} selects the event-time "
                "strategy; leave compactionStrategy unset or set it to event-time",
            )
        values["compaction_strategy"] = "event-time"


def settings_from_properties(props: Mapping[str, str], env: Mapping[str, str] | None = None) -> Settings:
    """Validate ``props`` (the parsed file) with ``env`` overrides into ``Settings``.

    :raises ConfigError: an unknown key or a bad value (naming the key, the value and what is allowed).
    """
    env = os.environ if env is None else env
    merged: dict[str, str] = {}
    spark_conf: dict[str, str] = {}
    from_env: dict[str, str] = {}  # key -> the environment variable that set it
    for name, raw in props.items():
        if name.startswith("spark."):
            spark_conf[name] = raw
        elif name not in KEYS_BY_NAME:
            raise ConfigError(name, _NOT_SHOWN, _unknown_key(name))
        else:
            merged[name] = raw
    for env_name, raw in env.items():
        if not env_name.startswith(ENV_PREFIX):
            continue
        name = env_name[len(ENV_PREFIX) :]
        if name.startswith("spark."):
            raise ConfigError(env_name, _shown(name, raw), "spark.* keys can be set in the config file only")
        if name not in KEYS_BY_NAME:
            raise ConfigError(env_name, _NOT_SHOWN, _unknown_key(name))
        merged[name] = raw
        from_env[name] = env_name
    values: dict[str, Any] = {}
    explicit: set[str] = set()
    for key in KEYS:
        raw = merged.get(key.name, "")
        if raw.strip() == "":  # an empty value means the default
            raw = key.default
        else:
            explicit.add(key.name)
            if key.secret:
                raw = _read_secret(key.name, raw)
        try:
            values[key.attr] = key.parse(key.name, raw) if raw != "" else raw
        except ConfigError as exc:
            if key.name not in from_env:
                raise
            # Name where the bad value came from: the file may hold a good one that the variable overrides.
            raise ConfigError(from_env[key.name], exc.value, exc.message.partition(" is invalid: ")[2]) from None
    _resolve_factory_alias(values, explicit)
    _check_http(values)
    _check_listener(values)
    _check_s3(values)
    _check_cluster(values)
    _check_iceberg(values)
    values["spark_conf"] = spark_conf
    return Settings(**values)


def start_warnings(settings: Settings) -> list[str]:
    """One line for each value accepted below its key's recommended minimum (the daemon logs them at start)."""
    found = []
    for key in KEYS:
        value = getattr(settings, key.attr)
        advice = key.parse.warning(value) if value != "" else None
        if advice:
            found.append(f"{key.name}={value} is {advice}")
    return found


def load_settings(path: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None) -> Settings:
    """Read a broker.conf file (None: defaults and environment only)."""
    props: dict[str, str] = {}
    if path is not None:
        try:
            text = Path(path).read_text(encoding="latin-1")  # Properties.load reads ISO 8859-1
        except FileNotFoundError:
            raise ConfigFileError(path, "does not exist") from None
        except OSError as exc:
            raise ConfigFileError(path, f"cannot be read ({exc.strerror})") from None
        try:
            props = load_properties(text)
        except ValueError as exc:
            raise ConfigFileError(path, f"is not valid properties text ({exc})") from None
    return settings_from_properties(props, env)
