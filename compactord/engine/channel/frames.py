"""The channel's wire format: length-prefixed JSON objects, each bounded.

A frame is a 4-byte big-endian length, then that many bytes of UTF-8 JSON holding one object whose ``"t"``
names its kind. Either side closes a connection that sends a frame above ``MAX_FRAME_BYTES`` or one that is
not such an object: a peer that breaks the format is never trusted for what follows.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["HEADER_BYTES", "MAX_FRAME_BYTES", "FrameError", "decode", "encode", "frame_length", "split_frames"]

HEADER_BYTES = 4
# A plan (the writing tasks' spec: ranges, ledger row groups) is the largest message, a few KiB for
# hundreds of partitions; a progress report is ~300 bytes.
MAX_FRAME_BYTES = 1 << 20


class FrameError(ValueError):
    """A frame that breaks the format: too large, not JSON, or not an object with a kind."""


def encode(message: dict[str, Any]) -> bytes:
    """``message`` as one frame.

    :raises FrameError: it is larger than ``MAX_FRAME_BYTES`` once encoded.
    """
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError(f"a {message.get('t')!r} message of {len(body)} bytes is over the channel's "
                         f"{MAX_FRAME_BYTES}-byte frame bound")
    return len(body).to_bytes(HEADER_BYTES, "big") + body


def frame_length(header: bytes) -> int:
    """The body length a frame's header announces.

    :raises FrameError: it is over ``MAX_FRAME_BYTES``.
    """
    length = int.from_bytes(header, "big")
    if length > MAX_FRAME_BYTES:
        raise FrameError(f"a frame of {length} bytes announced, over the {MAX_FRAME_BYTES}-byte bound")
    return length


def decode(body: bytes) -> dict[str, Any]:
    """A frame's body as its message.

    :raises FrameError: not a JSON object with a string ``"t"``.
    """
    try:
        message = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FrameError(f"a frame that is not JSON: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("t"), str):
        raise FrameError("a frame that is not a JSON object with a kind (\"t\")")
    return message


def split_frames(buffer: bytearray) -> list[dict[str, Any]]:
    """The whole frames at the start of ``buffer``, removed from it (a partial frame stays).

    :raises FrameError: a frame breaks the format.
    """
    found: list[dict[str, Any]] = []
    at = 0
    while len(buffer) - at >= HEADER_BYTES:
        length = frame_length(bytes(buffer[at:at + HEADER_BYTES]))
        if len(buffer) - at - HEADER_BYTES < length:
            break
        found.append(decode(bytes(buffer[at + HEADER_BYTES:at + HEADER_BYTES + length])))
        at += HEADER_BYTES + length
    del buffer[:at]
    return found
