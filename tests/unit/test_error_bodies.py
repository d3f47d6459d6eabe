"""What an error body says: a client error its own message, a server error a fixed text for its code
(ledger paths, broker addresses and exception texts stay in the log)."""

from __future__ import annotations

import json

import pytest

from compactord.api.views import error_response, problem_response, public_message
from compactord.errors import BrokerUnavailable, InvalidArgument, LedgerCorrupt, NotReady, StorageUnavailable

SECRETS = ("/var/lib/compactord", "kafka-0.internal:9092", "JSONDecodeError")


def body(response) -> dict:  # type: ignore[no-untyped-def]
    return json.loads(response.body)


@pytest.mark.parametrize("error", [
    LedgerCorrupt("manifest /var/lib/compactord/t/ledger-3/manifest.json is unparseable: JSONDecodeError('x')"),
    BrokerUnavailable("the Kafka broker at kafka-0.internal:9092 is unreachable (KafkaConnectionError: ...)"),
])
def test_a_server_error_answers_its_code_s_fixed_text(error) -> None:  # type: ignore[no-untyped-def]
    answer = body(error_response(error))
    assert answer["error"] == error.code and answer["message"]
    assert not any(secret in answer["message"] for secret in SECRETS), answer


def test_an_unexpected_error_answers_a_generic_text() -> None:
    answer = body(problem_response(500, "internal_error", "KeyError: '/var/lib/compactord/t/CURRENT'"))
    assert answer == {"error": "internal_error",
                      "message": "the daemon could not answer this request; details are in the daemon's log"}


def test_client_errors_and_probe_answers_keep_their_message() -> None:
    assert body(error_response(InvalidArgument("limit must be positive, got: 0")))["message"] == (
        "limit must be positive, got: 0")
    assert public_message(NotReady.status, NotReady.code, "the broker does not answer") == (
        "the broker does not answer")


def test_a_server_error_raised_public_answers_its_own_message() -> None:
    # A refusal built from fixed phrases, numbers and config values (the lease's, at a trigger).
    message = "the ledger root's lease has not been renewed for 4.0 s (storageLeaseSeconds=5): no compaction starts"
    assert body(error_response(StorageUnavailable(message, public=True))) == {
        "error": "storage_unavailable", "message": message}
    assert body(error_response(StorageUnavailable(message)))["message"] != message  # the code's fixed text
