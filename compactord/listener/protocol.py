"""Frames in, frames out: a request's header and body decoded, a response encoded, with kafka-python's protocol
classes (``kafka.protocol``: every API's request and response by version, flexible versions included). No I/O
here; ``listener/server.py`` reads and writes the frames.

What the listener serves is ``SERVED``: the versions it advertises in ApiVersions and answers. The writes
(``REFUSED``) are advertised too, so that a client sends them and gets the protocol's refusal with a message that
names the listener as read-only; any other request is answered ``UNSUPPORTED_VERSION`` (never a dropped
connection), with the response at the request's version where kafka-python knows it.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kafka.protocol.admin as admin_api
import kafka.protocol.consumer as consumer_api
import kafka.protocol.metadata as metadata_api
import kafka.protocol.producer as producer_api
import kafka.protocol.sasl as sasl_api
from kafka.protocol.api_header import RequestHeader
from kafka.protocol.api_key import ApiKey

__all__ = ["ERRORS", "GROUPS", "READ_ONLY", "REFUSED", "SASL", "SERVED", "MalformedFrame", "Request", "api_versions",
           "decode_request", "encode_response", "item", "refusal", "refusal_error", "unsupported"]

# The protocol's error codes the listener answers (Kafka's ``Errors``).
ERRORS = {"NONE": 0, "OFFSET_OUT_OF_RANGE": 1, "UNKNOWN_TOPIC_OR_PARTITION": 3, "LEADER_NOT_AVAILABLE": 5,
          "NOT_LEADER_OR_FOLLOWER": 6, "COORDINATOR_NOT_AVAILABLE": 15, "UNSUPPORTED_VERSION": 35, "TOPIC_AUTHORIZATION_FAILED": 29,
          "CLUSTER_AUTHORIZATION_FAILED": 31, "POLICY_VIOLATION": 44, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": 53,
          "UNSUPPORTED_SASL_MECHANISM": 33, "ILLEGAL_SASL_STATE": 34, "KAFKA_STORAGE_ERROR": 56,
          "SASL_AUTHENTICATION_FAILED": 58,
          "UNKNOWN_SERVER_ERROR": -1}
READ_ONLY = "compactord's Kafka listener is read-only: it serves the compacted view and the live log, never a write"

# What the listener serves: the versions every current client negotiates (librdkafka 2.x, the Java client,
# kafka-python), each one decoded and answered by kafka-python's class. Fetch stops at v12: v13 names topics by
# id only.
SERVED: dict[ApiKey, tuple[int, int]] = {
    ApiKey.ApiVersions: (0, 4),
    ApiKey.Metadata: (0, 12),
    ApiKey.ListOffsets: (1, 7),
    ApiKey.Fetch: (4, 12),
}
# The consumer groups' APIs, served (``listener/groups.py``): the versions current clients negotiate that Kafka 4
# and the test broker both answer. OffsetFetch stops at v7: v8 asks for several groups in one request, which may
# have several coordinators.
GROUPS: dict[ApiKey, tuple[int, int]] = {
    ApiKey.FindCoordinator: (0, 6),
    ApiKey.JoinGroup: (2, 9),
    ApiKey.SyncGroup: (0, 5),
    ApiKey.Heartbeat: (0, 4),
    ApiKey.LeaveGroup: (0, 5),
    ApiKey.OffsetCommit: (2, 9),
    ApiKey.OffsetFetch: (1, 7),
    ApiKey.DescribeGroups: (0, 5),
    ApiKey.ListGroups: (0, 5),
}
SERVED.update(GROUPS)
# SASL/PLAIN's exchange (``listener/auth.py``), advertised on every listener as Kafka does; on a listener that takes
# no password it is answered ILLEGAL_SASL_STATE.
SASL: dict[ApiKey, tuple[int, int]] = {
    ApiKey.SaslHandshake: (0, 1),
    ApiKey.SaslAuthenticate: (0, 2),
}
SERVED.update(SASL)
# Advertised, and always refused (``refusal``): the writes a client may try.
REFUSED: dict[ApiKey, tuple[int, int]] = {
    ApiKey.Produce: (3, 9),
    ApiKey.CreateTopics: (2, 7),
    ApiKey.DeleteTopics: (1, 6),
    ApiKey.CreatePartitions: (0, 3),
    ApiKey.DeleteRecords: (0, 2),
    ApiKey.AlterConfigs: (0, 2),
    ApiKey.IncrementalAlterConfigs: (0, 1),
    ApiKey.CreateAcls: (1, 3),
    ApiKey.DeleteAcls: (1, 3),
    ApiKey.InitProducerId: (0, 4),
}

# Every request and response class kafka-python has, by API key (SaslBytesRequest, v0's bare token, is no API).
_CLASSES: dict[int, tuple[Any, Any]] = {}
for _module in (admin_api, consumer_api, metadata_api, producer_api, sasl_api):
    for _name in _module.__all__:
        _cls = getattr(_module, _name)
        if _name.endswith("Request") and hasattr(_module, _name[:-7] + "Response") and hasattr(_cls, "API_KEY"):
            _CLASSES[_cls.API_KEY] = (_cls, getattr(_module, _name[:-7] + "Response"))

_HEAD = struct.Struct(">hhi")  # api key, api version, correlation id: the part of every request header


class MalformedFrame(ValueError):
    """A frame that is no request of the protocol: the connection it came on is closed."""


@dataclass(frozen=True, slots=True)
class Request:
    """One decoded request; ``body`` is None for an API or a version the listener does not decode."""

    api_key: int
    version: int
    correlation_id: int
    client_id: str | None
    body: Any
    frame: bytes = b""  # as it came, without its size prefix: what a relayed request sends on

    @property
    def api_name(self) -> str:
        try:
            return ApiKey(self.api_key).name
        except ValueError:
            return f"api {self.api_key}"

    @property
    def response_class(self) -> Any:
        return _CLASSES[self.api_key][1] if self.api_key in _CLASSES else None


def _advertised(api_key: int) -> tuple[int, int] | None:
    try:
        key = ApiKey(api_key)
    except ValueError:
        return None
    return SERVED.get(key) or REFUSED.get(key)


def decode_request(frame: bytes) -> Request:
    """A request frame (its size prefix taken off) decoded: its header always, its body when the API and version
    are advertised.

    :raises MalformedFrame: the frame is shorter than a header, or its body does not decode.
    """
    if len(frame) < _HEAD.size:
        raise MalformedFrame(f"a frame of {len(frame)} bytes holds no request header")
    api_key, version, correlation_id = _HEAD.unpack_from(frame)
    advertised = _advertised(api_key)
    if advertised is None or not advertised[0] <= version <= advertised[1]:
        # Not decoded: only the header's fixed part is needed to answer it.
        return Request(api_key, version, correlation_id, None, None)
    request_class = _CLASSES[api_key][0]
    data = io.BytesIO(frame)
    try:
        header = RequestHeader.decode(data, flexible=request_class.flexible_version_q(version))
        body = request_class.decode(frame[data.tell():], version=version)
    except Exception as exc:
        raise MalformedFrame(f"{ApiKey(api_key).name} v{version} does not decode: {exc!r}") from exc
    return Request(api_key, version, correlation_id, header.client_id, body, frame)


def encode_response(request: Request, response: Any) -> bytes:
    """``response`` (a response class's instance, at the request's version) framed, with the request's
    correlation id."""
    response.API_VERSION = request.version  # before the header: kafka-python's setter would write it into one
    response.with_header(correlation_id=request.correlation_id)
    return bytes(response.encode(header=True, framed=True))


def item(message: Any, path: str, **values: Any) -> Any:
    """An element of the array (or struct) at ``path`` (field names joined by dots) of the message class
    ``message``: its fields not given take the schema's defaults when encoded."""
    struct_field: Any = message._struct
    for name in path.split("."):
        struct_field = struct_field.fields[name]
    return struct_field.data_class(**values)


