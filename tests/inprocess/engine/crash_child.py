"""The process ``test_crash.py`` kills: one compaction of one topic on its own Spark session.

Usage: ``python -m tests.inprocess.engine.crash_child BOOTSTRAP ROOT TOPIC [HOLD]``; the environment
variable ``CRASH_CHILD_SETTINGS`` (a JSON object of ``Settings`` fields) adds settings, e.g. an S3 root's.

Prints ``STATE <state> <epoch seconds>`` at every state change of the task, ``POINT <name> <epoch
seconds>`` when the task reaches a pause point (``task.CHECKPOINTS``) and ``END <state>`` at the end
(stdout, flushed), so that the parent can aim its SIGKILL at a phase of the task. At the pause point
HOLD the task waits for a line on stdin (the parent kills it there instead).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

SETTINGS_ENV = "CRASH_CHILD_SETTINGS"


def main(argv: list[str]) -> int:
    bootstrap, root, topic = argv[:3]
    hold = argv[3] if len(argv) > 3 else ""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from compactord.config import Settings
    from compactord.engine.factory import SparkCompactionServiceFactory
    from compactord.interfaces import ServiceContext
    from compactord.task import CompactionTaskCtx, TaskState
    from tests.support.probes import Recorder

    settings = Settings(
        kafka_bootstrap_servers=bootstrap,
        kafka_request_timeout_ms=10000,
        compacted_ledger_root=root,
        spark_master="local[2]",
        # Small and quiet, to start fast: the parent pays one session start per kill.
        spark_conf={"spark.ui.enabled": "false", "spark.driver.memory": "512m"},
        **json.loads(os.environ.get(SETTINGS_ENV, "{}")),
    )

    def on_state(_ctx: CompactionTaskCtx, _old: TaskState, new: TaskState) -> Any:
        print(f"STATE {new.value} {time.time():.3f}", flush=True)

    def on_point(_ctx: CompactionTaskCtx, point: str) -> None:
        print(f"POINT {point} {time.time():.3f}", flush=True)
        if point == hold:
            sys.stdin.readline()

    factory = SparkCompactionServiceFactory()
    # opens the store: the lock and orphan removal
    factory.initialize(ServiceContext(settings, probe=Recorder(on_state, on_point)))
    factory.spark.start()  # as the daemon does before it takes work (it also warms up: not needed here)
    print(f"STARTED {time.time():.3f}", flush=True)
    ctx = factory.new_topic_compaction_service(topic).compact(start=False)
    ctx.start()
    state = ctx.result(600)
    ctx.worker_done.wait(600)
    print(f"END {state.value} {ctx.error or ''}", flush=True)
    factory.close()
    factory.spark.stop()
    return 0 if state is TaskState.SUCCEED else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
