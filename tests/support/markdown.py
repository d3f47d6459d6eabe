"""Markdown as GitHub renders it, for the tests that check links into the docs: headings and their anchors."""

from __future__ import annotations

import re

__all__ = ["FENCE", "github_anchor", "heading_anchors"]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation other than - and _ dropped, spaces to -."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def heading_anchors(markdown: str) -> set[str]:
    """The anchors of every heading outside code fences (GitHub numbers a repeated one: -1, -2)."""
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", FENCE.sub("", markdown), flags=re.MULTILINE):
        anchor, n = github_anchor(heading), 0
        while (anchor if n == 0 else f"{anchor}-{n}") in found:
            n += 1
        found.add(anchor if n == 0 else f"{anchor}-{n}")
    return found
