"""Every byte under the ledger root goes through one ``ObjectStore`` (``base.py``): the local disk
(``local.py``) today. ``open_store`` makes the store a ``compactedLedgerRoot`` names."""

from __future__ import annotations

import re

from compactord.errors import ConfigError
from compactord.storage.base import ObjectInfo, ObjectStore
from compactord.storage.local import LocalStore

__all__ = ["LocalStore", "ObjectInfo", "ObjectStore", "open_store"]

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def open_store(root: str) -> ObjectStore:
    """The store of ``root``: a plain path is a folder on the local disk.

    :raises ConfigError: ``root`` is empty or names a scheme (``s3://``, ``file://``, ...).
    """
    if not isinstance(root, str) or not root.strip():
        raise ConfigError("compactedLedgerRoot", root, "a ledger root is a plain path of a local directory")
    scheme = _SCHEME.match(root)
    if scheme is not None:
        raise ConfigError("compactedLedgerRoot", root,
                          f"the scheme {scheme.group(1)}:// is not supported; a plain path of a local "
                          "directory is allowed (e.g. /var/lib/compactord/ledgers)")
    return LocalStore(root)
