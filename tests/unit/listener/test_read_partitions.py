"""A fetch's partitions read from a topic's ledger (``TopicView.read_partitions``): all from the ledger that was
current when the fetch began even when a switch comes between two of them, and all again from the current one
when that ledger is retired past its grace during the reads; the check of the broker's topic made once, a
recreated topic served by none; a partition that cannot be read has its own error while the others are answered;
the reads within the fetch's bytes, the ones left once they are spent not made. The daemon's ledgers are the
stand-in of ``tests/support/ledger_host.py``."""

from __future__ import annotations

from kafka.record.memory_records import MemoryRecords

from compactord.errors import LedgerCorrupt, TopicRecreated
from compactord.listener.batches import BatchCache
from compactord.listener.view import PartitionRead, TopicView
from compactord.model import CompactedRows, Entry, LedgerManifest, Position, StrategySettings
from tests.support.ledger_host import LedgerHost, Ledgers

TOPIC = "prices"
PARTITIONS = 4
READS = [PartitionRead(p, 0, 1 << 20) for p in range(PARTITIONS)]


class Switching(Ledgers):
    """Ledger 1 of ``PARTITIONS`` partitions (two records each), replaced by ledger 2 once its first page is read;
    within its grace (``grace``) a retired ledger stays readable, as the daemon's do; ``failing``: partitions
    whose pages cannot be read."""

    def __init__(self, grace: bool = True, failing: frozenset[int] = frozenset()) -> None:
        super().__init__(TOPIC)
        self.grace = grace
        self.failing = failing
        self.horizon = dict.fromkeys(range(PARTITIONS), 9)
        self.add(1, [Entry(p, o, f"k{p}-{o}".encode(), b"one" * 10) for p in range(PARTITIONS) for o in (3, 4)],
                 self.horizon)

    def ledger_info(self, ledger_id: int | None = None) -> LedgerManifest | None:
        if self.grace and ledger_id in self.retired:
            self.infos += 1
            return LedgerManifest(ledger_id=ledger_id, topic=self.topic, horizon=dict(self.ledgers[ledger_id][0]),
                                  strategy=StrategySettings(), files=[], created_at_ms=1000 + ledger_id)
        return super().ledger_info(ledger_id)

    def read_compacted_rows(self, start: Position, n: int, include_markers: bool = False,
                            ledger_id: int | None = None, max_bytes: int | None = None) -> CompactedRows:
        if start.partition in self.failing:
            raise LedgerCorrupt(f"partition {start.partition} cannot be read", file="part-0.parquet")
        rows = super().read_compacted_rows(start, n, include_markers, ledger_id, max_bytes)
        if self.current == 1:
            self.add(2, [Entry(p, 5, f"k{p}".encode(), b"two") for p in range(PARTITIONS)], self.horizon)
        return rows


class CheckedHost(LedgerHost):
    """The stand-in's daemon, counting its identity checks, answering ``recreated`` when told to."""

    def __init__(self, ledgers: Ledgers) -> None:
        super().__init__(ledgers)
        self.checks = 0
        self.recreated = False

    def check(self, topic: str, manifest: LedgerManifest) -> None:
        self.checks += 1
        if self.recreated:
            raise TopicRecreated(topic, "the topic id changed")


def _first(records: bytes) -> tuple[int, bytes | None]:
    batch = MemoryRecords(records).next_batch()
    assert batch is not None
    record = next(iter(batch))
    return record.offset, record.value


def _offsets(records: bytes) -> list[int]:
    batches, found = MemoryRecords(records), []
    while (batch := batches.next_batch()) is not None:
        found += [r.offset for r in batch]
    return found


def test_a_fetch_s_partitions_are_read_from_one_ledger_while_a_switch_comes() -> None:
    ledgers = Switching()
    host = CheckedHost(ledgers)

    found = TopicView(host, BatchCache()).read_partitions(TOPIC, READS, None)  # type: ignore[arg-type]

    assert ledgers.current == 2  # switched after the first page was read
    assert {p: (a.ledger_id, _first(a.records)) for p, a in found.answers.items()} == \
        dict.fromkeys(range(PARTITIONS), (1, (3, b"one" * 10)))
    assert host.checks == 1 and found.unread == []


def test_a_ledger_retired_past_its_grace_during_the_reads_is_read_again_whole_from_the_current_one() -> None:
    ledgers = Switching(grace=False)

    found = TopicView(LedgerHost(ledgers), BatchCache()).read_partitions(TOPIC, READS, None)  # type: ignore[arg-type]

    assert {p: (a.ledger_id, _first(a.records)) for p, a in found.answers.items()} == \
        dict.fromkeys(range(PARTITIONS), (2, (5, b"two")))


def test_a_recreated_topic_is_served_by_none_of_its_partitions() -> None:
    host = CheckedHost(Switching())
    host.recreated = True

    found = TopicView(host, BatchCache()).read_partitions(TOPIC, READS, None)  # type: ignore[arg-type]

    assert (found.answers, host.checks) == ({}, 1)


def test_a_partition_that_cannot_be_read_has_its_error_and_the_others_are_answered() -> None:
    ledgers = Switching(failing=frozenset({0}))

    found = TopicView(LedgerHost(ledgers), BatchCache()).read_partitions(TOPIC, READS, None)  # type: ignore[arg-type]

    assert isinstance(found.answers.pop(0), LedgerCorrupt)
    assert {p: a.ledger_id for p, a in found.answers.items()} == {1: 1, 2: 1, 3: 1}


def test_the_reads_stay_within_the_fetch_s_bytes_and_those_left_once_they_are_spent_are_not_made() -> None:
    ledgers = Switching()
    view = TopicView(LedgerHost(ledgers), BatchCache())  # type: ignore[arg-type]
    one_partition = len(view.read_partitions(TOPIC, READS[:1], 1).answers[0].records)

    found = view.read_partitions(TOPIC, READS, 1, budget=one_partition + 1)

    # Partition 0 spends all but a byte; partition 1 has that byte (a record at least); none is left for 2 and 3.
    assert sorted(found.answers) == [0, 1] and found.unread == [2, 3]
    assert _offsets(found.answers[0].records) == [3, 4] and _offsets(found.answers[1].records)[:1] == [3]
    assert found.spent == sum(len(a.records) for a in found.answers.values())  # type: ignore[union-attr]
