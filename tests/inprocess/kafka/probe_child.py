"""``python -m tests.inprocess.kafka.probe_child BOOTSTRAP ROOT SECONDS``: asks for a topic's offsets and first records
(``KafkaAdmin.offsets_with_records``, as a run's planning and the reads' identity checks do) from two threads while
the main thread deletes the topic and creates it again, for SECONDS; then prints ``answered N refused M`` and exits
0, if librdkafka has not taken the process down meanwhile."""

from __future__ import annotations

import sys
import threading
import time

from kafka.admin import KafkaAdminClient

from compactord.config import Settings
from compactord.errors import CompactordError
from compactord.kafka.admin import KafkaAdmin
from tests.conftest import Kafka


def main(bootstrap: str, root: str, seconds: float) -> None:
    broker = Kafka(bootstrap, admin=KafkaAdminClient(bootstrap_servers=bootstrap))
    records = [(f"k{i}", "v", i % 2) for i in range(10)]
    topic = broker.topic(partitions=2, prefix="recreated")
    broker.produce(topic, records)
    kafka = KafkaAdmin(Settings(kafka_bootstrap_servers=bootstrap, compacted_ledger_root=root,
                                kafka_request_timeout_ms=5000))
    counts = {"answered": 0, "refused": 0}
    stop = threading.Event()

    def ask() -> None:
        while not stop.is_set():
            try:
                kafka.offsets_with_records(topic, {0: 0, 1: 0})
                counts["answered"] += 1
            except CompactordError:  # the topic is gone for a moment, or a read failed: a refusal, not a crash
                counts["refused"] += 1

    askers = [threading.Thread(target=ask, daemon=True) for _ in range(2)]
    for thread in askers:
        thread.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        broker.recreate(topic, partitions=2)
        broker.produce(topic, records)
        time.sleep(0.2)
    stop.set()
    for thread in askers:
        thread.join(60)
    kafka.close()
    broker.close()
    print(f"answered {counts['answered']} refused {counts['refused']}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
