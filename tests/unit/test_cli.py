"""The CLI without a daemon: its parser and help, its tables (what came from outside shown escaped, long
keys and values cut), and its errors (a daemon that is not there, one that answers 401, a URL that is
not HTTP or is another service's), with error texts that say what to do. The CLI against a real daemon
is in tests/daemon/test_cli.py and test_first_hour.py."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import kafka.errors as kerr
import pytest

from compactord.cli import _parser, main
from compactord.cli_tables import KEY_WIDTH, VALUE_WIDTH, print_body
from compactord.client import DaemonClient
from compactord.config import settings_from_properties
from compactord.embedded import free_port
from compactord.errors import BrokerUnavailable, ConfigError
from compactord.kafka.client import translate_kafka_errors
from tests.support.json_server import JsonHandler, serving
from tests.support.s3_server import S3Server

# A value as a producer may store it: a terminal title (OSC), a colour (CSI), a newline.
HOSTILE = "\x1b]0;pwned\x07\x1b[31mred\nline"
HOSTILE_SHOWN = "\\x1b]0;pwned\\x07\\x1b[31mred\\nline"  # as the CLI prints it: escaped, on one line


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = _parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_option_has_help_and_says_its_default() -> None:
    for name, sub in _subparsers().items():
        text = sub.format_help()
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
            if action.option_strings and action.default not in (None, argparse.SUPPRESS):
                assert f"(default: {action.default})" in text or "default" in action.help, (name, action.dest)
    read = " ".join(_subparsers()["read"].format_help().split())
    assert "the partition to read (default: every partition, one after the other)" in read
    assert "(default: 20)" in read and "needs --partition" in read
    assert "10000 per page are read a page at a time" in read
    assert "wait for the end, with a progress bar (default: False)" in _subparsers()["rebuild"].format_help()
    assert {"policies", "unload", "load", "delete-topic", "info", "tasks"} <= set(_subparsers())


def test_a_url_without_a_scheme_is_http() -> None:
    assert DaemonClient("127.0.0.1:8642").url == "http://127.0.0.1:8642"
    assert DaemonClient("https://h:1/").url == "https://h:1"


@pytest.mark.parametrize(("url", "problem"), [("ftp://127.0.0.1:8642", "its scheme is ftp"),
                                              ("http://", "it names no host"),
                                              ("127.0.0.1:http", "its port is not a number")])
def test_a_url_that_is_not_http_is_refused_naming_it(url: str, problem: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", url, "topics"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith(f"compactord: --url (COMPACTORD_URL): daemon URL {url!r}: {problem}"), err
    assert "give http://HOST:PORT or https://HOST:PORT" in err


def test_the_s3_server_s_address_is_named_as_not_the_api(s3_server: S3Server,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The S3 server answers HTTP (403 to a request without its signature), but not as compactord's API."""
    assert main(["--url", s3_server.endpoint, "topics"]) == 1
    err = capsys.readouterr().err.strip()
    address = s3_server.endpoint.removeprefix("http://")
    assert err.startswith(f"compactord: {address} answers HTTP 403"), err
    assert "but it is not compactord's API: is it another HTTP service's address" in err
    assert "point --url (COMPACTORD_URL) at the daemon's HTTP port" in err


