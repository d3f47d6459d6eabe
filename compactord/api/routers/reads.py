"""Reads of the compacted ledger (the current one, or one pinned by id): the horizon, a page of entries,
the last entry. The log starts come from the monitor; the topic's identity is checked against what the
broker says of it, at most a second old (``daemon/identity.py``; a broker that cannot be asked leaves the
last answer, and the response says so). A name with no state here is looked up, for a 404 that says
whether the broker has it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from fastapi import APIRouter, Depends, Query, Response
from fastapi.responses import JSONResponse

from compactord.api.limits import read_slots
from compactord.api.models import Entry, Horizon, Page
from compactord.api.schema import LEDGER, TopicName, errors
from compactord.api.views import entry_json, horizon_json, page_json
from compactord.errors import EntryNotFound, InvalidArgument, NotCompacted
from compactord.model import LedgerManifest, Position

if TYPE_CHECKING:
    from compactord.daemon.core import Daemon
    from compactord.interfaces import TopicCompactionService

__all__ = ["router"]

Encoding = Literal["base64", "utf8"]
# A read pinned to one ledger (CompactedReader pins the ledger of its first page): readable while current
# and for compactionRetiredLedgerGraceSeconds after a switch replaced it, then 410 ledger_retired.
_PIN = Query(None, ge=0, le=2**63 - 1, description="read this ledger (410 ledger_retired once it is gone)")


def router(daemon: Daemon, store_answers: Any) -> APIRouter:
    """``store_answers``: the dependency that answers 503 at once while the store is known to be down."""
    api = APIRouter(dependencies=[store_answers])  # before the read slot: a refusal waits for nothing
    max_bytes = daemon.settings.http_read_max_bytes
    # The pages are rendered to JSON here, in the pool's thread that read them (a ``JSONResponse``, not a
    # dict that FastAPI would validate and encode on the event loop, which answers the probes). The read
    # slot is given back before the answer is sent (scope="function"): a slow client holds none.
    read_slot = [Depends(read_slots(), scope="function")]

    @api.get("/v1/topics/{topic}/horizon", tags=["ledger"], response_model=Horizon, responses=errors(*LEDGER))
    def horizon(response: Response, topic: TopicName, ledger_id: int | None = _PIN) -> dict[str, Any]:
        """The compaction horizon: per partition, the last offset the ledger covers, the rules it was
        written under (strategy, event-time source, empty-value and null-key rules) and the identity of
        the log it was made of (topic id, log starts)."""
        manifest = _service(daemon, topic).ledger_info(ledger_id)
        if manifest is None:
            raise NotCompacted(topic)
        response.headers.update(_check_log(daemon, topic, manifest))
        return horizon_json(topic, manifest)

    # A page (up to httpReadMaxBytes of entries) is answered as the JSONResponse built here, not checked
    # entry by entry against ``Page``: the model describes it in the OpenAPI document only.
    @api.get("/v1/topics/{topic}/compacted", tags=["ledger"], dependencies=read_slot, response_model=None,
             responses={200: {"model": Page, "description": "a page of entries"}, **errors(*LEDGER)})
    def compacted(
        topic: TopicName,
        partition: int = Query(..., ge=0, le=2**31 - 1),
        start: int = Query(0, ge=0, le=2**63 - 1),
        limit: int = Query(100, ge=1, le=10000),
        encoding: Encoding = Query("base64"),
        include_markers: bool = Query(False, description="also the deletion markers the ledger keeps for "
                                      "compactionTombstoneRetentionMs, with event times"),
        ledger_id: int | None = _PIN,
    ) -> JSONResponse:
        """Live entries of one partition with offset >= start, in order, from the current ledger (or the
        pinned one). Entries below the partition's log start (retention) are not readable. A page holds
        at most ``limit`` entries and httpReadMaxBytes of keys, values and headers (at least one entry);
        ``next_start`` is where the next page starts, null at the end."""
        start = max(start, daemon.monitor.log_starts(topic).get(partition, 0))
        page = _service_of(daemon, topic, partition, ledger_id).read_compacted_page(
            Position(partition, start), limit, include_markers=include_markers, ledger_id=ledger_id,
            max_bytes=max_bytes)
        manifest, entries = page.ledger, page.entries
        _check_partition(manifest.horizon, partition)
        checked = _check_log(daemon, topic, manifest)
        more = (len(entries) == limit or page.truncated) and bool(entries) \
            and entries[-1].offset < manifest.horizon[partition]
        return JSONResponse(page_json(topic, manifest, entries, encoding, include_markers,
                                      next_start=entries[-1].offset + 1 if more else None), headers=checked)

    @api.get("/v1/topics/{topic}/compacted/last", tags=["ledger"], dependencies=read_slot,
             response_model=Entry, responses=errors(*LEDGER))
    def compacted_last(topic: TopicName, partition: int = Query(..., ge=0, le=2**31 - 1),
                       encoding: Encoding = Query("base64"), ledger_id: int | None = _PIN) -> JSONResponse:
        """The last live entry of a partition (404 for an empty partition, or one whose entries all
        lie below its log start)."""
        page = _service_of(daemon, topic, partition, ledger_id).read_last_compacted_page(partition, ledger_id)
        _check_partition(page.ledger.horizon, partition)
        checked = _check_log(daemon, topic, page.ledger)
        log_start = daemon.monitor.log_starts(topic).get(partition, 0)
        if not page.entries or page.entries[0].offset < log_start:
            raise EntryNotFound(f"partition {partition} of topic {topic!r} has no compacted entry")
        return JSONResponse(entry_json(page.entries[0], encoding), headers=checked)

    return api


def _service_of(daemon: Daemon, topic: str, partition: int, ledger_id: int | None) -> TopicCompactionService:
    """The topic's service, after a cheap check that the partition exists in its current (or pinned)
    ledger (the page's own ledger is checked again: a switch may come in between)."""
    service = _service(daemon, topic)
    manifest = service.ledger_info(ledger_id)
    if manifest is None:
        raise NotCompacted(topic)
    _check_partition(manifest.horizon, partition)
    return service


def _service(daemon: Daemon, topic: str) -> TopicCompactionService:
    """:raises NotCompacted: the topic has no state at all (nothing is kept for its name). :raises
    TopicNotFound: nor does the broker have it (not asked while it is known to be down)."""
    service = daemon.registry.existing_service(topic)
    if service is None:
        if daemon.health.broker_problem() is None:
            daemon.topics.require_topic(topic)
        raise NotCompacted(topic)
    return service


def _check_log(daemon: Daemon, topic: str, manifest: LedgerManifest) -> dict[str, str]:
    """The headers that say how the check was made (none when the broker's answer was fresh).

    :raises TopicRecreated: the broker's topic is not the one the ledger was made of."""
    return daemon.identities.check(topic, manifest).headers()


def _check_partition(horizon: dict[int, int], partition: int) -> None:
    if partition not in horizon:
        raise InvalidArgument(
            f"partition {partition} is not in the ledger; the topic has partitions 0 to {max(horizon, default=-1)}"
        )
