"""Benchmark: reading a compacted topic through the Kafka listener (kafkaListeners) against the broker itself.

Usage (from the repository root, with the project's venv)::

    .venv/bin/python bench/listener.py                      # 1,000,000 records over 10,000 keys, 3 runs
    .venv/bin/python bench/listener.py --records 200000     # a quicker run

It starts the bundled broker and a daemon with a listener (``compactord run`` as a subprocess, its own ledger
root), builds one topic (``--records`` records, 4 partitions, 100-byte values, 2% tombstones, over ``--keys``
keys: ``workload.py``), compacts it through the API, then ``--runs`` times, alternating, side by side:

1. **view**: librdkafka (confluent-kafka) reads the topic through the listener from offset 0 to the last record
   of the compacted view (about ``--keys`` records; a first read to the end of every partition counts them, timed
   apart as the read that finds the listener's batch cache empty);
2. **same**: librdkafka reads as many records from the broker directly, from offset 0;

then once **log**: librdkafka reads the topic's whole log from the broker (what an application that rewinds the
log to bootstrap reads). Then 2 x ``--cold`` new ledgers, each after a few more records and a compaction, each
read through the listener right after its switch, then as many records from the broker: in turn, with
librdkafka's own fetch size (1 MiB a partition), whose first pages the listener made at the switch
(``listener/warm.py``: the topic is read through it), and with a byte more, whose pages no read made yet (as the
first read of the topic through the listener).
Last, ``--fetches`` single-partition Fetch requests (kafka-python's protocol classes, one connection each,
``min_bytes=1``: answered as soon as the record is read) at the last offset of a partition, to the listener and
to the broker, alternating, twice: at the horizon (the view's last record: the ledger's answer, with the live log
after it relayed with a 1 ms wait), then, after a few more records, past the horizon (relayed): their p50 latency.

It prints the medians, the load average before and after, and, as its last lines, ``view/same=<ratio>``,
``view/log=<ratio>``, ``first/same=<ratio>`` (the first reads of a ledger no batches are kept of, the topic's first
included, against the broker's reads next to them), ``warmed/same=<ratio>`` (the same, of ledgers warmed at their
switch),
``horizon_p50_added_ms=<ms>`` and ``relay_p50_added_ms=<ms>``. Targets (#42): ``view/same <= 1``; the relayed fetch adds at most ~1 ms at p50.
Figures, not assertions: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import httpx
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from kafka.protocol.consumer import FetchRequest, FetchResponse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import daemon_process, wait_compacted
from workload import Workload, produce

from compactord.embedded import EmbeddedBroker, free_port
from compactord.listener.protocol import item

PARTITIONS = 4
TOPIC = "listener-bench"
_SIZE = struct.Struct(">i")
VERSION = 11  # the Fetch version the listener's relay asks of the test broker (by topic name)


def consume(bootstrap: str, limit: int | None = None, partition_bytes: int = 1024 * 1024) -> tuple[int, float]:
    """librdkafka reads the topic from offset 0 until the end of every partition (or ``limit`` records), asking
    ``partition_bytes`` of each partition a fetch (its ``max.partition.fetch.bytes``, 1 MiB by default):
    (records read, seconds to the last record read)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-unused", "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "error",
                         "max.partition.fetch.bytes": partition_bytes})
    try:
        started = time.perf_counter()
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        read, ended, last = 0, set(), started
        while len(ended) < PARTITIONS and (limit is None or read < limit):
            for message in consumer.consume(1000, 0.01):  # a short wait: the end is not held up by it
                error = message.error()
                if error is None:
                    read += 1
                    last = time.perf_counter()
                elif error.code() == KafkaError._PARTITION_EOF:
                    ended.add(message.partition())
                else:
                    raise KafkaException(error)
        return read, last - started
    finally:
        consumer.close()


