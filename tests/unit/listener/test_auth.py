"""SASL/PLAIN on the listener (``listener/auth.py``), with frames encoded and decoded by kafka-python's own
classes as a client sends and reads them: the token as the password with any user name, SaslHandshake v1 then
SaslAuthenticate, v0's bare token, a wrong password and an unknown mechanism answered then closed, any other
request before authentication closed, and the SASL requests on a listener that takes no password answered
ILLEGAL_SASL_STATE."""

from __future__ import annotations

import struct

import pytest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from compactord.listener.auth import Authentication, Passwords
from compactord.listener.protocol import ERRORS, decode_request

TOKEN, READ_TOKEN = "admin-s3cret", "read-s3cret"


def _request(message: object, version: int) -> object:
    message.API_VERSION = version  # type: ignore[attr-defined]
    message.with_header(correlation_id=7, client_id="test")  # type: ignore[attr-defined]
    return decode_request(bytes(message.encode(header=True, framed=True))[4:])  # type: ignore[attr-defined]


def _auth() -> Authentication:
    return Authentication(Passwords([TOKEN, READ_TOKEN, ""]))


def _handshake(auth: Authentication, version: int, mechanism: str = "PLAIN") -> object:
    outcome = auth.answer(_request(SaslHandshakeRequest(mechanism=mechanism), version))  # type: ignore[arg-type]
    return outcome, SaslHandshakeResponse.decode(outcome.answer, version=version, header=True, framed=True)


def _authenticate(auth: Authentication, token: bytes, version: int = 2) -> object:
    outcome = auth.answer(_request(SaslAuthenticateRequest(auth_bytes=token), version))  # type: ignore[arg-type]
    return outcome, SaslAuthenticateResponse.decode(outcome.answer, version=version, header=True, framed=True)


@pytest.mark.parametrize("password", [f"token:{TOKEN}", f"token:{READ_TOKEN}"])
@pytest.mark.parametrize("version", [0, 1, 2])
def test_either_token_is_the_password_of_any_user(password: str, version: int) -> None:
    auth = _auth()
    assert auth.refusal(_request(ApiVersionsRequest(), 0)) is None  # type: ignore[arg-type]
    outcome, shake = _handshake(auth, 1)
    assert (shake.error_code, shake.mechanisms, outcome.closes) == (0, ["PLAIN"], None)  # type: ignore[attr-defined]

    outcome, answer = _authenticate(auth, b"\x00anyone\x00" + password.encode(), version)

    assert (answer.error_code, outcome.closes) == (0, None)  # type: ignore[attr-defined]
    assert auth.authenticated and auth.refusal(_request(MetadataRequest(topics=None), 1)) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("token", [b"\x00anyone\x00token:wrong", b"\x00anyone\x00" + TOKEN.encode(),
                                   b"\x00anyone\x00token:", b"\x00anyone\x00token:" + TOKEN.encode() + b"x",
                                   b"other\x00anyone\x00token:" + TOKEN.encode(), b"token:" + TOKEN.encode()])
def test_a_wrong_password_is_sasl_authentication_failed_with_a_message_and_closes(token: bytes) -> None:
    auth = _auth()
    _handshake(auth, 1)

    outcome, answer = _authenticate(auth, token)

    assert answer.error_code == ERRORS["SASL_AUTHENTICATION_FAILED"] == 58  # type: ignore[attr-defined]
    assert "Authentication failed" in answer.error_message  # type: ignore[attr-defined]
    assert outcome.error == "SASL_AUTHENTICATION_FAILED" and outcome.closes  # type: ignore[attr-defined]
    assert TOKEN not in outcome.closes and not auth.authenticated  # type: ignore[attr-defined]


def test_handshake_v0_takes_the_bare_token_next() -> None:
    auth = _auth()
    _handshake(auth, 0)
    assert auth.expects_token

    outcome = auth.token(b"\x00anyone\x00token:" + READ_TOKEN.encode())

    assert outcome.answer == struct.pack(">i", 0) and outcome.closes is None and auth.authenticated

    wrong = _auth()
    _handshake(wrong, 0)
    refused = wrong.token(b"\x00anyone\x00token:nope")
    assert refused.answer == b"" and refused.closes and refused.error == "SASL_AUTHENTICATION_FAILED"


def test_a_mechanism_other_than_plain_is_unsupported_with_the_enabled_ones_and_closes() -> None:
    outcome, shake = _handshake(_auth(), 1, "SCRAM-SHA-512")

    assert (shake.error_code, shake.mechanisms) == (ERRORS["UNSUPPORTED_SASL_MECHANISM"], ["PLAIN"])  # type: ignore[attr-defined]
    assert outcome.closes and "SCRAM-SHA-512" in outcome.closes  # type: ignore[attr-defined]


def test_any_other_request_before_authentication_closes_the_connection() -> None:
    auth = _auth()
    refused = auth.refusal(_request(MetadataRequest(topics=None), 1))  # type: ignore[arg-type]
    assert refused is not None and "Metadata before authentication" in refused
    _handshake(auth, 1)
    assert auth.refusal(_request(ApiVersionsRequest(), 0)) is not None  # type: ignore[arg-type]  # SaslAuthenticate next


def test_on_a_listener_without_sasl_the_sasl_requests_are_illegal_sasl_state() -> None:
    auth = Authentication(None)
    assert auth.authenticated and auth.refusal(_request(MetadataRequest(topics=None), 1)) is None  # type: ignore[arg-type]

    outcome, shake = _handshake(auth, 1)
    assert shake.error_code == ERRORS["ILLEGAL_SASL_STATE"] and outcome.closes is None  # type: ignore[attr-defined]
    outcome, answer = _authenticate(auth, b"\x00a\x00token:x")
    assert answer.error_code == ERRORS["ILLEGAL_SASL_STATE"] and outcome.closes is None  # type: ignore[attr-defined]


def test_no_token_accepts_no_password() -> None:
    assert not Passwords(["", ""]).accept(b"token:") and not Passwords([]).accept(b"")
