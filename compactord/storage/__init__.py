"""Every byte under the ledger root goes through one ``ObjectStore`` (``base.py``): the local disk
(``local.py``) or an S3 bucket (``s3.py``). The backends are made here and only here: ``open_store`` makes the
store a ``compactedLedgerRoot`` names, ``open_local`` a folder's, ``open_described`` the store another process
described (``ObjectStore.descriptor``). Code outside this package asks a store what it declares, never its type."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compactord.config_values import s3_location
from compactord.errors import ConfigError, InvalidArgument
from compactord.storage.base import ObjectInfo, ObjectStore
from compactord.storage.local import LocalStore

if TYPE_CHECKING:
    from compactord.config import Settings
    from compactord.storage.s3_client import Observer

__all__ = ["LocalStore", "ObjectInfo", "ObjectStore", "open_described", "open_local", "open_store"]

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def open_store(root: str, settings: Settings | None = None, *, observer: Observer | None = None) -> ObjectStore:
    """The store of ``root``: a plain path is a folder on the local disk, ``s3://BUCKET/PREFIX`` a prefix of a
    bucket reached as ``settings``' s3* keys say (its region required), its requests retried within
    storageReadRetrySeconds and storageWriteRetrySeconds. ``observer`` hears of an S3 store's
    every request.

    :raises ConfigError: ``root`` is empty or names another scheme (``s3a://``, ``file://``, ...), or an S3 root
        comes without its settings (or its region).
    """
    if not isinstance(root, str) or not root.strip():
        raise ConfigError("compactedLedgerRoot", root,
                          "a ledger root is a plain path of a local directory or s3://BUCKET/PREFIX")
    location = s3_location(root)
    if location is not None:
        return _s3_store(root, location, settings, observer)
    scheme = _SCHEME.match(root)
    if scheme is not None:
        raise ConfigError("compactedLedgerRoot", root,
                          f"the scheme {scheme.group(1)}:// is not supported; a plain path of a local "
                          "directory (e.g. /var/lib/compactord/ledgers) or s3://BUCKET/PREFIX is allowed")
    return LocalStore(root)


def _s3_store(root: str, location: tuple[str, str], settings: Settings | None,
              observer: Observer | None) -> ObjectStore:
    if settings is None or not settings.s3_region.strip():
        raise ConfigError("s3Region", "" if settings is None else settings.s3_region,
                          f"required when compactedLedgerRoot is an s3:// root ({root})")
    try:
        from compactord.storage.s3 import S3Options, S3Store
    except ImportError as exc:  # boto3 is the s3 extra's
        raise ConfigError("compactedLedgerRoot", root, f"an s3:// root needs boto3: pip install "
                          f"'compactord[s3]' ({exc})") from None
    options = S3Options(
        region=settings.s3_region.strip(), endpoint=settings.s3_endpoint.strip(),
        access_key_id=settings.s3_access_key_id, secret_access_key=settings.s3_secret_access_key,
        path_style=settings.s3_path_style, ca_bundle=settings.s3_ca_bundle,
        server_side_encryption=settings.s3_server_side_encryption, kms_key_id=settings.s3_kms_key_id)
    bucket, prefix = location
    return S3Store(bucket, prefix, options, observer=observer, read_budget=settings.storage_read_retry_seconds,
                   write_budget=settings.storage_write_retry_seconds)


def open_local(folder: str | Path) -> ObjectStore:
    """The local store rooted at ``folder`` (a ledger's folder read without its root: the warm-up's, a test's)."""
    return LocalStore(folder)


def open_described(descriptor: Mapping[str, Any], secrets: Mapping[str, Any], *,
                   observer: Observer | None = None) -> ObjectStore:
    """The store ``descriptor`` (``ObjectStore.descriptor``) names, with ``secrets`` (``ObjectStore.credentials``);
    ``observer`` hears of an S3 store's every request.

    :raises InvalidArgument: the descriptor names S3 settings with a root that is not ``s3://BUCKET/PREFIX``.
    """
    root = str(descriptor["root"])
    if "s3" not in descriptor:
        return LocalStore(root)
    from compactord.storage.s3 import S3Options, S3Store

    location = s3_location(root)
    if location is None:
        raise InvalidArgument(f"a task's store descriptor names {root!r} with S3 settings: "
                              "s3://BUCKET/PREFIX is allowed")
    options = S3Options(**descriptor["s3"], access_key_id=str(secrets.get("access_key_id", "")),
                        secret_access_key=str(secrets.get("secret_access_key", "")))
    return S3Store(location[0], location[1], options, observer=observer, **descriptor.get("budgets", {}))