class Fetcher:
    """One connection to a Kafka-protocol server, sending single-partition Fetch requests (``VERSION``)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.stream = self.sock.makefile("rb")
        self.correlation = 0

    def fetch_ms(self, partition: int, offset: int) -> float:
        self.correlation += 1
        request = FetchRequest(replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                               session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
                               topics=[item(FetchRequest, "topics", topic=TOPIC, partitions=[
                                   item(FetchRequest, "topics.partitions", partition=partition, fetch_offset=offset,
                                        partition_max_bytes=1 << 20, log_start_offset=-1, current_leader_epoch=-1,
                                        last_fetched_epoch=-1)])])
        request.with_header(correlation_id=self.correlation, client_id="bench")
        started = time.perf_counter()
        self.sock.sendall(request.encode(version=VERSION, header=True, framed=True))
        (size,) = _SIZE.unpack(self.stream.read(_SIZE.size))
        answer = FetchResponse.decode(self.stream.read(size), version=VERSION, header=True)
        elapsed = (time.perf_counter() - started) * 1000
        ((data,),) = [t.partitions for t in answer.responses]
        if data.error_code != 0 or not data.records:
            raise SystemExit(f"a fetch at offset {offset} answered error {data.error_code}, {len(data.records or b'')} bytes")
        return elapsed

    def close(self) -> None:
        self.stream.close()
        self.sock.close()


def ends(bootstrap: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-unused"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30)[1] for p in range(PARTITIONS)}
    finally:
        consumer.close()


def fetches(listener_port: int, broker_port: int, count: int) -> tuple[list[float], list[float]]:
    """``count`` Fetch requests at the last offset of each partition in turn, to the listener and to the broker,
    alternating (after 20 that warm up): the milliseconds of each."""
    last = {p: end - 1 for p, end in ends(f"127.0.0.1:{broker_port}").items() if end > 0}
    through, direct = Fetcher(listener_port), Fetcher(broker_port)
    listener_ms, broker_ms = [], []
    try:
        for i in range(count + 20):
            p = sorted(last)[i % len(last)]
            a, b = through.fetch_ms(p, last[p]), direct.fetch_ms(p, last[p])
            if i >= 20:
                listener_ms.append(a)
                broker_ms.append(b)
    finally:
        through.close()
        direct.close()
    return listener_ms, broker_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fetches", type=int, default=500)
    parser.add_argument("--cold", type=int, default=3, help="new ledgers of each kind (warmed at the switch or not)")
    parser.add_argument("--producers", type=int, default=2)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="compactord-listener-"))
    broker = EmbeddedBroker(log_path=work / "tansu.log").start()
    port = free_port()
    listener = f"127.0.0.1:{port}"
    print(f"work directory (ledgers, logs; kept): {work}", flush=True)
    load_before = os.getloadavg()
    try:
        with daemon_process(work, broker.bootstrap, {"kafkaListeners": f"PLAINTEXT://{listener}",
                                                      "compactionTopicsPattern": TOPIC}) as (_daemon, base), \
                httpx.Client(base_url=base, timeout=120) as client, mp.get_context("spawn").Pool(args.producers) as pool:
            from kafka.admin import KafkaAdminClient, NewTopic

            admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
            admin.close()
            workload = Workload(keys=args.keys, partitions=PARTITIONS, value_bytes=100, tombstone_ratio=0.02)
            sent, seconds = produce(pool, args.producers, workload, broker.bootstrap, 0, args.records, TOPIC)
            print(f"{TOPIC}: produced {sent} records in {seconds:.1f} s", flush=True)
            started = time.monotonic()
            client.put(f"/v1/topics/{TOPIC}/compaction", headers={"Content-Type": "application/json"})
            wait_compacted(client, TOPIC)
            print(f"{TOPIC}: compacted in {time.monotonic() - started:.1f} s", flush=True)

            view_s, same_s = [], []
            # The first read counts the view (and warms the broker); it is timed apart: it finds the listener's
            # batch cache empty. The timed reads stop at its last record (not at the end of the partitions, which
            # librdkafka learns from a fetch past it); every read is timed to its last record.
            records, cold_s = consume(listener)
            print(f"first read: view {records} records in {cold_s:.2f} s (the listener keeps no batches yet)",
                  flush=True)
            first_s, first_same_s = [cold_s], [consume(broker.bootstrap, limit=records)[1]]
            for run in range(args.runs):
                view, seconds = consume(listener, limit=records)
                view_s.append(seconds)
                same, same_seconds = consume(broker.bootstrap, limit=view)
                same_s.append(same_seconds)
                print(f"run {run + 1}: view {view} records in {seconds:.2f} s; broker {same} records in "
                      f"{same_seconds:.2f} s", flush=True)
            log, log_s = consume(broker.bootstrap)
            print(f"log: {log} records from the broker in {log_s:.2f} s", flush=True)
            produced = args.records
            warmed_s, warmed_same_s = [], []
            for cold in range(2 * args.cold):  # a few records more, compacted: a new ledger
                produce(pool, args.producers, workload, broker.bootstrap, produced, produced + PARTITIONS, TOPIC)
                produced += PARTITIONS
                client.put(f"/v1/topics/{TOPIC}/compaction", headers={"Content-Type": "application/json"})
                wait_compacted(client, TOPIC)
                # In turn: librdkafka's own fetch size, whose pages the listener made at the switch (the topic is
                # read through it), and a byte more, whose pages no read made yet.
                warmed = cold % 2 == 0
                view, seconds = consume(listener, partition_bytes=1024 * 1024 + (0 if warmed else 1))
                same, same_seconds = consume(broker.bootstrap, limit=view)
                (warmed_s if warmed else first_s).append(seconds)
                (warmed_same_s if warmed else first_same_s).append(same_seconds)
                print(f"new ledger {cold + 1} ({'made at the switch' if warmed else 'not kept'}): view {view} "
                      f"records in {seconds:.3f} s; broker {same} records in {same_seconds:.3f} s", flush=True)
            # At the horizon (the view's last record, nothing after it): the ledger's answer and its relayed tail.
            at_ms, at_broker_ms = fetches(port, broker.port, args.fetches)
            # Records past the horizon, for the fetches past it.
            produce(pool, args.producers, workload, broker.bootstrap, produced, produced + 50 * PARTITIONS, TOPIC)
            relayed_ms, broker_ms = fetches(port, broker.port, args.fetches)
        view_m, same_m = statistics.median(view_s), statistics.median(same_s)
        first_m, first_same_m = statistics.median(first_s), statistics.median(first_same_s)
        warmed_m, warmed_same_m = statistics.median(warmed_s), statistics.median(warmed_same_s)
        relay_p50, broker_p50 = statistics.median(relayed_ms), statistics.median(broker_ms)
        at_p50, at_broker_p50 = statistics.median(at_ms), statistics.median(at_broker_ms)
        print(f"view_s={view_m:.2f} same_s={same_m:.2f} log_s={log_s:.2f} (medians of {args.runs} runs; log once)")
        print(f"first_view_s={first_m:.3f} first_same_s={first_same_m:.3f} (medians of {len(first_s)} first reads "
              f"of a ledger no batches are kept of: {' '.join(f'{s:.3f}' for s in first_s)})")
        print(f"warmed_view_s={warmed_m:.3f} warmed_same_s={warmed_same_m:.3f} (medians of {len(warmed_s)} first "
              f"reads of a ledger whose first pages were made at the switch: "
              f"{' '.join(f'{s:.3f}' for s in warmed_s)})")
        print("load average (1, 5, 15 min): before " + " ".join(f"{x:.2f}" for x in load_before)
              + ", after " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
        print(f"horizon_fetch_p50_ms listener={at_p50:.2f} broker={at_broker_p50:.2f} "
              f"(at the view's last record: its ledger answer and relayed tail)")
        print(f"tail_fetch_p50_ms relayed={relay_p50:.2f} broker={broker_p50:.2f} (past the horizon)")
        print(f"view/same={view_m / same_m:.2f}")
        print(f"view/log={view_m / log_s:.3f}")
        print(f"first/same={first_m / first_same_m:.2f}")
        print(f"warmed/same={warmed_m / warmed_same_m:.2f}")
        print(f"horizon_p50_added_ms={at_p50 - at_broker_p50:.2f}")
        print(f"relay_p50_added_ms={relay_p50 - broker_p50:.2f}")
        return 0
    finally:
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
