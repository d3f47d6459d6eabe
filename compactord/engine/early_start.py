"""Reading tasks launched while the run is planned.

An incremental run reads each partition from its previous horizon on, a rebuild from each log start the
current ledger recorded: the starts are known before the broker is asked anything. A run's planning (the
partitions, their log starts and ends, the log's identity: four round trips and a read, ~20 ms here) and
Spark's launch of the job's tasks (~25 ms from the call to a task's Python) used to come one after the other.
``EarlyStart`` launches the job first: each task opens its partitions' readers at those starts, so that their
first fetches are under way, and blocks until the driver hands it its plan over the run's channel
(``channel.TaskChannel.wait_plan``: no polling, so that waiting tasks leave the cores to the planning). The driver
plans meanwhile, then hands them the writing tasks' spec (``job.writing_tasks_spec``), or that they are not
needed (nothing new, a run that groups in Spark, partitions added): they then end without reading, and the
run goes on as planned without them.

A task reads the planned range of each of its partitions; a reader opened at another start (retention moved
the log start) is closed and one is opened at the planned start. A task waits for its plan at most
``PLAN_WAIT_S`` (then the driver declines for every task, and runs its own job); a cancel reaches waiting
tasks over the channel, as it reaches reading ones.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from compactord.config import Settings
from compactord.engine.channel import RunChannel, TaskChannel, client_config
from compactord.engine.kafka_fetch import RangeReader, open_range_reader
from compactord.engine.kafka_source import Range, pack_ranges, task_groups_rdd, write_ranges

__all__ = ["PLAN_WAIT_S", "EarlyStart"]

log = logging.getLogger(__name__)

# How long a task waits for its run's plan before it ends without reading (the driver then runs the job as
# usual): waiting tasks hold Spark's cores, which another topic's job may need while a broker answers slowly.
PLAN_WAIT_S = 2.0

Opening = tuple[int, int]  # (partition, start): where a task opens a reader before its run is planned


class EarlyStart:
    """The writing tasks of a run not planned yet, running in a thread of their own (``launch``).

    ``go`` hands the tasks the run's spec, unless they stopped waiting for it; ``wait`` (after a ``go`` that
    did) joins the job and raises its error. ``abort`` may be called at any point, and again: it tells tasks
    still waiting that they are not needed, and leaves the job ended.
    """

    def __init__(self, spark: Any, group_id: str, description: str, channel: RunChannel,
                 starts: Mapping[int, int], stub: dict[str, Any], cores: int) -> None:
        self._spark = spark
        self.description = description
        self._channel = channel
        self.starts = dict(starts)
        ranges: list[Range] = [(p, s, s + 1) for p, s in sorted(starts.items())]  # sizes unknown: alike
        self._groups = [[(p, s) for p, s, _ in group] for group in pack_ranges(ranges, max(1, cores))]
        self._handed = False
        self._error: BaseException | None = None
        self._task = functools.partial(_early_groups, {**stub, "plan_wait_s": PLAN_WAIT_S})
        self._thread = threading.Thread(target=self._run, args=(group_id, description),
                                        name=f"early-start-{group_id}", daemon=True)
        self._job: Any = None

    @classmethod
    def launch(cls, spark: Any, group_id: str, description: str, channel: RunChannel, starts: Mapping[int, int],
               stub: dict[str, Any], cores: int) -> EarlyStart:
        """Launch the tasks (``stub``: the reader's settings and the run's channel endpoint). The job is made here and submitted by a thread of its own: made beside the
        planning, the driver's share of a launch (~8 ms of Python and calls into the JVM) waited for the
        interpreter's lock while the planning thread held it, and the tasks started 35-60 ms after the call."""
        early = cls(spark, group_id, description, channel, starts, stub, cores)
        try:
            early._job = task_groups_rdd(spark.spark, early._groups, early._task)
        except Exception as exc:  # noqa: BLE001 (the run's own job is made the usual way, and fails there)
            log.debug("the early reading tasks of %s could not be made: %s", description, exc)
            early._error = exc
            early._handed = True  # no task waits for a plan
            return early
        early._thread.start()
        return early

    @staticmethod
    def stub(settings: Settings, topic: str, endpoint: Mapping[str, Any]) -> dict[str, Any]:
        """What the tasks are shipped with before their run is planned: where to open their readers (the Kafka
        client's settings without its secrets, which they get over the run's channel at ``endpoint``)."""
        return {"client": settings.kafka_client_config(secrets=False), "topic": topic,
                "batch_records": settings.compaction_reader_batch_records, "channel": dict(endpoint)}

    def _run(self, group_id: str, description: str) -> None:
        try:
            self._spark.run(group_id, description, self._job.count)
        except BaseException as exc:  # noqa: BLE001 (handed to ``wait``, or logged by ``abort``)
            self._error = exc

    def fits(self, spec: Mapping[str, Any]) -> bool:
        """Whether these tasks can run the writing tasks' ``spec``: one range for each of their partitions,
        and none other, unthrottled."""
        partitions = [int(r[0]) for r in spec["ranges"]]
        return (bool(spec.get("write_to")) and not spec.get("read_bytes_per_second")
                and len(partitions) == len(set(partitions)) and set(partitions) == set(self.starts))

    def go(self, spec: dict[str, Any]) -> bool:
        """Hand the tasks the writing tasks' ``spec`` (``fits``); False when they had stopped waiting for a
        plan (``PLAN_WAIT_S``), were never launched, or their job has ended already (a task
        failed: e.g. its reader could not be made): the run's job is then still to run."""
        if self._handed or not self._thread.is_alive():  # never launched, or its job ended (failed)
            return False
        self._handed = True  # either way, a plan is decided: the tasks follow it
        return self._channel.hand_plan(spec)

    def wait(self) -> None:
        """Wait for the job that ``go`` let run; its error, if it failed (``SparkSessionManager.job_group``'s)."""
        self._thread.join()
        if self._error is not None:
            raise self._error

    def abort(self) -> None:
        """End the tasks without a read, if no plan was handed to them, and wait for the job to end."""
        if not self._handed:
            self._handed = True
            self._channel.hand_plan(None)
        if self._thread.ident is not None:  # started
            self._thread.join()
        if self._error is not None:
            log.debug("the early reading tasks of %s ended with: %s", self.description, self._error)


def _early_groups(stub: dict[str, Any], groups: Iterator[list[Opening]]) -> Iterator[Any]:
    for openings in groups:
        _early_task(stub, openings)
    return iter(())


def _early_task(stub: dict[str, Any], openings: list[Opening]) -> None:
    """One task: open the readers of its first two partitions (a task opens the next range's reader while it
    reads one), wait for the plan, then write each partition's planned range (``kafka_source.write_ranges``)."""
    channel = TaskChannel.for_spec(stub)
    if channel is None:
        raise RuntimeError("an early reading task was launched without its run's channel")
    config = client_config(stub, channel)
    opened: dict[Opening, RangeReader] = {}
    try:
        for partition, start in openings[:2]:
            opened[(partition, start)] = open_range_reader(config, stub["topic"], partition, start,
                                                           int(stub["batch_records"]))
        spec = channel.wait_plan(float(stub["plan_wait_s"]))
        if spec is None:
            return
        planned = {int(p): (int(p), int(s), int(e)) for p, s, e in spec["ranges"]}
        ranges = [planned[p] for p, _ in openings]
        write_ranges(spec, ranges, opened)  # it closes the readers, also those no range takes (and empties opened)
    finally:
        for reader in opened.values():
            reader.close()