def api_versions(request: Request) -> bytes:
    """ApiVersions: exactly what ``SERVED`` and ``REFUSED`` hold; a version past those answered as Kafka does
    (v0 with ``UNSUPPORTED_VERSION`` and the versions allowed, for the client to ask again)."""
    response_class = _CLASSES[ApiKey.ApiVersions][1]
    low, high = SERVED[ApiKey.ApiVersions]
    error, version = 0, request.version
    if not low <= version <= high:
        error, version = ERRORS["UNSUPPORTED_VERSION"], 0
    keys = [item(response_class, "api_keys", api_key=int(key), min_version=lo, max_version=hi)
            for key, (lo, hi) in sorted({**SERVED, **REFUSED}.items())]
    response = response_class(error_code=error, api_keys=keys, throttle_time_ms=0)
    answered = Request(request.api_key, version, request.correlation_id, request.client_id, None)
    return encode_response(answered, response)


def _refusals() -> dict[ApiKey, Callable[[Any, Any, int, str], Any]]:
    """Per write API: its response to ``request`` with every item it names refused with ``error``."""
    def produce(rc: Any, rq: Any, error: int, message: str) -> Any:
        return rc(throttle_time_ms=0, responses=[item(rc, "responses", name=t.name, partition_responses=[
            item(rc, "responses.partition_responses", index=p.index, error_code=error, base_offset=-1,
                 error_message=message) for p in t.partition_data]) for t in rq.topic_data])

    def create_topics(rc: Any, rq: Any, error: int, message: str) -> Any:
        return rc(throttle_time_ms=0, topics=[item(rc, "topics", name=t.name, error_code=error, error_message=message,
                                                   num_partitions=-1, replication_factor=-1) for t in rq.topics])

    def delete_topics(rc: Any, rq: Any, error: int, message: str) -> Any:
        names = [t.name for t in rq.topics] if rq.topics else list(rq.topic_names or ())
        return rc(throttle_time_ms=0, responses=[item(rc, "responses", name=n, error_code=error, error_message=message)
                                                 for n in names])

    def create_partitions(rc: Any, rq: Any, error: int, message: str) -> Any:
        return rc(throttle_time_ms=0, results=[item(rc, "results", name=t.name, error_code=error,
                                                    error_message=message) for t in rq.topics])

    def delete_records(rc: Any, rq: Any, error: int, message: str) -> Any:
        return rc(throttle_time_ms=0, topics=[item(rc, "topics", name=t.name, partitions=[
            item(rc, "topics.partitions", partition_index=p.partition_index, low_watermark=-1, error_code=error)
            for p in t.partitions]) for t in rq.topics])

    def alter_configs(rc: Any, rq: Any, error: int, message: str) -> Any:
        return rc(throttle_time_ms=0, responses=[item(rc, "responses", error_code=error, error_message=message,
                                                      resource_type=r.resource_type, resource_name=r.resource_name)
                                                 for r in rq.resources])

    def create_acls(rc: Any, rq: Any, error: int, message: str) -> Any:
        return rc(throttle_time_ms=0, results=[item(rc, "results", error_code=error, error_message=message)
                                               for _ in rq.creations])

    def delete_acls(rc: Any, rq: Any, error: int, message: str) -> Any:
        return rc(throttle_time_ms=0, filter_results=[item(rc, "filter_results", error_code=error,
                                                           error_message=message, matching_acls=[])
                                                      for _ in rq.filters])

    def init_producer_id(rc: Any, rq: Any, error: int, message: str) -> Any:
        return rc(throttle_time_ms=0, error_code=error, producer_id=-1, producer_epoch=-1)

    return {ApiKey.Produce: produce, ApiKey.CreateTopics: create_topics, ApiKey.DeleteTopics: delete_topics,
            ApiKey.CreatePartitions: create_partitions, ApiKey.DeleteRecords: delete_records,
            ApiKey.AlterConfigs: alter_configs, ApiKey.IncrementalAlterConfigs: alter_configs,
            ApiKey.CreateAcls: create_acls, ApiKey.DeleteAcls: delete_acls, ApiKey.InitProducerId: init_producer_id}


