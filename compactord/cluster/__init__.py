"""Several daemons sharing one ledger root, one owner per topic: membership through the broker's group
coordinator (see #41). ``Membership`` holds this daemon's coordination partitions; a topic belongs to
``coordination_partition(topic, partitions)``."""

from __future__ import annotations

from compactord.cluster.coordination import (
    advertised_url,
    coordination_partition,
    coordination_topic,
    ensure_coordination_topic,
    group_id,
)
from compactord.cluster.membership import Membership, Rebalance
from compactord.cluster.roster import Member

__all__ = ["Member", "Membership", "Rebalance", "advertised_url", "coordination_partition", "coordination_topic",
           "ensure_coordination_topic", "group_id"]
