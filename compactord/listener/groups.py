"""Consumer groups through the listener: FindCoordinator names the listener itself, and every group request
(JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, DescribeGroups, ListGroups) is relayed
as it is to the group's coordinator on the real broker, so offsets are committed on the broker, as the topic's
own offsets.

The coordinator holds a JoinGroup (and a SyncGroup) until the group's rebalance is done, and a broker answers a
connection's requests one after another: on a connection shared by every client, one member's JoinGroup would hold
the other members' heartbeats, whose group waits for them. So each client connection gets a connection of its own
to each coordinator it uses, opened by its first group request and closed with it: the coordinator sees the
client's requests in the order the client sent them, as if the client were connected to it.
"""

from __future__ import annotations

import logging
from typing import Any

from kafka.protocol.api_key import ApiKey

from compactord.errors import BrokerUnavailable
from compactord.listener.protocol import ERRORS, Request, encode_response, item
from compactord.listener.relay import BrokerRelay, Link

__all__ = ["GroupLinks", "GroupRelay", "failure"]

log = logging.getLogger(__name__)

# Added to a rebalance's timeout for the wait of a JoinGroup or a SyncGroup on the coordinator.
_REBALANCE_MARGIN_S = 5.0
_GROUP = 0


class GroupLinks:
    """One client connection's connections to group coordinators, closed with it."""

    def __init__(self) -> None:
        self.links: dict[tuple[str, int], Link] = {}
        self.rebalance_s = 0.0

    def close(self) -> None:
        for link in self.links.values():
            link.close()
        self.links.clear()


class GroupRelay:
    def __init__(self, relay: BrokerRelay) -> None:
        self._relay = relay

    async def answer(self, request: Request, links: GroupLinks, host: str, port: int) -> bytes:
        if request.api_key == ApiKey.FindCoordinator:
            return self._find_coordinator(request, host, port)
        group = _group(request)
        try:
            address = await self._relay.coordinator(group) if group is not None else self._relay.any_node()
        except BrokerUnavailable as exc:
            log.warning("Kafka listener: no coordinator of group %r: %s", group, exc)
            return failure(request, ERRORS["COORDINATOR_NOT_AVAILABLE"])
        timeout_s = self._relay.timeout_s
        if request.api_key == ApiKey.JoinGroup:
            links.rebalance_s = max(request.body.rebalance_timeout_ms, request.body.session_timeout_ms) / 1000
        if request.api_key in (ApiKey.JoinGroup, ApiKey.SyncGroup):
            timeout_s = max(timeout_s, links.rebalance_s + _REBALANCE_MARGIN_S)
        link = links.links.get(address)
        if link is None:
            link = links.links[address] = self._relay.new_link(address)
        try:
            return await link.relay(request.frame, timeout_s)
        except BrokerUnavailable as exc:
            log.warning("Kafka listener: %s of group %r not relayed: %s", request.api_name, group, exc)
            links.links.pop(address).close()
            if group is not None:
                self._relay.forget_coordinator(group)
            return failure(request, ERRORS["COORDINATOR_NOT_AVAILABLE"])

    def _find_coordinator(self, request: Request, host: str, port: int) -> bytes:
        """The listener as every group's coordinator. A client asks again after its coordinator failed it, so the
        broker is asked again too; a transaction's coordinator is refused (the listener takes no writes)."""
        body, rc = request.body, request.response_class
        keys = [body.key] if request.version < 4 else list(body.coordinator_keys)
        errors = {}
        for key in keys:
            if body.key_type == _GROUP:
                self._relay.forget_coordinator(key)
                errors[key] = 0
            else:
                errors[key] = ERRORS["TRANSACTIONAL_ID_AUTHORIZATION_FAILED"]
        if request.version < 4:
            error = errors[body.key]
            response = rc(throttle_time_ms=0, error_code=error, error_message=None, node_id=0 if not error else -1,
                          host=host if not error else "", port=port if not error else -1)
        else:
            response = rc(throttle_time_ms=0, coordinators=[
                item(rc, "coordinators", key=key, node_id=0 if not error else -1, host=host if not error else "",
                     port=port if not error else -1, error_code=error, error_message=None)
                for key, error in errors.items()])
        return encode_response(request, response)


def _group(request: Request) -> str | None:
    """The group a request is for (the first one for DescribeGroups); None for ListGroups."""
    if request.api_key == ApiKey.ListGroups:
        return None
    if request.api_key == ApiKey.DescribeGroups:
        return request.body.groups[0] if request.body.groups else ""
    group: str = request.body.group_id
    return group


def failure(request: Request, error: int) -> bytes:
    """A group request's answer that carries ``error`` alone, for every item it names (a client retries
    ``COORDINATOR_NOT_AVAILABLE`` after asking for the coordinator again)."""
    body, rc = request.body, request.response_class
    key = ApiKey(request.api_key)
    if key == ApiKey.OffsetCommit:
        response = rc(throttle_time_ms=0, topics=[item(rc, "topics", name=t.name, partitions=[
            item(rc, "topics.partitions", partition_index=p.partition_index, error_code=error)
            for p in t.partitions]) for t in body.topics])
    elif key == ApiKey.OffsetFetch:
        response = rc(throttle_time_ms=0, error_code=error, topics=[item(rc, "topics", name=t.name, partitions=[
            item(rc, "topics.partitions", partition_index=p, committed_offset=-1, metadata="", error_code=error)
            for p in t.partition_indexes]) for t in body.topics or ()])
    elif key == ApiKey.DescribeGroups:
        response = rc(throttle_time_ms=0, groups=[item(rc, "groups", error_code=error, group_id=g, group_state="",
                                                      protocol_type="", protocol_data="", members=[])
                                                 for g in body.groups])
    else:
        fields: dict[str, Any] = {"error_code": error, "throttle_time_ms": 0}
        if key == ApiKey.ListGroups:
            fields["groups"] = []
        response = rc(**fields)
    return encode_response(request, response)
