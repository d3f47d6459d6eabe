"""The JSON bodies of the API as pydantic models: the routes declare them (``response_model``) and the
OpenAPI document (``/openapi.json``) is generated from them. ``views.py`` builds the bodies; a route that
returns a dict has it checked against its model by FastAPI, one that returns a ``JSONResponse`` (a status
other than its default, headers, or a page of the compacted view, rendered in its own thread) is described
by it. Every model forbids keys it does not name, so a body and its model cannot drift apart unseen
(``tests/daemon/test_api_models.py`` checks a real answer of every route).

A number that may be whole is ``Number``: validated as given (``1`` stays ``1``), described as a number.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from compactord.task import TaskState
from compactord.task_report import REASON_KINDS

__all__ = [
    "Backlog",
    "BrokerView",
    "Cluster",
    "ClusterMember",
    "Conflict",
    "Entry",
    "Error",
    "Health",
    "History",
    "Horizon",
    "Info",
    "Lifecycle",
    "Page",
    "Policies",
    "Preview",
    "Readiness",
    "Run",
    "Task",
    "TaskList",
    "TaskStatus",
    "Topic",
    "TopicList",
    "Unready",
]

Number = Annotated[int | float, WithJsonSchema({"type": "number"})]
DateTime = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]
#: A task's outcome as the API says it; ``state`` (``TaskState``) is where the run is.
TaskStatus = Literal["NOT_RUN", "RUNNING", "SUCCESS", "ERROR"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Error(_Body):
    """Every error's body."""

    error: str = Field(description="a code, e.g. topic_not_found")
    message: str = Field(description="what was wrong and what is allowed")


class Progress(_Body):
    records_read: int
    records_total: int


class ReadThrottle(_Body):
    """A throttled run's budget, its share per reading task, and the rate it read at so far."""

    max_bytes_per_second: int
    reading_tasks: int
    per_task_bytes_per_second: int | None
    bytes_read: int
    bytes_per_second: int
    throttled_seconds: Number


class Task(_Body):
    """A task's status, or the topic's last compaction (every key always present)."""

    topic: str
    status: TaskStatus
    state: TaskState | None
    task_id: str | None
    # A string, not the Literal of today's kinds: a run recorded by an older version may name another kind,
    # and a status must never fail its own model.
    reason: str | None = Field(
        description=f"what started the run, one of {', '.join(REASON_KINDS)} (null: the topic was never "
                    "compacted)")
    reason_detail: str | None
    kind: Literal["compaction", "preview"] | None = Field(
        description="preview: an exact preview, which never switches a ledger")
    started_at: DateTime | None
    finished_at: DateTime | None
    last_error: str | None
    progress: Progress
    full_rebuild: bool
    recreated: bool
    storage_requests: dict[str, int] = Field(
        description="the run's requests to an object store's root, by operation (empty on a local root)")
    read_throttle: ReadThrottle | None
    warnings: list[str]


class Conflict(_Body):
    """A 409: the task in the way, when the refusal is about one (``carries_task`` of its error class)."""

    error: str
    message: str
    task: Task | None = None


class TaskList(_Body):
    tasks: list[Task]


class Health(_Body):
    status: Literal["ok"]


class Readiness(_Body):
    status: Literal["ready", "degraded"]
    compactions: bool
    reads: bool
    problems: list[str]


class Unready(Readiness):
    """``/readyz`` when ledger reads cannot be served: the error and the readiness."""

    error: str
    message: str


class InfoBroker(_Body):
    bootstrap: str
    embedded: bool


class Info(_Body):
    version: str
    broker: InfoBroker
    ledger_root: str
    spark_master: str
    kafka_listeners: str | None = Field(description="the Kafka listener's advertised addresses (kafkaListeners; "
                                                    "null: off): any Kafka client reads the compacted views there")


class ClusterMember(_Body):
    member_id: str
    url: str = Field(description="the URL the other members reach its API at")
    version: str = Field(description="its compactord version (a rolling upgrade mixes versions)")
    partitions: list[int] = Field(description="the coordination partitions it holds")
    generation: int


class Cluster(_Body):
    name: str = Field(description="clusterName; empty: this daemon is no cluster's member")
    member_url: str | None = Field(description="this member's advertised URL")
    member_id: str | None
    generation: int | None = Field(description="the group's generation this member last joined")
    coordination_partitions: int | None
    members: list[ClusterMember] = Field(description="as of the last assignment this member received")
    owned_topics: list[str] = Field(description="the topics this member owns now")
    unowned_partitions: int | None = Field(description="coordination partitions no member holds")
    rebalances: int | None = Field(description="the rebalances this member took part in")
    last_rebalance_at: Number | None = Field(description="when the last one ended (seconds since the epoch)")
    last_rebalance_seconds: Number | None


