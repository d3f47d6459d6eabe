"""The listener's frames (``listener/protocol.py``), encoded and decoded by kafka-python's own classes, as a
client sends and reads them: ApiVersions advertises exactly what is served and refused (a version past it is
answered as Kafka does), writes are refused naming the listener as read-only, any other request gets an answer,
and bytes that are no request are refused."""

from __future__ import annotations

import struct

import pytest
from kafka.protocol.admin import (
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
)
from kafka.protocol.api_key import ApiKey
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from compactord.listener.protocol import (
    ERRORS,
    READ_ONLY,
    REFUSED,
    SERVED,
    MalformedFrame,
    api_versions,
    decode_request,
    refusal,
    unsupported,
)


def _frame(message: object, version: int) -> bytes:
    message.API_VERSION = version  # type: ignore[attr-defined]
    message.with_header(correlation_id=42, client_id="test")  # type: ignore[attr-defined]
    return bytes(message.encode(header=True, framed=True))[4:]  # type: ignore[attr-defined]


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_api_versions_advertises_what_is_served_and_refused(version: int) -> None:
    request = ApiVersionsRequest(client_software_name="librdkafka", client_software_version="2.16.1")
    answer = ApiVersionsResponse.decode(api_versions(decode_request(_frame(request, version))), version=version,
                                        header=True, framed=True)

    assert answer.error_code == 0 and answer.header.correlation_id == 42
    assert {a.api_key: (a.min_version, a.max_version) for a in answer.api_keys} == {
        int(k): v for k, v in {**SERVED, **REFUSED}.items()}


def test_an_api_versions_version_past_the_served_ones_is_answered_in_v0_with_the_versions() -> None:
    frame = bytearray(_frame(ApiVersionsRequest(), 0))
    frame[2:4] = struct.pack(">h", 9)

    answer = ApiVersionsResponse.decode(api_versions(decode_request(bytes(frame))), version=0, header=True,
                                        framed=True)

    assert answer.error_code == ERRORS["UNSUPPORTED_VERSION"]
    assert (int(ApiKey.ApiVersions), 0, 4) in {(a.api_key, a.min_version, a.max_version) for a in answer.api_keys}


def test_a_produce_is_refused_per_partition_naming_the_listener_as_read_only() -> None:
    request = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=1000, topic_data=[
        ProduceRequest.TopicProduceData(name="prices", partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=p, records=b"") for p in (0, 1)])])

    answer = ProduceResponse.decode(refusal(decode_request(_frame(request, 9))), version=9, header=True, framed=True)

    [topic] = answer.responses
    assert topic.name == "prices"
    assert [(p.index, p.error_code, p.error_message) for p in topic.partition_responses] == [
        (0, ERRORS["TOPIC_AUTHORIZATION_FAILED"], READ_ONLY), (1, ERRORS["TOPIC_AUTHORIZATION_FAILED"], READ_ONLY)]


def test_a_topic_creation_is_a_policy_violation() -> None:
    request = CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
        name="new", num_partitions=1, replication_factor=1, assignments=[], configs=[])], timeout_ms=1000,
        validate_only=False)

    answer = CreateTopicsResponse.decode(refusal(decode_request(_frame(request, 7))), version=7, header=True,
                                         framed=True)

    assert [(t.name, t.error_code, t.error_message) for t in answer.topics] == [
        ("new", ERRORS["POLICY_VIOLATION"], READ_ONLY)]


def test_a_request_not_served_is_answered_unsupported() -> None:
    request = decode_request(_frame(DescribeConfigsRequest(resources=[], include_synonyms=False,
                                                           include_documentation=False), 4))
    assert request.body is None  # not decoded: only answered

    answer = DescribeConfigsResponse.decode(unsupported(request), version=4, header=True, framed=True)

    assert answer.header.correlation_id == 42 and answer.results == []


def test_an_unknown_api_gets_its_correlation_id_and_unsupported_version() -> None:
    request = decode_request(struct.pack(">hhi", 999, 0, 7) + b"\x00\x00")

    assert unsupported(request) == struct.pack(">iih", 6, 7, ERRORS["UNSUPPORTED_VERSION"])


@pytest.mark.parametrize("frame", [b"\x00\x12", struct.pack(">hhi", int(ApiKey.Fetch), 12, 1) + b"\xff" * 5],
                         ids=["short", "undecodable"])
def test_bytes_that_are_no_request_are_refused(frame: bytes) -> None:
    with pytest.raises(MalformedFrame):
        decode_request(frame)
