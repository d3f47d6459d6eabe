"""A parser of Java properties text, as ``java.util.Properties.load(Reader)`` reads it.

Natural lines are joined where a line ends in an odd number of backslashes; a line whose first
non-blank character is ``#`` or ``!`` is a comment; the key ends at the first unescaped ``=``, ``:``
or white space; escapes ``\\t \\n \\r \\f \\uXXXX`` are decoded and any other escaped character stands
for itself (so a regex's backslash is written doubled). Later keys replace earlier ones.
"""

from __future__ import annotations

import re

__all__ = ["load_properties"]

_WHITESPACE = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _logical_lines(text: str) -> list[str]:
    lines = re.split(r"\r\n|\r|\n", text)  # Java ends lines at these only (not \f, \x85, ...)
    out: list[str] = []
    current: str | None = None
    for raw in lines:
        line = raw.lstrip(_WHITESPACE) if current is not None else raw
        if current is None:
            stripped = line.lstrip(_WHITESPACE)
            if not stripped or stripped[0] in "#!":
                continue
            line = stripped
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            current = (current or "") + line[:-1]
            continue
        out.append((current or "") + line)
        current = None
    if current is not None:
        out.append(current)
    return out


def _unescape(s: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(s):
        ch = s[i]
        if ch != "\\" or i + 1 >= len(s):
            if ch != "\\":
                out.append(ch)
            i += 1
            continue
        nxt = s[i + 1]
        if nxt == "u":
            digits = s[i + 2 : i + 6]
            if len(digits) != 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise ValueError(f"malformed \\uxxxx escape in {s!r}")
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


def _split(line: str) -> tuple[str, str]:
    i = 0
    while i < len(line):
        ch = line[i]
        if ch == "\\":
            i += 2
            continue
        if ch in "=:" or ch in _WHITESPACE:
            break
        i += 1
    key = line[:i]
    rest = line[i:].lstrip(_WHITESPACE)
    if rest[:1] in ("=", ":") and (i >= len(line) or line[i] in _WHITESPACE or line[i] in "=:"):
        rest = rest[1:].lstrip(_WHITESPACE)
    return key, rest


def load_properties(text: str) -> dict[str, str]:
    """Parse properties ``text`` into an ordered dict of key -> value."""
    props: dict[str, str] = {}
    for line in _logical_lines(text):
        key, value = _split(line)
        props[_unescape(key)] = _unescape(value)
    return props