class Backlog(_Body):
    records: int
    bytes: int
    age_seconds: Number
    dirty_ratio: Number
    measured_at: DateTime | None = Field(None, description="when the broker's offsets it is computed from were asked "
                                                           "(the monitor's pass, or the topic's last task's end)")
    measure_age_ms: int | None = Field(None, description="how old the figure is, in milliseconds")


class TopicConfigs(_Body):
    """A topic's cleanup configs as the broker describes them (null: it did not)."""

    cleanup_policy: str | None
    delete_retention_ms: int | None
    min_compaction_lag_ms: int | None
    retention_ms: int | None
    compacted_by_broker: bool | None


class BrokerView(_Body):
    """What the broker last said of the topic."""

    topic_id: str | None
    log_start: dict[str, int]
    configs: TopicConfigs
    implicit_max_lag_seconds: int | None
    refreshed_at: DateTime | None


class Topic(_Body):
    """A topic of the listing; one that cannot be read has only ``topic``, ``on_broker`` and ``error``."""

    topic: str
    on_broker: bool = Field(description="whether the broker lists the topic now")
    unloaded: bool = False
    backlog: Backlog | None = None
    behind: bool = Field(False, description="its last measured backlog is past a trigger's threshold (its max lag "
                                            "in force included)")
    last_compaction: Task | None = None
    current_task: Task | None = None
    broker: BrokerView | None = None
    warnings: list[str] = []
    owner: str | None = Field(None, description="in a cluster: the advertised URL of the member that owns the "
                                                "topic now (null while none does); absent outside a cluster")
    error: Error | None = None


class TopicList(_Body):
    topics: list[Topic]
    next_after: str | None = Field(None, description="the after of the next page; null: this is the last page")
    monitor_pass_at: DateTime | None = Field(None, description="when the monitor's last pass asked the broker")


class Run(_Body):
    """One run of a topic's history."""

    task_id: str
    state: TaskState
    reason: str = Field(description="what started the run (a reason of a task)")
    reason_detail: str
    caller: str | None
    created_at: DateTime
    started_at: DateTime | None
    finished_at: DateTime
    records_read: int
    bytes_read: int
    records_written: int
    bytes_written: int
    spilled_bytes: int
    task_cpu_ratio: Number | None
    storage_requests: dict[str, int]
    removed: int
    ledger_before: int | None
    ledger_after: int | None
    full_rebuild: bool
    recreated: bool
    skipped: bool
    error: str | None
    error_type: str | None
    member: str | None = Field(description="in a cluster: the advertised URL of the member that ran it")


class History(_Body):
    topic: str
    runs: list[Run]
    next: str | None = Field(description="the cursor of the next page, null at the end")


class PolicyValues(_Body):
    """Per-topic settings (an override's null: the broker-wide setting)."""

    thresholdBytes: int | None
    thresholdMessages: int | None
    maxLagSeconds: int | None
    minDirtyRatio: Number | None
    strategy: str | None
    keyTtlMs: int | None
    maxReadBytesPerSecond: int | None
    iceberg: bool | None = Field(None, description="false: the topic is not published to its Iceberg table")


class Policies(_Body):
    topic: str
    policies: PolicyValues = Field(description="the topic's overrides")
    effective: PolicyValues = Field(description="what is in force")


class Rules(_Body):
    """The rules a ledger was written under."""

    strategy: str
    event_time_source: str
    empty_value_is_tombstone: bool
    retain_null_key: bool
    key_ttl_ms: int


class PartitionHorizon(_Body):
    partition: int
    offset: int


class Horizon(_Body):
    topic: str
    ledger_id: int
    partitions: list[PartitionHorizon]
    rules: Rules
    topic_id: str | None
    log_start: dict[str, int]


class Header(_Body):
    key: str
    value: Annotated[str, WithJsonSchema({"type": "string", "format": "byte"})] | None


class Entry(_Body):
    """A live entry; ``event_time`` and ``marker`` only with ``include_markers=true``."""

    partition: int
    offset: int
    key: str | None = Field(description="base64, or text with encoding=utf8")
    value: str | None = Field(description="base64, or text with encoding=utf8; null: a tombstone")
    timestamp: int = Field(description="epoch milliseconds")
    headers: list[Header]
    event_time: int | None = None
    marker: bool = False


class Page(_Body):
    topic: str
    ledger_id: int
    entries: list[Entry]
    next_start: int | None


class Preview(_Body):
    """What the next compaction would do; the keys from ``markers`` on only for the exact preview."""

    topic: str
    records_kept: int
    records_removed: int
    bytes_kept: int
    bytes_removed: int
    exact: bool
    sample_records: int | None
    dirty_ratio: Number
    estimated_seconds: Number | None
    markers: int | None = None
    kept_digest: int | None = None
    full_rebuild: bool | None = None
    task_id: str | None = None


class Lifecycle(_Body):
    """A lifecycle hook's answer: ``unloaded`` (with the stopped ``task`` on an unload) or ``deleted``."""

    topic: str
    unloaded: bool | None = None
    deleted: bool | None = None
    task: Task | None = None