_REFUSALS = _refusals()
# The error each write is refused with: the one a client reports as "not allowed", not one it retries.
_REFUSAL_ERRORS = {ApiKey.Produce: "TOPIC_AUTHORIZATION_FAILED", ApiKey.DeleteRecords: "TOPIC_AUTHORIZATION_FAILED",
                   ApiKey.CreateAcls: "CLUSTER_AUTHORIZATION_FAILED", ApiKey.DeleteAcls: "CLUSTER_AUTHORIZATION_FAILED",
                   ApiKey.InitProducerId: "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"}


def refusal_error(request: Request) -> str:
    """The name of the error a write (``REFUSED``) is refused with."""
    return _REFUSAL_ERRORS.get(ApiKey(request.api_key), "POLICY_VIOLATION")


def refusal(request: Request) -> bytes:
    """The answer to a write (``REFUSED``): every topic, partition or resource it names refused."""
    key = ApiKey(request.api_key)
    error = ERRORS[refusal_error(request)]
    return encode_response(request, _REFUSALS[key](request.response_class, request.body, error, READ_ONLY))


def unsupported(request: Request) -> bytes:
    """The answer to a request the listener does not serve: its response with ``UNSUPPORTED_VERSION`` in its
    top-level error code and no items, at the request's version where kafka-python knows that version; else the
    header and the error code alone (what a client that sent a version it was not offered can parse of it)."""
    error = ERRORS["UNSUPPORTED_VERSION"]
    response_class = request.response_class
    if response_class is not None and 0 <= request.version <= response_class.max_version:
        fields = response_class[request.version]._struct.fields
        response = response_class(**({"error_code": error} if "error_code" in fields else {}))
        try:
            return encode_response(request, response)
        except Exception:  # noqa: BLE001,S110 (a response whose required fields have no default: the short form)
            pass
    body = struct.pack(">ih", request.correlation_id, error)
    return struct.pack(">i", len(body)) + body
