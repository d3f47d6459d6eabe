"""A topic deleted and created again under its name while the driver reads its offsets and first records: librdkafka
has died of it (SIGSEGV on its thread rdk:main, on a Fetch answered for a topic it cannot name), and with it the
process that read. The reads run in processes of their own (``compactord.kafka.probe_process``): the process that
asks lives on, and its reads are answered or refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from compactord.embedded import EmbeddedBroker

REPO = Path(__file__).resolve().parents[3]
SECONDS = 20  # the process that read died within a few seconds of this, every time it was tried


def test_a_topic_recreated_under_the_reads_of_its_offsets_leaves_the_reading_process_alive(
        broker: EmbeddedBroker, tmp_path: Path) -> None:
    child = subprocess.run(
        [sys.executable, "-m", "tests.inprocess.kafka.probe_child", broker.bootstrap, str(tmp_path), str(SECONDS)],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=SECONDS + 180)
    assert child.returncode == 0, f"exit {child.returncode}\n{child.stdout[-2000:]}\n{child.stderr[-3000:]}"
    answered = int(child.stdout.split()[1])
    assert answered > 0, child.stdout  # reads were made (and answered) all along
