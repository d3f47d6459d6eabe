"""The topics as the API asks after them: whether one exists, their listing, their policies, their deletion.

A topic's policies reach the engine (its strategy, key expiry and read budget) when they are set, and, for
those stored, once the topic is recovered after the start (at its first use, or by the ledger store's
recovery pass), before anything of it is compacted. Deleting a topic stops its task, then removes its ledgers, horizon, policies and run
history, and everything the daemon keeps of it in memory.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from compactord.config import Settings
from compactord.daemon.backlogs import BacklogCache
from compactord.daemon.policies import PolicyStore, TopicPolicies
from compactord.daemon.recorder import RunRecorder
from compactord.daemon.scheduler import TaskRegistry
from compactord.errors import BrokerUnavailable, CompactionAlreadyRunning, CompactordError, StorageUnavailable
from compactord.interfaces import BrokerMetadata, CompactionServiceFactory
from compactord.ledger.store import LedgerStore
from compactord.task import CompactionTaskCtx

__all__ = ["Topics", "apply_limits", "apply_stored_policies"]

log = logging.getLogger(__name__)


def apply_limits(factory: CompactionServiceFactory, topic: str, policies: TopicPolicies | None) -> None:
    """The policy's key expiry and read budget, to the engine (None: the broker-wide settings)."""
    factory.set_topic_limits(
        topic, key_ttl_ms=policies.keyTtlMs if policies is not None else None,
        max_read_bytes_per_second=policies.maxReadBytesPerSecond if policies is not None else None)


def apply_stored_policies(policies: PolicyStore, factory: CompactionServiceFactory, topic: str) -> None:
    """The topic's stored policies, to the engine, once the topic is recovered after the start
    (``LedgerStore.after_recovery``: before anything of it is compacted); policies that cannot be read are named
    in the log and the topic runs with the broker-wide settings.

    :raises StorageUnavailable: the store does not answer (the topic is recovered again at its next use)."""
    try:
        stored = policies.get(topic)
        if stored.strategy is not None:
            factory.set_topic_strategy(topic, stored.strategy)
        apply_limits(factory, topic, stored)
    except StorageUnavailable:
        raise
    except CompactordError as exc:
        log.error("topic %s: its stored policies are not applied: %s", topic, exc)


class Topics:
    def __init__(self, settings: Settings, store: LedgerStore, admin: BrokerMetadata,
                 factory: CompactionServiceFactory, registry: TaskRegistry, policies: PolicyStore,
                 backlogs: BacklogCache, runs: RunRecorder, broker_problem: Callable[[], str | None],
                 forget: Sequence[Callable[[str], None]]) -> None:
        """``broker_problem``: why the broker counts as down now, or None. ``forget``: what else keeps a
        deleted topic in memory (the registry, the monitor, the identity checks, the metrics...)."""
        self._settings = settings
        self._store = store
        self._admin = admin
        self._factory = factory
        self._registry = registry
        self._policies = policies
        self._backlogs = backlogs
        self._runs = runs
        self._broker_problem = broker_problem
        self._forget = tuple(forget)

    def require_topic(self, topic: str) -> None:
        """:raises TopicNotFound: the broker lacks it. :raises BrokerUnavailable: the broker is down."""
        self._admin.partitions(topic)

    def require_known_topic(self, topic: str) -> None:
        """Before a request stores something of ``topic``: it has state here already (a ledger, a task),
        or the broker has it; no folder is made for a name that exists nowhere.

        :raises TopicNotFound: neither. :raises BrokerUnavailable: the broker is down (and it has no state).
        """
        if self._registry.existing_service(topic) is None and self._registry.live(topic) is None:
            problem = self._broker_problem()
            if problem:  # known to be down: answer at once rather than wait out a request timeout
                raise BrokerUnavailable(problem)
            self.require_topic(topic)

    def set_policies(self, topic: str, policies: TopicPolicies | None) -> None:
        if policies is None:
            self._policies.delete(topic)
        else:
            self._policies.put(topic, policies)
        self._factory.set_topic_strategy(topic, policies.strategy if policies is not None else None)
        apply_limits(self._factory, topic, policies)

    def strategy_name(self, topic: str) -> str:
        """The strategy in force for ``topic``: its policy's, else the configured one."""
        try:
            chosen = self._policies.get(topic).strategy
        except CompactordError:
            chosen = None
        return chosen or self._settings.compaction_strategy

    def delete_topic(self, topic: str, timeout: float) -> tuple[bool, CompactionTaskCtx | None]:
        """Stop the topic's task, then remove its ledgers, horizon and policies; True if all done now."""
        # Durable first: a deletion that a crash or a restart interrupts completes at the next start.
        self._store.mark_deleting(topic)
        outcome = self._registry.stop_topic(topic, timeout * 0.8)
        task = outcome.task if outcome else None
        if outcome is None or outcome.stopped:
            self._delete_now(topic)
            return True, task

        def finish() -> None:
            assert task is not None
            task.worker_done.wait(self._settings.task_timeout_seconds)
            self._delete_now(topic)

        threading.Thread(target=finish, name=f"delete-{topic}", daemon=True).start()
        return False, task

    def _delete_now(self, topic: str) -> None:
        service = self._registry.existing_service(topic)
        try:
            if service is not None:
                service.delete()
        except CompactionAlreadyRunning:
            log.warning("topic %s: a new compaction started while it was being deleted; not deleted", topic)
            self._store.unmark_deleting(topic)
            return
        self._runs.delete(topic)  # while the deletion mark stands: a restart completes the deletion
        self._store.delete_topic(topic)  # policies and marks too (the deletion mark last)
        # Everything kept in memory of the topic goes with it: history, the broker's view, metric series.
        self._factory.set_topic_strategy(topic, None)
        apply_limits(self._factory, topic, None)
        for forget in self._forget:
            forget(topic)
        log.info("topic %s deleted: ledgers, horizon, policies and run history removed", topic)
