"""The Iceberg catalog ``icebergCatalogUri`` names, and the FileIO its tables' files are read and written with.

- A SQL catalog (a SQLAlchemy URL: ``sqlite:``, ``postgresql:``) is pyiceberg's ``SqlCatalog``; the tables it
  creates keep their metadata under ``<root>/@compactord/iceberg/`` (the root's own folder, or its
  ``s3://bucket/prefix/@compactord/iceberg/``).
- A REST catalog (``http://``, ``https://``) is pyiceberg's ``RestCatalog``, sent ``icebergCatalogToken`` as its
  bearer token; it chooses where its tables' metadata lives.
- Any other scheme is refused at start (``config_values`` refuses it as the key is read; ``opener`` again).

On an ``s3://`` root the ledger's part files are referenced by their ``s3://`` URLs and read, like the metadata,
by pyiceberg's ``PyArrowFileIO`` with the root's own settings (endpoint, region, credentials, path style): the
properties ``file_io_properties`` gives. Neither the URI, the token nor a credential is logged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from compactord.config import Settings
from compactord.config_values import iceberg_catalog_kind, s3_location
from compactord.errors import ConfigError
from compactord.ledger.layout import DAEMON_DIR
from compactord.storage import ObjectStore

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

__all__ = ["CATALOG_NAME", "ICEBERG_DIR", "file_io_properties", "opener", "warehouse_of"]

CATALOG_NAME = "compactord"  # the name pyiceberg gives the catalog (a SQL catalog's rows carry it)
ICEBERG_DIR = "iceberg"  # a SQL catalog's tables: <root>/@compactord/iceberg/, a folder per namespace and table
_NOT_SHOWN = "<not shown>"  # the catalog URI may hold a password
_PYARROW_IO = "pyiceberg.io.pyarrow.PyArrowFileIO"


def warehouse_of(objects: ObjectStore) -> str:
    """Where a SQL catalog's tables keep their metadata: ``@compactord/iceberg`` of the root, as a URL."""
    key = f"{DAEMON_DIR}/{ICEBERG_DIR}"
    root = objects.local_root
    if root is not None:
        return (root / key).resolve().as_uri()
    return objects.uri(key)


def file_io_properties(settings: Settings) -> dict[str, str]:
    """The catalog properties that let pyiceberg read and write the root's objects: none on a local root; on an
    ``s3://`` root the ``s3.*`` properties of ``PyArrowFileIO`` from the root's s3* keys (no credentials: the
    standard AWS chain, as the root's own store uses it)."""
    if s3_location(settings.compacted_ledger_root) is None:
        return {}
    endpoint = settings.s3_endpoint.strip()
    # pyiceberg's PyArrowFileIO addresses a bucket by its virtual host unless told: the root's style is said.
    props = {"py-io-impl": _PYARROW_IO, "s3.region": settings.s3_region.strip(),
             "s3.force-virtual-addressing": "false" if settings.s3_path_style else "true"}
    if endpoint:
        props["s3.endpoint"] = endpoint
    if settings.s3_access_key_id:
        props["s3.access-key-id"] = settings.s3_access_key_id
        props["s3.secret-access-key"] = settings.s3_secret_access_key
    return props


def opener(settings: Settings, objects: ObjectStore) -> Callable[[], Catalog]:
    """What opens the catalog ``icebergCatalogUri`` names (called at the first commit, and again after a commit
    failed: a catalog that is down at start delays no start). Checked now, so that a bad value refuses the start.

    :raises ConfigError: the URI names neither a SQL nor a REST catalog, or pyiceberg (the ``[iceberg]`` extra)
        is missing; the URI is never shown."""
    uri = settings.iceberg_catalog_uri
    kind = iceberg_catalog_kind(uri)
    if kind not in ("sql", "rest"):
        raise ConfigError("icebergCatalogUri", _NOT_SHOWN, "a SQL catalog's SQLAlchemy URL (sqlite:, postgresql:) "
                          "or a REST catalog's http:// or https:// URL")
    try:
        if kind == "sql":
            from pyiceberg.catalog.sql import SqlCatalog
        else:
            from pyiceberg.catalog.rest import RestCatalog
    except ImportError as exc:
        raise ConfigError("icebergCatalogUri", _NOT_SHOWN, f"needs pyiceberg, the [iceberg] extra (pip install "
                          f"'compactord[iceberg]'): {exc}") from None
    io = file_io_properties(settings)
    if kind == "sql":
        warehouse = warehouse_of(objects)
        return lambda: SqlCatalog(CATALOG_NAME, uri=uri, warehouse=warehouse, **io)
    auth = {"token": settings.iceberg_catalog_token} if settings.iceberg_catalog_token else {}
    return lambda: RestCatalog(CATALOG_NAME, uri=uri, **auth, **io)
