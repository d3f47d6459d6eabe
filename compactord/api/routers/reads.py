"""Reads of the current compacted ledger: the horizon, a page of entries, the last entry."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from fastapi import APIRouter, Query

from compactord.api.views import entry_json, horizon_json, page_json
from compactord.errors import EntryNotFound, InvalidArgument, NotCompacted
from compactord.model import Position, validate_topic_name

if TYPE_CHECKING:
    from compactord.daemon.core import Daemon
    from compactord.interfaces import TopicCompactionService

__all__ = ["router"]

Encoding = Literal["base64", "utf8"]


def router(daemon: Daemon) -> APIRouter:
    api = APIRouter()

    @api.get("/v1/topics/{topic}/horizon", tags=["ledger"])
    def horizon(topic: str) -> dict[str, Any]:
        """The compaction horizon: per partition, the last offset the current ledger covers."""
        validate_topic_name(topic)
        manifest = daemon.registry.service(topic).ledger_info()
        if manifest is None:
            raise NotCompacted(topic)
        return horizon_json(topic, manifest)

    @api.get("/v1/topics/{topic}/compacted", tags=["ledger"])
    def compacted(
        topic: str,
        partition: int = Query(..., ge=0, le=2**31 - 1),
        start: int = Query(0, ge=0, le=2**63 - 1),
        limit: int = Query(100, ge=1, le=10000),
        encoding: Encoding = Query("base64"),
        include_markers: bool = Query(False, description="also event-time deletion markers, with event times"),
    ) -> dict[str, Any]:
        """Live entries of one partition with offset >= start, in order, from the current ledger."""
        page = _service_of(daemon, topic, partition).read_compacted_page(
            Position(partition, start), limit, include_markers=include_markers)
        manifest, entries = page.ledger, page.entries
        _check_partition(manifest.horizon, partition)
        more = len(entries) == limit and entries[-1].offset < manifest.horizon[partition]
        return page_json(topic, manifest, entries, encoding, include_markers,
                         next_start=entries[-1].offset + 1 if more else None)

    @api.get("/v1/topics/{topic}/compacted/last", tags=["ledger"])
    def compacted_last(topic: str, partition: int = Query(..., ge=0, le=2**31 - 1),
                       encoding: Encoding = Query("base64")) -> dict[str, Any]:
        """The last live entry of a partition (404 for an empty partition)."""
        page = _service_of(daemon, topic, partition).read_last_compacted_page(partition)
        _check_partition(page.ledger.horizon, partition)
        if not page.entries:
            raise EntryNotFound(f"partition {partition} of topic {topic!r} has no compacted entry")
        return entry_json(page.entries[0], encoding)

    return api


def _service_of(daemon: Daemon, topic: str, partition: int) -> TopicCompactionService:
    """The topic's service, after a cheap check that the partition exists in its current ledger
    (the page's own ledger is checked again: a switch may come in between)."""
    validate_topic_name(topic)
    service = daemon.registry.service(topic)
    manifest = service.ledger_info()
    if manifest is None:
        raise NotCompacted(topic)
    _check_partition(manifest.horizon, partition)
    return service


def _check_partition(horizon: dict[int, int], partition: int) -> None:
    if partition not in horizon:
        raise InvalidArgument(
            f"partition {partition} is not in the ledger; the topic has partitions 0 to {max(horizon, default=-1)}"
        )
