"""Who may read through the listener: SASL/PLAIN on the SASL_PLAINTEXT and SASL_SSL listeners, with the password
``token:<httpAuthToken>`` or ``token:<httpReadToken>`` and any user name (KoP's form). No I/O here:
``listener/server.py`` reads the frames and writes the answers (TLS is its servers', ``config_values.tls_context``).

The exchange follows Kafka's broker (KIP-43, KIP-152): before authentication a connection may send ApiVersions
and SaslHandshake only; after a SaslHandshake v1 the client sends SaslAuthenticate requests, after a v0 one the
SASL token as a bare frame (answered by a bare frame). A wrong password is answered
``SASL_AUTHENTICATION_FAILED`` with a message (v1 only; v0 has no way to say it), a mechanism other than PLAIN
``UNSUPPORTED_SASL_MECHANISM`` with the enabled ones, and either closes the connection; any other request before
authentication closes it at once, as Kafka does.
"""

from __future__ import annotations

import hmac
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from kafka.protocol.api_key import ApiKey

from compactord.listener.protocol import ERRORS, Request, encode_response

__all__ = ["MECHANISMS", "Authentication", "Outcome", "Passwords"]

MECHANISMS = ["PLAIN"]
FAILED = "Authentication failed: the password is not token:<a token of this compactord> (any user name)"
_USER_SHOWN = 64  # characters of a user name a log line shows


class Passwords:
    """The passwords the SASL listeners accept: ``token:`` and each token that is set."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self._accepted = [f"token:{token}".encode() for token in tokens if token]

    def accept(self, password: bytes) -> bool:
        # Every candidate compared in constant time, none skipped: the time says nothing of which one was near.
        found = False
        for accepted in self._accepted:
            found |= hmac.compare_digest(accepted, password)
        return found


@dataclass(frozen=True, slots=True)
class Outcome:
    """A SASL request's answer: the frame to send, the error for the metrics, and why the connection closes
    after it (None: it stays open)."""

    answer: bytes
    error: str = "NONE"
    closes: str | None = None


class _State(Enum):
    HANDSHAKE = "handshake"  # nothing but ApiVersions and SaslHandshake yet
    AUTHENTICATE = "authenticate"  # SaslHandshake v1 done: SaslAuthenticate next
    TOKEN = "token"  # SaslHandshake v0 done: the bare token frame next
    DONE = "done"  # authenticated, or a listener that takes no password


class Authentication:
    """One connection's SASL exchange; ``passwords`` None: a listener that takes none (PLAINTEXT, SSL)."""

    def __init__(self, passwords: Passwords | None) -> None:
        self._passwords = passwords
        self._state = _State.DONE if passwords is None else _State.HANDSHAKE

    @property
    def authenticated(self) -> bool:
        return self._state is _State.DONE

    @property
    def expects_token(self) -> bool:
        """The next frame is a bare SASL token (after SaslHandshake v0), no request."""
        return self._state is _State.TOKEN

    def refusal(self, request: Request) -> str | None:
        """Why ``request`` closes the connection before authentication (None: it is answered)."""
        if self._state is _State.DONE:
            return None
        allowed = {_State.HANDSHAKE: (ApiKey.ApiVersions, ApiKey.SaslHandshake),
                   _State.AUTHENTICATE: (ApiKey.SaslAuthenticate,)}[self._state]
        if request.api_key in allowed:
            return None
        wanted = " or ".join(key.name for key in allowed)
        return f"{request.api_name} before authentication (this listener takes SASL/PLAIN: {wanted} next)"

    def answer(self, request: Request) -> Outcome:
        """The answer to SaslHandshake or SaslAuthenticate (decoded)."""
        if request.api_key == ApiKey.SaslHandshake:
            return self._handshake(request)
        return self._authenticate(request)

    def _handshake(self, request: Request) -> Outcome:
        rc = request.response_class
        if self._state is not _State.HANDSHAKE:  # a listener without SASL, or a second handshake
            return Outcome(encode_response(request, rc(error_code=ERRORS["ILLEGAL_SASL_STATE"], mechanisms=[])),
                           "ILLEGAL_SASL_STATE")
        mechanism = request.body.mechanism
        if mechanism not in MECHANISMS:
            error = "UNSUPPORTED_SASL_MECHANISM"
            return Outcome(encode_response(request, rc(error_code=ERRORS[error], mechanisms=MECHANISMS)), error,
                           f"SASL mechanism {mechanism!r} asked for (enabled: {', '.join(MECHANISMS)})")
        self._state = _State.AUTHENTICATE if request.version >= 1 else _State.TOKEN
        return Outcome(encode_response(request, rc(error_code=0, mechanisms=MECHANISMS)))

    def _authenticate(self, request: Request) -> Outcome:
        rc = request.response_class
        if self._state is not _State.AUTHENTICATE:
            message = "SaslAuthenticate outside a SASL exchange (authenticated already, or no SASL listener)"
            return Outcome(encode_response(request, rc(error_code=ERRORS["ILLEGAL_SASL_STATE"],
                                                       error_message=message, auth_bytes=b"")),
                           "ILLEGAL_SASL_STATE")
        failure = self._check(request.body.auth_bytes)
        if failure is None:
            self._state = _State.DONE
            return Outcome(encode_response(request, rc(error_code=0, error_message=None, auth_bytes=b"",
                                                       session_lifetime_ms=0)))
        error = "SASL_AUTHENTICATION_FAILED"
        return Outcome(encode_response(request, rc(error_code=ERRORS[error], error_message=FAILED,
                                                   auth_bytes=b"")), error, failure)

    def token(self, frame: bytes) -> Outcome:
        """The bare token after SaslHandshake v0: an empty bare frame when it is right; else the connection
        closes (v0 has no error to answer)."""
        failure = self._check(frame)
        if failure is None:
            self._state = _State.DONE
            return Outcome(struct.pack(">i", 0))
        return Outcome(b"", "SASL_AUTHENTICATION_FAILED", failure)

    def _check(self, token: bytes) -> str | None:
        """Why a SASL/PLAIN token (authzid NUL user NUL password, RFC 4616) is refused; None: it is accepted."""
        assert self._passwords is not None
        parts = token.split(b"\x00")
        if len(parts) != 3:
            return f"authentication failed: a SASL/PLAIN token of {len(parts)} parts (3 expected)"
        authzid, user, password = parts
        shown = user[:_USER_SHOWN].decode("utf-8", "replace")
        if authzid and authzid != user:
            return f"authentication failed: user {shown!r} asked to act as another"
        if not self._passwords.accept(password):
            return f"authentication failed: user {shown!r} gave a wrong password"
        return None
