"""How long the tests wait, in one place. Generous: the CI machine has 2 cores, often shared; a wait
that runs out fails the test, so only a failing test ever waits this long."""

from __future__ import annotations

__all__ = ["READY_TIMEOUT_S", "REBALANCE_TIMEOUT_S", "STOP_TIMEOUT_S", "TASK_TIMEOUT_S"]

# A daemon subprocess's start up to /readyz "compactions": true: ~25 s on an idle 2-core machine (Spark's start and
# warm-up); several times that when the machine is shared or Spark runs on a standalone cluster.
READY_TIMEOUT_S = 240.0
# From SIGTERM to the daemon's exit; then its process group is killed.
STOP_TIMEOUT_S = 60.0
# One compaction of a small topic to its end (pauses included), in the test process, in a daemon or
# on a standalone cluster.
TASK_TIMEOUT_S = 180.0
# A cluster's group settled after a member joins, leaves or dies: ~3 s to a first assignment, ~11 s for a dead
# member's partitions (6 s session) on an idle machine; a cooperative move takes two rounds.
REBALANCE_TIMEOUT_S = 120.0
