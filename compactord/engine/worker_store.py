"""The ledger root as Spark's Python workers reach it: the same store the driver opened (``storage.open_store``),
named in the tasks' spec by a descriptor that holds no secret, and opened once per worker.

The driver ships ``describe(store)``: the root and the settings a task needs to reach it (an S3 root's endpoint,
region, path style, CA bundle and server-side encryption), never its access keys. Those travel as the Kafka
client's secrets do: in the welcome of the run's channel, to a task that presented the run's token
(``channel``). A task then names its files by object keys under that root (``topic/ledger-12/part-...``).

A spec without a descriptor (the warm-up's, a test's) names local paths: each is then the object named by the
path's last name in a local store rooted at its folder (``locate``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from compactord import storage
from compactord.ledger.row_groups import locate
from compactord.storage import ObjectStore
from compactord.task_report import count_request

__all__ = ["describe", "locate", "new_output", "open_described", "spec_store", "store_secrets"]

_opened: dict[str, ObjectStore] = {}  # a worker's stores, by descriptor (and credentials)
_lock = threading.Lock()


def describe(store: ObjectStore) -> dict[str, Any]:
    """What a task needs to open ``store`` itself, without its credentials (``store_secrets``). In this
    process, ``open_described`` of it is ``store`` from now on (the driver's own, with its credentials).

    :raises InvalidArgument: the store cannot be opened elsewhere (``ObjectStore.descriptor``).
    """
    descriptor = store.descriptor()
    with _lock:
        _opened[_cache_key(descriptor)] = store
    return descriptor


def store_secrets(store: ObjectStore) -> dict[str, str]:
    """``store``'s credentials, for the run's channel to hand its tasks (empty: none, or the AWS chain)."""
    return store.credentials()


def open_described(descriptor: Mapping[str, Any], secrets: Mapping[str, Any] | None = None) -> ObjectStore:
    """The store ``descriptor`` (``describe``) names, with ``secrets`` (``store_secrets``): opened once per
    process for a descriptor, then shared (stores are safe to share between threads; a root's credentials
    are the same for the daemon's life)."""
    cache_key = _cache_key(descriptor)
    with _lock:
        store = _opened.get(cache_key)
        if store is None:
            store = _opened[cache_key] = _open(descriptor, secrets or {})
        return store


def spec_store(spec: Mapping[str, Any], channel: Any = None) -> ObjectStore | None:
    """The store the tasks' ``spec`` names (None: its files are local paths). An S3 root's credentials come
    over the run's channel: ``channel`` (a ``TaskChannel``), or the worker's connection to the spec's run."""
    descriptor = spec.get("store")
    if not descriptor:
        return None
    secrets: Mapping[str, Any] = {}
    if "s3" in descriptor and (spec.get("channel") or channel is not None):
        if channel is None:
            from compactord.engine.channel.task import TaskChannel

            channel = TaskChannel.for_spec(spec)
        secrets = channel.store_secrets if channel is not None else {}
    # A store of the tasks' own, also in the driver (a small run's task read there): its requests are counted
    # for the task (``count_request``) as in a Spark worker, not by the driver's store and its observer.
    return open_described({**descriptor, "opened_by": "task"}, secrets)


def new_output(store: Mapping[str, Any] | None, output: str) -> None:
    """Check that the new ledger's folder ``output`` (a key prefix of the root ``store`` describes, or a local
    path) holds nothing yet, as Spark's writer did: a local one is made.

    :raises FileExistsError: it holds something.
    """
    if store is None:
        Path(output).mkdir()
    elif open_described(store).list(output.rstrip("/") + "/"):
        raise FileExistsError(f"the new ledger's folder {output} holds objects already")


def _cache_key(descriptor: Mapping[str, Any]) -> str:
    return json.dumps(descriptor, sort_keys=True)


def _open(descriptor: Mapping[str, Any], secrets: Mapping[str, Any]) -> ObjectStore:
    # Each request is counted for the task whose thread made it (``task_report.counting_requests``).
    return storage.open_described(descriptor, secrets, observer=lambda op, seconds: count_request(op))
