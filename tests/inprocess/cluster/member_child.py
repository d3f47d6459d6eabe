"""One cluster member in a process of its own, for tests that kill it: ``member_child.py BOOTSTRAP NAME
PARTITIONS URL``. Each callback prints one JSON line ({"member", "event", "partitions"}) on stdout; SIGTERM
leaves the group and exits."""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Callable

from compactord.cluster import Membership
from compactord.config import Settings


def main() -> None:
    bootstrap, name, partitions, url = sys.argv[1:5]
    settings = Settings(kafka_bootstrap_servers=bootstrap, kafka_request_timeout_ms=10000, cluster_name=name,
                        cluster_coordination_partitions=int(partitions))
    lock = threading.Lock()

    def say(event: str) -> Callable[[set[int]], None]:
        def callback(parts: set[int]) -> None:
            with lock:
                print(json.dumps({"member": url, "event": event, "partitions": sorted(parts)}), flush=True)
        return callback

    membership = Membership(settings, url, on_assigned=say("assigned"), on_revoked=say("revoked"),
                            on_lost=say("lost")).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.5):  # a timeout: the signal handler runs between waits
        pass
    membership.stop()


if __name__ == "__main__":
    main()
