"""The processes of librdkafka's reads (``compactord.kafka.probe_process``): a read whose process dies is asked
again of a new one, a second death or a hang is ``BrokerUnavailable``, and the caller goes on."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from compactord.errors import BrokerUnavailable
from compactord.kafka.probe_process import ProbeProcesses


def _pid() -> int:
    return os.getpid()


def _segfault() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)  # as librdkafka's thread rdk:main dies


def _segfault_once(marker: str) -> str:
    """Dies the first time (``marker`` absent), answers the second."""
    if not Path(marker).exists():
        Path(marker).touch()
        _segfault()
    return "answered"


def _noisy() -> str:
    print("a stray print")
    os.write(1, b"a native library's printf\n")  # as librdkafka's C would write to its stdout
    return "answered"


def _fails() -> None:
    raise RuntimeError("reading orders[0] at offset 4 failed: Broker: Unknown topic or partition")


@pytest.fixture
def processes() -> Iterator[ProbeProcesses]:
    pool = ProbeProcesses(workers=1, hung_margin_s=0.5)
    try:
        yield pool
    finally:
        pool.close()


def test_a_read_runs_in_another_process_and_its_error_is_raised_here(processes: ProbeProcesses) -> None:
    assert processes.call(_pid, timeout_s=30, what="a read of orders") != os.getpid()
    with pytest.raises(RuntimeError, match="Unknown topic or partition"):
        processes.call(_fails, timeout_s=30, what="a read of orders")
    assert processes.restarts == 0


def test_what_a_read_prints_to_stdout_never_reaches_its_answer(processes: ProbeProcesses) -> None:
    assert processes.call(_noisy, timeout_s=30, what="a read of orders") == "answered"
    assert processes.call(_noisy, timeout_s=30, what="a read of orders") == "answered"
    assert processes.restarts == 0


def test_a_read_whose_process_dies_is_asked_again_of_a_new_one(processes: ProbeProcesses, tmp_path: Path) -> None:
    first = processes.call(_pid, timeout_s=30, what="a read of orders")
    assert processes.call(_segfault_once, str(tmp_path / "died"), timeout_s=30, what="a read of orders") == "answered"
    assert processes.restarts == 1
    assert processes.call(_pid, timeout_s=30, what="a read of orders") != first  # the new process answers


def test_a_second_death_is_broker_unavailable_and_the_next_read_is_answered(processes: ProbeProcesses) -> None:
    with pytest.raises(BrokerUnavailable, match="crashed twice in a read of orders"):
        processes.call(_segfault, timeout_s=30, what="a read of orders")
    assert processes.restarts == 2
    assert processes.call(_pid, timeout_s=30, what="a read of orders") != os.getpid()


def test_a_hung_read_is_broker_unavailable_and_its_process_is_killed(processes: ProbeProcesses) -> None:
    hung = processes.call(_pid, timeout_s=30, what="a read of orders")
    with pytest.raises(BrokerUnavailable, match="hung in a read of orders"):
        processes.call(time.sleep, 60, timeout_s=0.5, what="a read of orders")
    deadline = time.monotonic() + 10
    while _alive(hung) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(hung)
    assert processes.call(_pid, timeout_s=30, what="a read of orders") != hung


def test_a_closed_pool_refuses_reads(processes: ProbeProcesses) -> None:
    processes.close()
    with pytest.raises(BrokerUnavailable, match="stopping"):
        processes.call(_pid, timeout_s=30, what="a read of orders")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (killed, not yet reaped by the pool's manager thread) is dead too.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ", 1)[1].startswith("Z"))
