"""The consumer groups' answers the listener gives itself (``listener/groups.py``), read by kafka-python's own
classes as a client reads them: FindCoordinator names the listener, and a group request whose coordinator does
not answer gets ``COORDINATOR_NOT_AVAILABLE`` for everything it names (a client retries it)."""

from __future__ import annotations

import asyncio

import pytest
from kafka.protocol.admin import DescribeGroupsRequest, DescribeGroupsResponse
from kafka.protocol.consumer import (
    HeartbeatRequest,
    HeartbeatResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from compactord.listener.groups import GroupLinks, GroupRelay, failure
from compactord.listener.protocol import ERRORS, GROUPS, SERVED, decode_request, item
from compactord.listener.relay import BrokerRelay

from .test_protocol import _frame

UNAVAILABLE = ERRORS["COORDINATOR_NOT_AVAILABLE"]


def test_the_group_requests_are_advertised() -> None:
    assert GROUPS.items() <= SERVED.items()


@pytest.mark.parametrize("version", [0, 3, 4, 6])
def test_find_coordinator_names_the_listener(version: int) -> None:
    request = decode_request(_frame(FindCoordinatorRequest(key="g", key_type=0, coordinator_keys=["g"]), version))
    relay = BrokerRelay("127.0.0.1:1", "test", 1.0)  # never reached: the listener answers alone

    answer = FindCoordinatorResponse.decode(
        asyncio.run(GroupRelay(relay).answer(request, GroupLinks(), "listener.example", 9092)),
        version=version, header=True, framed=True)

    if version < 4:
        assert (answer.error_code, answer.node_id, answer.host, answer.port) == (0, 0, "listener.example", 9092)
    else:
        [coordinator] = answer.coordinators
        assert (coordinator.key, coordinator.error_code, coordinator.node_id, coordinator.host,
                coordinator.port) == ("g", 0, 0, "listener.example", 9092)


def test_a_group_request_whose_coordinator_is_unreachable_is_retried() -> None:
    request = decode_request(_frame(HeartbeatRequest(group_id="g", generation_id=1, member_id="m",
                                                     group_instance_id=None), 4))
    relay = BrokerRelay("127.0.0.1:1", "test", 1.0)  # nothing listens on port 1

    answer = HeartbeatResponse.decode(asyncio.run(GroupRelay(relay).answer(request, GroupLinks(), "h", 1)),
                                      version=4, header=True, framed=True)

    assert answer.header.correlation_id == 42 and answer.error_code == UNAVAILABLE


def test_a_failed_offset_commit_names_each_partition() -> None:
    rq = OffsetCommitRequest
    request = decode_request(_frame(rq(group_id="g", generation_id_or_member_epoch=1, member_id="m",
                                       group_instance_id=None, retention_time_ms=-1, topics=[
        item(rq, "topics", name="t", partitions=[item(rq, "topics.partitions", partition_index=p, committed_offset=5,
                                                      committed_leader_epoch=-1, committed_metadata="")
                                                 for p in (0, 1)])]), 8))

    answer = OffsetCommitResponse.decode(failure(request, UNAVAILABLE), version=8, header=True, framed=True)

    assert [(t.name, [(p.partition_index, p.error_code) for p in t.partitions]) for t in answer.topics] == \
        [("t", [(0, UNAVAILABLE), (1, UNAVAILABLE)])]


@pytest.mark.parametrize("version", [1, 7])
def test_a_failed_offset_fetch_names_each_partition(version: int) -> None:
    rq = OffsetFetchRequest
    request = decode_request(_frame(rq(group_id="g", topics=[item(rq, "topics", name="t", partition_indexes=[0])],
                                       require_stable=False), version))

    answer = OffsetFetchResponse.decode(failure(request, UNAVAILABLE), version=version, header=True, framed=True)

    assert [(p.partition_index, p.committed_offset, p.error_code) for p in answer.topics[0].partitions] == \
        [(0, -1, UNAVAILABLE)]


def test_a_failed_describe_groups_names_each_group() -> None:
    request = decode_request(_frame(DescribeGroupsRequest(groups=["a", "b"], include_authorized_operations=False), 5))

    answer = DescribeGroupsResponse.decode(failure(request, UNAVAILABLE), version=5, header=True, framed=True)

    assert [(g.group_id, g.error_code) for g in answer.groups] == [("a", UNAVAILABLE), ("b", UNAVAILABLE)]
