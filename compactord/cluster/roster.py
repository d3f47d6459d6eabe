"""What the members of a cluster tell one another through the group protocol: each member's subscription
carries its advertised URL and version, and the leader's assignment hands every member the whole roster
(each member with its URL, version and coordination partitions), so that any member lists the cluster
without asking the broker.

The assignor is kafka-python's cooperative-sticky one, whose placement and two-round moves it keeps: that
assignor leaves both ``user_data`` fields empty (it carries owned partitions in the subscription's own
field), which these use. A member that cannot decode them (another version's format) is listed with an
empty URL and version.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor

__all__ = ["ClusterAssignor", "Member", "decode_roster", "decode_subscription"]

log = logging.getLogger(__name__)

_FORMAT = 1  # of both JSON objects; a reader ignores the fields it does not know


@dataclass(frozen=True, slots=True)
class Member:
    """One member of the group as of ``generation``: its coordination partitions in that generation."""

    member_id: str
    url: str
    version: str
    partitions: frozenset[int]
    generation: int


def _loads(data: bytes | None) -> dict[str, Any]:
    try:
        found = json.loads(data or b"{}")
    except (UnicodeDecodeError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def decode_subscription(data: bytes | None) -> tuple[str, str]:
    """(url, version) from a member's subscription ``user_data``; empty strings where it says nothing."""
    found = _loads(data)
    return str(found.get("url", "")), str(found.get("version", ""))


def decode_roster(data: bytes | None, generation: int) -> list[Member]:
    """The members an assignment's ``user_data`` lists (none if it lists none)."""
    members = []
    for entry in _loads(data).get("members", ()):
        if isinstance(entry, dict):
            members.append(Member(str(entry.get("id", "")), str(entry.get("url", "")),
                                  str(entry.get("version", "")),
                                  frozenset(int(p) for p in entry.get("partitions", ())), generation))
    return sorted(members, key=lambda m: m.member_id)


class ClusterAssignor(CooperativeStickyAssignor):
    """Cooperative-sticky with the cluster's metadata: ``url`` and ``version`` in this member's subscription,
    the roster in every assignment it computes as leader. ``on_assigned(assignment_user_data, generation)``
    hears of each assignment this member receives, on kafka-python's IO thread; ``on_join()`` of each
    JoinGroup it is about to send."""

    def __init__(self, url: str, version: str, on_assigned: Callable[[bytes | None, int], None],
                 on_join: Callable[[], None]) -> None:
        super().__init__()
        self._user_data = json.dumps({"format": _FORMAT, "url": url, "version": version}).encode()
        self._on_assigned = on_assigned
        self._on_join = on_join

    def metadata(self, topics: Any) -> Any:
        self._on_join()
        subscription = super().metadata(topics)
        subscription.user_data = self._user_data
        return subscription

    def assign(self, cluster: Any, members: Any) -> dict[str, Any]:
        assignments: dict[str, Any] = super().assign(cluster, members)
        urls = {member.member_id: decode_subscription(member.metadata.user_data) for member in members}
        roster = [{"id": member_id, "url": urls[member_id][0], "version": urls[member_id][1],
                   "partitions": sorted(p for _, parts in assignment.assigned_partitions for p in parts)}
                  for member_id, assignment in sorted(assignments.items())]
        data = json.dumps({"format": _FORMAT, "members": roster}, separators=(",", ":")).encode()
        for assignment in assignments.values():
            assignment.user_data = data
        return assignments

    def on_assignment(self, assignment: Any, generation: int) -> None:
        super().on_assignment(assignment, generation)
        self._on_assigned(assignment.user_data, generation)
