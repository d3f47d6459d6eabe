"""Every client command of the ``compactord`` CLI, run as a subprocess against the shared daemon.

``--url`` and ``--token`` work before and after the subcommand, ``COMPACTORD_URL`` and
``COMPACTORD_TOKEN`` stand in for them, ``--json`` prints the API's body unchanged, and an error is
one line on stderr with a non-zero exit. What a producer stored reaches the terminal escaped; ``compact
--wait`` attaches to a compaction already running (on a daemon of its own, whose runs wait at a gate
the test opens). (``cancel`` of a running task is in ``test_tasks.py``, whose daemon holds tasks long
enough to cancel them.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compactord import cli
from compactord.cli import main
from compactord.embedded import free_port
from tests.support.daemon import DaemonProcess, wait_state
from tests.support.timeouts import TASK_TIMEOUT_S
from tests.support.waiting import wait_for

from .conftest import SHARED_TOKEN, run_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env(shared_daemon: DaemonProcess) -> dict[str, str]:
    return {"COMPACTORD_URL": shared_daemon.url, "COMPACTORD_TOKEN": SHARED_TOKEN}


@pytest.fixture(scope="module")
def compacted(shared_daemon: DaemonProcess, kafka: Any, env: dict[str, str]) -> dict[str, Any]:
    """A topic compacted with ``compact --wait`` (the URL before the subcommand, the token from the env)."""
    topic = kafka.topic(partitions=2, prefix="cli")
    kafka.produce(topic, [(f"k{i % 6}", f"v{i}", i % 2) for i in range(24)])
    result = run_cli("--url", shared_daemon.url, "compact", topic, "--wait",
                     env={"COMPACTORD_TOKEN": SHARED_TOKEN})
    return {"topic": topic, "result": result}


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (
        f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}")
    assert "Traceback" not in result.stderr
    return result.stdout


def failed(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """The command failed with one line on stderr that holds every fragment."""
    assert result.returncode != 0, result.stdout
    message = result.stderr.strip()
    assert message.count("\n") == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert message.startswith("compactord: "), message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_compact_wait(compacted: dict[str, Any]) -> None:
    out = ok(compacted["result"])
    assert "status    SUCCESS" in out and "state     Succeed" in out
    assert "24/24 records" in out


def test_status(shared_daemon: DaemonProcess, compacted: dict[str, Any], env: dict[str, str]) -> None:
    topic = compacted["topic"]
    # the URL and token after the subcommand
    out = ok(run_cli("status", topic, "--url", shared_daemon.url, "--token", SHARED_TOKEN))
    assert "status    SUCCESS" in out
    body = json.loads(ok(run_cli("status", topic, "--json", env=env)))
    assert body == shared_daemon.http.get(f"/v1/topics/{topic}/compaction").json()
    # --json before the subcommand, too
    assert json.loads(ok(run_cli("--json", "status", topic, env=env))) == body


def test_horizon(shared_daemon: DaemonProcess, compacted: dict[str, Any], env: dict[str, str]) -> None:
    topic = compacted["topic"]
    out = ok(run_cli("horizon", topic, env=env))
    assert topic in out and "PARTITION" in out
    assert [line.split() for line in out.splitlines()[2:]] == [["0", "11"], ["1", "11"]]
    body = json.loads(ok(run_cli("horizon", topic, "--json", env=env)))
    assert body == shared_daemon.http.get(f"/v1/topics/{topic}/horizon").json()


def test_read(shared_daemon: DaemonProcess, compacted: dict[str, Any], env: dict[str, str]) -> None:
    topic = compacted["topic"]
    out = ok(run_cli("read", topic, "--partition", "1", env=env))
    rows = [line.split() for line in out.splitlines()[1:]]
    assert rows == [["1", "9", "k1", "v19"], ["1", "10", "k3", "v21"], ["1", "11", "k5", "v23"]]
    paged = ok(run_cli("read", topic, "--partition", "0", "--limit", "2", env=env))
    assert "(more: --start 11)" in paged
    args = ["read", topic, "--partition", "0", "--start", "10", "--limit", "2", "--encoding", "base64"]
    body = json.loads(ok(run_cli(*args, "--json", env=env)))
    query: dict[str, str | int] = {"partition": 0, "start": 10, "limit": 2, "encoding": "base64"}
    assert body == shared_daemon.http.get(f"/v1/topics/{topic}/compacted", params=query).json()
    assert [e["offset"] for e in body["entries"]] == [10, 11]
    assert body["next_start"] is None


def test_read_every_partition(compacted: dict[str, Any], env: dict[str, str]) -> None:
    """Without --partition: each partition in turn, --limit a total across them."""
    topic = compacted["topic"]
    rows = [line.split() for line in ok(run_cli("read", topic, env=env)).splitlines()]
    assert rows[0] == ["PARTITION", "OFFSET", "KEY", "VALUE"]
    assert rows[1:] == [["0", "9", "k0", "v18"], ["0", "10", "k2", "v20"], ["0", "11", "k4", "v22"],
                        ["1", "9", "k1", "v19"], ["1", "10", "k3", "v21"], ["1", "11", "k5", "v23"]]
    four = ok(run_cli("read", topic, "--limit", "4", env=env)).splitlines()
    assert [row.split()[:2] for row in four[1:-1]] == [["0", "9"], ["0", "10"], ["0", "11"], ["1", "9"]]
    assert four[-1] == "(more: --from 1:10)"
    assert ok(run_cli("read", topic, "--limit", "3", env=env)).splitlines()[-1] == "(more: --from 1:9)"
    body = json.loads(ok(run_cli("read", topic, "--json", env=env)))
    assert [(e["partition"], e["offset"]) for e in body["entries"]] == [(p, o) for p in (0, 1) for o in (9, 10, 11)]
    assert (body["next_partition"], body["next_start"]) == (None, None)
    failed(run_cli("read", topic, "--start", "10", env=env), "--start", "--partition")


def test_read_pages_through_a_limit_above_the_page_bound(shared_daemon: DaemonProcess, compacted: dict[str, Any],
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A page bound of 2 stands in for the API's 10000: --limit 5 takes pages of 2, 1, 2 across partitions."""
    monkeypatch.setattr(cli, "PAGE_LIMIT", 2)
    argv = ["--url", shared_daemon.url, "--token", SHARED_TOKEN, "read", compacted["topic"], "--json"]
    assert main([*argv, "--limit", "5"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert [(e["partition"], e["offset"]) for e in body["entries"]] == [(0, 9), (0, 10), (0, 11), (1, 9), (1, 10)]
    assert (body["next_partition"], body["next_start"]) == (1, 11)
    assert main([*argv, "--partition", "1", "--start", "10", "--limit", "100"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert [e["offset"] for e in body["entries"]] == [10, 11] and body["next_start"] is None


def test_topics_and_tasks(shared_daemon: DaemonProcess, compacted: dict[str, Any],
                          env: dict[str, str]) -> None:
    topic = compacted["topic"]
    line = next(row for row in ok(run_cli("topics", env=env)).splitlines() if row.startswith(topic))
    assert "SUCCESS" in line and "Succeed" in line
    topics = json.loads(ok(run_cli("topics", "--json", env=env)))
    assert topic in {t["topic"] for t in topics["topics"]}
    tasks_out = ok(run_cli("tasks", env=env))
    assert any(row.startswith(topic) and "SUCCESS" in row for row in tasks_out.splitlines())
    tasks = json.loads(ok(run_cli("tasks", "--json", env=env)))
    assert tasks == shared_daemon.http.get("/v1/tasks").json()


def test_rebuild(shared_daemon: DaemonProcess, compacted: dict[str, Any], env: dict[str, str]) -> None:
    topic = compacted["topic"]
    before = shared_daemon.http.get(f"/v1/topics/{topic}/horizon").json()
    body = json.loads(ok(run_cli("rebuild", topic, "--wait", "--json", env=env)))
    assert body == shared_daemon.http.get(f"/v1/topics/{topic}/compaction").json()
    assert body["status"] == "SUCCESS"
    # a full rebuild re-reads all 24 records (an incremental run would have nothing to read)
    assert body["progress"]["records_read"] == 24
    after = shared_daemon.http.get(f"/v1/topics/{topic}/horizon").json()
    assert after["ledger_id"] > before["ledger_id"]
    assert after["partitions"] == before["partitions"]


def test_history(shared_daemon: DaemonProcess, compacted: dict[str, Any], env: dict[str, str]) -> None:
    """After ``test_rebuild`` (in file order): the topic's two runs, newest first, one page at a time."""
    topic = compacted["topic"]
    body = json.loads(ok(run_cli("history", topic, "--json", "--limit", "1", env=env)))
    [newest] = body["runs"]
    assert (newest["reason"], newest["state"], newest["records_read"]) == ("rebuild", "Succeed", 24)
    assert body["next"] is not None
    older = json.loads(ok(run_cli("history", topic, "--json", "--limit", "1", "--cursor", body["next"], env=env)))
    [first] = older["runs"]
    assert (first["reason"], first["caller"], first["records_written"], older["next"]) == \
        ("manual", "127.0.0.1", 6, None)
    assert newest["ledger_before"] == first["ledger_after"] and newest["ledger_after"] > first["ledger_after"]
    table = ok(run_cli("history", topic, env=env)).splitlines()
    assert table[0].split()[:3] == ["FINISHED", "STATE", "REASON"]
    assert [row.split()[2] for row in table[1:]] == ["rebuild", "manual"]
    failed(run_cli("history", topic, "--cursor", "not-a-cursor", env=env), "cursor", "next")


def test_compact_without_wait(shared_daemon: DaemonProcess, kafka: Any, env: dict[str, str]) -> None:
    topic = kafka.topic(prefix="cli")
    kafka.produce(topic, [("k", "v")])
    body = json.loads(ok(run_cli("compact", topic, "--json", env=env)))
    assert body["topic"] == topic and body["status"] == "RUNNING"
    final = wait_state(shared_daemon, topic, "Succeed", "Failed")
    assert final["task_id"] == body["task_id"] and final["status"] == "SUCCESS"


def test_errors_are_one_line(shared_daemon: DaemonProcess, compacted: dict[str, Any],
                             env: dict[str, str]) -> None:
    failed(run_cli("compact", "cli-no-such-topic", env=env), "404", "topic_not_found", "cli-no-such-topic")
    failed(run_cli("horizon", "cli-no-such-topic", env=env), "404", "topic_not_found")
    failed(run_cli("read", compacted["topic"], "--partition", "9", env=env), "422", "partition 9")
    failed(run_cli("read", compacted["topic"], "--limit", "0", env=env), "--limit must be at least 1")
    failed(run_cli("history", "cli-no-such-topic", env=env), "404", "topic_not_found", "cli-no-such-topic")
    failed(run_cli("status", "bad/name", env=env), "422", "invalid_topic_name")
    failed(run_cli("status", compacted["topic"], env={"COMPACTORD_URL": shared_daemon.url}), "401")
    failed(run_cli("status", compacted["topic"], env={**env, "COMPACTORD_TOKEN": "wrong"}), "401")
    down = f"http://127.0.0.1:{free_port()}"
    failed(run_cli("--url", down, "topics"), "cannot reach compactord", down)
    failed(run_cli("status", "t", env={"COMPACTORD_URL": down}), "cannot reach compactord")


def test_the_more_line_of_a_read_across_partitions_continues_every_partition(compacted: dict[str, Any],
                                                                            env: dict[str, str]) -> None:
    """Following each ``(more: ...)`` line reads every entry of every partition once, in order."""
    topic = compacted["topic"]
    seen: list[list[str]] = []
    args = ["read", topic, "--limit", "2"]
    while True:
        *rows, last = ok(run_cli(*args, env=env)).splitlines()
        if not last.startswith("(more: "):
            rows.append(last)
            seen += [row.split()[:2] for row in rows[1:]]
            break
        seen += [row.split()[:2] for row in rows[1:]]
        args = ["read", topic, "--limit", "2", *last.removeprefix("(more: ").removesuffix(")").split()]
    assert seen == [[str(p), str(o)] for p in (0, 1) for o in (9, 10, 11)]
    failed(run_cli("read", topic, "--from", "7:0", env=env), "--from 7:0", "partitions are 0, 1")


def test_stored_bytes_reach_the_terminal_escaped(shared_daemon: DaemonProcess, kafka: Any,
                                                 env: dict[str, str]) -> None:
    """A value that would retitle the terminal, colour it and break the row; one that is not UTF-8; an
    empty one: each on its own row, escaped, beside the others; --json keeps the stored bytes."""
    hostile = "\x1b]0;pwned\x07\x1b[31mred\nline"
    topic = kafka.topic(prefix="cli")
    kafka.produce(topic, [("a", hostile), ("b", b"\xff\xfebin"), ("c", b""), ("d\x1b[2J", "plain")])
    assert ok(run_cli("compact", topic, "--wait", env=env))
    out = ok(run_cli("read", topic, env=env))
    assert "\x1b" not in out and "\x07" not in out, repr(out)
    _, *rows = out.splitlines()
    assert [row.split(maxsplit=3) for row in rows] == [
        ["0", "0", "a", "\\x1b]0;pwned\\x07\\x1b[31mred\\nline"], ["0", "1", "b", "\\xff\\xfebin"],
        ["0", "2", "c", '""'], ["0", "3", "d\\x1b[2J", "plain"]]
    body = json.loads(ok(run_cli("read", topic, "--json", "--encoding", "base64", env=env)))
    assert [e["value"] for e in body["entries"]][:2] == ["G10wO3B3bmVkBxtbMzFtcmVkCmxpbmU=", "//5iaW4="]


def test_delete_topic_of_a_name_that_exists_nowhere_fails(env: dict[str, str]) -> None:
    failed(run_cli("delete-topic", "cli-never-existed", "--yes", env=env), "404", "topic_not_found",
           "cli-never-existed")


def test_a_url_that_is_not_http_is_refused(env: dict[str, str]) -> None:
    result = run_cli("--url", "ftp://127.0.0.1:8642", "topics", env={"COMPACTORD_TOKEN": SHARED_TOKEN})
    assert result.returncode == 2
    failed(result, "'ftp://127.0.0.1:8642'", "its scheme is ftp", "http://HOST:PORT or https://HOST:PORT")


@pytest.fixture
def gated(open_daemon: DaemonProcess, open_gate: Path) -> Iterator[tuple[DaemonProcess, Path]]:
    """A daemon whose runs wait in Running until the gate file exists (it is removed for the test)."""
    open_gate.unlink()
    try:
        yield open_daemon, open_gate
    finally:
        open_gate.touch()


def test_compact_wait_attaches_to_a_compaction_already_running(gated: tuple[DaemonProcess, Path],
                                                               kafka: Any) -> None:
    daemon, gate = gated
    topic = kafka.topic(prefix="cli")
    kafka.produce(topic, [(f"k{i % 3}", f"v{i}") for i in range(9)])
    response = daemon.http.put(f"/v1/topics/{topic}/compaction")
    assert response.status_code == 202, response.text
    running = response.json()["task_id"]
    wait_state(daemon, topic, "Running")
    # without --wait, the 409 is the answer
    failed(run_cli("--url", daemon.url, "compact", topic), "409", "compaction_already_running")
    cli = subprocess.Popen([sys.executable, "-m", "compactord", "--url", daemon.url, "compact", topic, "--wait"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    err: list[str] = []
    assert cli.stderr is not None
    stderr = cli.stderr
    reader = threading.Thread(target=lambda: err.extend(iter(lambda: stderr.read(1), "")), daemon=True)
    reader.start()
    try:
        said = f"compactord: a compaction of {topic} is already running (task {running}, manual): waiting for it"
        wait_for(lambda: said in "".join(err) or cli.poll() is not None, TASK_TIMEOUT_S,
                 "compact --wait to attach to the running compaction", daemon)
        assert said in "".join(err), "".join(err)
        gate.touch()
        cli.wait(timeout=TASK_TIMEOUT_S)
        out = cli.stdout.read() if cli.stdout is not None else ""
    finally:
        gate.touch()
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    reader.join(timeout=10)
    assert cli.returncode == 0, (out, "".join(err))
    assert "status    SUCCESS" in out and f"task      {running}" in out and "9/9 records" in out
    assert "Traceback" not in "".join(err)
