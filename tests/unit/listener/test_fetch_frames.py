"""Fetch answers written and read without kafka-python's protocol classes (``listener/fetch_frames.py``), against
those classes at every version the listener serves: an answer ``encode_fetch`` writes is the bytes kafka-python
writes for it; one kafka-python writes is read back by ``parse_fetch`` field for field, its record sets byte for
byte; an answer cut short is refused as malformed."""

from __future__ import annotations

from typing import Any

import pytest
from kafka.protocol.api_key import ApiKey
from kafka.protocol.consumer import FetchResponse

from compactord.listener.batches import entries_batches
from compactord.listener.fetch_frames import FetchedPartition, MalformedAnswer, encode_fetch, parse_fetch
from compactord.listener.protocol import SERVED, Request, encode_response, item
from compactord.model import Entry

LOW, HIGH = SERVED[ApiKey.Fetch]
VERSIONS = list(range(LOW, HIGH + 1))
RECORDS = entries_batches([Entry(0, 40, b"k", b"v" * 300, timestamp=7), Entry(0, 41, b"\xff" * 3, None, timestamp=8)])
ANSWER = [
    ("prices", [FetchedPartition(0, 0, 42, 42, 3, None, RECORDS),
                FetchedPartition(3, 0, 42, 40, 0, ((7, 40), (2**40, 41)), RECORDS[:10]),
                FetchedPartition(1, 6)]),  # NOT_LEADER_OR_FOLLOWER: offsets -1, no records
    ("\u00e9t\u00e9", [FetchedPartition(2, 0, 5, 5, 0, (), b"")]),
]


def _by_kafka_python(version: int, correlation_id: int) -> bytes:
    rc = FetchResponse
    topics = [item(rc, "responses", topic=name, partitions=[
        item(rc, "responses.partitions", partition_index=p.partition_index, error_code=p.error_code,
             high_watermark=p.high_watermark, last_stable_offset=p.last_stable_offset,
             log_start_offset=p.log_start_offset, preferred_read_replica=-1, records=p.records,
             aborted_transactions=None if p.aborted_transactions is None else [
                 item(rc, "responses.partitions.aborted_transactions", producer_id=a, first_offset=o)
                 for a, o in p.aborted_transactions])
        for p in partitions]) for name, partitions in ANSWER]
    request = Request(ApiKey.Fetch, version, correlation_id, "test", None)
    return encode_response(request, rc(throttle_time_ms=0, error_code=0, session_id=0, responses=topics))


@pytest.mark.parametrize("version", VERSIONS)
def test_an_answer_is_the_bytes_kafka_python_writes(version: int) -> None:
    assert encode_fetch(version, 12345, ANSWER) == _by_kafka_python(version, 12345)


@pytest.mark.parametrize("version", VERSIONS)
def test_an_answer_kafka_python_writes_is_read_field_for_field(version: int) -> None:
    parsed = parse_fetch(_by_kafka_python(version, 9)[4:], version)

    expected: dict[tuple[str, int], Any] = {(name, p.partition_index): p for name, ps in ANSWER for p in ps}
    if version < 5:  # no log start offset before v5
        expected = {tp: FetchedPartition(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                                         -1, p.aborted_transactions, p.records) for tp, p in expected.items()}
    assert parsed == expected


def test_an_answer_cut_short_is_malformed() -> None:
    frame = _by_kafka_python(HIGH, 9)[4:]
    for cut in (3, 20, len(frame) - 40):
        with pytest.raises(MalformedAnswer):
            parse_fetch(frame[:cut], HIGH)