def test_a_daemon_that_is_not_there_says_start_it_or_set_the_url(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"127.0.0.1:{free_port()}"
    assert main(["--url", url, "topics"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert f"cannot reach compactord at http://{url}: Connection refused" in err
    assert "start the daemon (compactord run)" in err and "--url (COMPACTORD_URL)" in err


class _Unauthorized(JsonHandler):
    message = "a bearer token is required"

    def do_GET(self) -> None:  # http.server's name
        self.send_json({"error": "unauthorized", "message": self.message}, status=401)


@pytest.fixture(params=[_Unauthorized.message])
def unauthorized(request: pytest.FixtureRequest) -> Iterator[str]:
    """A server that answers 401 with the API's error body; its message is the param."""
    with serving(_Unauthorized, message=request.param) as port:
        yield f"127.0.0.1:{port}"


def test_a_401_names_the_token_option_and_variable(unauthorized: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "t", "--url", unauthorized]) == 1
    err = capsys.readouterr().err
    assert "(401) unauthorized: a bearer token is required" in err
    assert "--token" in err and "COMPACTORD_TOKEN" in err


@pytest.mark.parametrize("unauthorized", [HOSTILE], indirect=True)
def test_a_server_s_message_is_shown_escaped(unauthorized: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "t", "--url", unauthorized]) == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and err.count("\n") == 1, repr(err)
    assert f"(401) unauthorized: {HOSTILE_SHOWN};" in err


@pytest.mark.parametrize("argv", [["delete-topic", "t"], ["policies", "t", "--set", "thresholdMessages"],
                                  ["policies", "t", "--set", "a=1", "--delete"], ["read", "t", "--start", "5"],
                                  ["read", "t", "--partition", "0", "--limit", "0"], ["read", "t", "--from", "1"],
                                  ["read", "t", "--from", "0:5", "--partition", "0"]])
def test_refused_command_lines_exit_2_before_asking_the_daemon(argv: list[str],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--url", f"127.0.0.1:{free_port()}"]) == 2  # nobody listens: not asked
    err = capsys.readouterr().err
    assert err.startswith("compactord: ") and "cannot reach" not in err


def test_tables_never_print_none(capsys: pytest.CaptureFixture[str]) -> None:
    status = {"topic": "t", "status": "NOT_RUN", "state": None, "task_id": None, "started_at": None,
              "finished_at": None, "last_error": None, "progress": {"records_read": 0, "records_total": 0}}
    print_body("status", status, as_json=False)
    print_body("topics", {"topics": [{"topic": "t", "on_broker": False, "backlog": None,
                                      "last_compaction": status}]}, as_json=False)
    print_body("read", {"entries": [{"partition": 0, "offset": 3, "key": None, "value": None}],
                        "next_start": None}, as_json=False)
    out = capsys.readouterr().out
    assert "None" not in out, out
    assert out.splitlines()[8].split() == ["t", "no", "-", "NOT_RUN", "-", "-"]


def test_a_start_without_a_partition_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["read", "t", "--start", "5", "--url", f"127.0.0.1:{free_port()}"]) == 2
    assert "--start is an offset within one partition: give --partition with it" in capsys.readouterr().err


def test_policies_columns_stay_aligned_with_a_long_key(capsys: pytest.CaptureFixture[str]) -> None:
    body = {"topic": "t", "policies": {"maxReadBytesPerSecond": 1048576, "strategy": None},
            "effective": {"maxReadBytesPerSecond": 1048576, "strategy": "publishing-order",
                          "thresholdMessages": 100000}}
    print_body("policies", body, as_json=False)
    header, *rows = capsys.readouterr().out.splitlines()[1:]
    starts = [header.index("KEY"), header.index("OVERRIDE"), header.index("IN FORCE")]
    assert len(rows) == 3
    for row in rows:
        cells = row.split()
        assert [row.index(cell, at) for cell, at in zip(cells, starts, strict=True)] == starts, (header, row)


def test_history_and_read_tables_align_every_column(capsys: pytest.CaptureFixture[str]) -> None:
    run = {"finished_at": "2026-01-01T00:00:00Z", "state": "Succeed", "reason": "threshold-messages",
           "records_read": 1234567890, "records_written": 5, "task_id": "x" * 36, "caller": None}
    print_body("history", {"runs": [run, {**run, "state": "Cancelled", "records_read": 7}], "next": None},
               as_json=False)
    header, first, second = capsys.readouterr().out.splitlines()
    read_end = header.index("READ") + len("READ")  # a number column: right-aligned
    assert first[:read_end].endswith(" 1234567890") and second[:read_end].endswith(" 7")
    assert header.index("TASK") == first.index("x" * 36) == second.index("x" * 36)


def test_a_kafka_error_is_named_once() -> None:
    with pytest.raises(BrokerUnavailable) as raised, translate_kafka_errors("b:9092"):
        raise kerr.KafkaTimeoutError("Unable to bootstrap from ['b:9092']")
    assert raised.value.message.count("KafkaTimeoutError") == 1, raised.value.message


def test_a_bad_value_from_the_environment_names_the_variable() -> None:
    with pytest.raises(ConfigError) as raised:
        settings_from_properties({"httpPort": "9000"}, env={"COMPACTORD_CONF_httpPort": "abc"})
    assert raised.value.key == "COMPACTORD_CONF_httpPort"
    assert "COMPACTORD_CONF_httpPort='abc'" in str(raised.value)
    with pytest.raises(ConfigError) as from_file:
        settings_from_properties({"httpPort": "abc"}, env={})
    assert from_file.value.key == "httpPort"


def _read_table(entries: list[dict[str, object]], capsys: pytest.CaptureFixture[str]) -> list[str]:
    print_body("read", {"entries": entries, "next_start": None}, as_json=False)
    return capsys.readouterr().out.splitlines()


def test_a_read_shows_control_characters_escaped_on_one_row(capsys: pytest.CaptureFixture[str]) -> None:
    """As the API answers in utf8 (text) and as the CLI reads for its table (bytes): the same row."""
    for value in (HOSTILE, HOSTILE.encode()):
        _, row = _read_table([{"partition": 0, "offset": 7, "key": "k\tey", "value": value}], capsys)
        assert "\x1b" not in row and "\x07" not in row, repr(row)
        assert row.split() == ["0", "7", "k\\tey", HOSTILE_SHOWN]
    # a backslash is doubled: a value that spells an escape is not taken for one
    assert _read_table([{"partition": 0, "offset": 1, "key": "k", "value": "a\\nb"}], capsys)[1].endswith("a\\\\nb")


def test_a_value_that_is_not_utf8_is_shown_escaped_beside_the_others(capsys: pytest.CaptureFixture[str]) -> None:
    rows = _read_table([{"partition": 0, "offset": 1, "key": b"k1", "value": b"\xff\xfeok\xc3"},
                        {"partition": 0, "offset": 2, "key": b"k2", "value": "é €".encode()}], capsys)
    assert [row.split() for row in rows[1:]] == [["0", "1", "k1", "\\xff\\xfeok\\xc3"], ["0", "2", "k2", "é", "€"]]


def test_an_empty_value_and_a_tombstone_look_different(capsys: pytest.CaptureFixture[str]) -> None:
    rows = _read_table([{"partition": 0, "offset": 1, "key": b"k1", "value": b""},
                        {"partition": 0, "offset": 2, "key": b"k2", "value": None},
                        {"partition": 0, "offset": 3, "key": None, "value": b"v"},
                        {"partition": 0, "offset": 4, "key": b"", "value": b"-"}], capsys)
    assert [row.split()[2:] for row in rows[1:]] == [["k1", '""'], ["k2", "(tombstone)"], ["(null)", "v"],
                                                     ['""', "-"]]


def test_long_keys_and_values_are_cut_with_a_marker(capsys: pytest.CaptureFixture[str]) -> None:
    """Ten entries, one of them with a 1 MB key: a few kB of output, the columns still aligned."""
    entries: list[dict[str, object]] = [{"partition": 0, "offset": i, "key": f"k{i}".encode(), "value": b"v"}
                                        for i in range(10)]
    entries[3] = {"partition": 0, "offset": 3, "key": b"K" * 1_000_000, "value": b"\x1b" * 1_000_000}
    header, *rows = _read_table(entries, capsys)
    assert len(rows) == 10 and sum(len(row) for row in rows) < 10 * (KEY_WIDTH + VALUE_WIDTH + 60)
    at_key, at_value = header.index("KEY"), header.index("VALUE")
    key, value = rows[3][at_key:at_value].rstrip(), rows[3][at_value:]
    assert key == "K" * KEY_WIDTH + f"...[+{1_000_000 - KEY_WIDTH} chars]"
    assert value == "\\x1b" * (VALUE_WIDTH // 4) + f"...[+{1_000_000 - VALUE_WIDTH // 4} chars]"
    assert {row[at_value:] for i, row in enumerate(rows) if i != 3} == {"v"}


def test_a_cancelled_run_is_shown_as_cancelled_not_as_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    run = {"topic": "t", "status": "ERROR", "state": "Cancelled", "task_id": "x", "started_at": None,
           "finished_at": "2026-01-01T00:00:00Z", "last_error": "the daemon is shutting down",
           "progress": {"records_read": 0, "records_total": 0}}
    print_body("topics", {"topics": [{"topic": "t", "on_broker": True, "backlog": None, "last_compaction": run},
                                     {"topic": "u", "on_broker": True, "backlog": None,
                                      "last_compaction": {**run, "state": "Failed", "last_error": "boom"}}]},
               as_json=False)
    _, cancelled, failed = capsys.readouterr().out.splitlines()
    assert cancelled.split()[3:5] == ["CANCELLED", "Cancelled"] and failed.split()[3:5] == ["ERROR", "Failed"]
    print_body("status", run, as_json=False)
    out = capsys.readouterr().out
    assert "status    CANCELLED" in out and "cancelled the daemon is shutting down" in out and "error" not in out
    print_body("tasks", {"tasks": [run]}, as_json=False)
    assert capsys.readouterr().out.splitlines()[1].split()[1:3] == ["CANCELLED", "Cancelled"]


def test_names_from_outside_are_shown_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    status = {"topic": HOSTILE, "status": "SUCCESS", "state": "Succeed", "finished_at": None}
    print_body("topics", {"topics": [{"topic": HOSTILE, "on_broker": True, "backlog": None,
                                      "last_compaction": status}]}, as_json=False)
    print_body("status", {**status, "last_error": HOSTILE, "progress": {}}, as_json=False)
    print_body("delete-topic", {"topic": HOSTILE, "deleted": True, "task": None}, as_json=False)
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out, repr(out)
    assert out.count(HOSTILE_SHOWN) == 4
