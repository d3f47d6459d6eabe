"""Against the real daemon (see #10): one rule for refusing to start, no code loaded
over HTTP, and an API that is not open by accident.

A refused start is ``python -m compactord run --config FILE`` in a subprocess (no broker is asked: the
daemon refuses before it connects); the HTTP tests share daemons started once for the module.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.daemon.conftest import OPEN_HOST, Launcher, assert_error, run_cli
from tests.support.daemon import DaemonProcess, wait_state, write_conf
from tests.support.plugins import IMPORT_MARKS_ENV

EXIT_CONFIG = 2
EXIT_IOERR = 74
REFUSE_TIMEOUT_S = 120.0
ADMIN_TOKEN = "admin-t0ken"
READ_TOKEN = "read-t0ken"
MAX_IN_FLIGHT = 4
LISTED = "tests.support.plugins.listed:ListedOrder"
UNLISTED = "tests.support.plugins.unlisted:UnlistedOrder"


@pytest.fixture(scope="module")
def marks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the plug-in modules of tests/support/plugins write a file when a daemon imports them."""
    return tmp_path_factory.mktemp("import-marks")


@pytest.fixture(scope="module")
def daemon(launch: Launcher, marks: Path, tmp_path_factory: pytest.TempPathFactory) -> DaemonProcess:
    """On loopback, with an admin token, a read token (both file:) and one strategy plug-in listed."""
    read_token = tmp_path_factory.mktemp("read-token") / "token"
    read_token.write_text(READ_TOKEN + "\n")
    prepared = launch.prepare("hardening", token=ADMIN_TOKEN, compactionStrategyPlugins=LISTED,
                              httpReadToken=f"file:{read_token}", httpMaxConnections=MAX_IN_FLIGHT)
    prepared.env[IMPORT_MARKS_ENV] = str(marks)
    return prepared.start().wait_ready()


def refused_start(tmp_path: Path, **conf: object) -> tuple[int, list[str]]:
    """Run the daemon with ``conf`` (broker.conf keys) and expect it to refuse: its exit status and the
    lines it wrote on stderr."""
    values: dict[str, object] = {"kafkaBootstrapServers": "127.0.0.1:9", "httpPort": 0,
                                 "compactedLedgerRoot": tmp_path / "ledgers", "sparkMaster": "local[1]"}
    values.update(conf)
    config = write_conf(tmp_path / "refused.conf", values)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTORD_")}
    result = subprocess.run([sys.executable, "-m", "compactord", "run", "--config", str(config)],
                            capture_output=True, text=True, timeout=REFUSE_TIMEOUT_S, check=False,
                            env=environment, stdin=subprocess.DEVNULL, cwd=tmp_path)
    return result.returncode, result.stderr.splitlines()


def assert_refused(result: tuple[int, list[str]], status: int, *words: str) -> str:
    code, lines = result
    assert code == status and len(lines) == 1, (code, lines)
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


# -- 0. one rule for refusing to start ------------------------------------------------------------


def test_a_bad_value_in_the_file_exits_2_with_one_line_naming_key_value_and_allowed(tmp_path: Path) -> None:
    assert_refused(refused_start(tmp_path, httpPort="eighty"), EXIT_CONFIG,
                   "httpPort", "eighty", "whole number")


def test_a_spark_master_typo_exits_2_with_one_line_naming_the_allowed_forms(tmp_path: Path) -> None:
    # Before the daemon logs anything or starts a JVM: no warning about executors on other machines.
    assert_refused(refused_start(tmp_path, sparkMaster="lcoal[2]"), EXIT_CONFIG,
                   "sparkMaster", "'lcoal[2]'", "local[N]", "local[*]", "spark://HOST:PORT", "yarn", "k8s://")


def test_a_spark_value_the_jvm_refuses_exits_2_with_the_jvm_s_own_reason(tmp_path: Path) -> None:
    """The JVM exits before its gateway answers: the refusal names the key, its value and the JVM's words, not
    only PySpark's JAVA_GATEWAY_EXITED."""
    code, lines = refused_start(tmp_path, **{"spark.driver.memory": "lots"})
    assert code == EXIT_CONFIG, lines
    assert lines[-1].startswith("compactord: cannot start: config key spark.driver.memory='lots' is invalid: "
                                "the Spark JVM did not start: Invalid maximum heap size: -Xmxlots"), lines
    assert not any("JAVA_GATEWAY_EXITED" in line for line in lines), lines


def test_a_bad_plugin_found_while_the_daemon_is_built_exits_2_with_one_line(tmp_path: Path) -> None:
    assert_refused(refused_start(tmp_path, compactionServiceFactoryClassName="no_such_module_x:Factory"),
                   EXIT_CONFIG, "compactionServiceFactoryClassName", "no_such_module_x:Factory", "cannot be imported")


def test_a_ledger_root_that_cannot_be_written_exits_74_with_one_line(tmp_path: Path) -> None:
    locked = tmp_path / "read-only"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("this user (root?) may write a 0555 folder: the root cannot be made unwritable here")
        line = assert_refused(refused_start(tmp_path, compactedLedgerRoot=locked / "ledgers"), EXIT_IOERR,
                              str(locked / "ledgers"))
        assert "compactedLedgerRoot" in line
    finally:
        locked.chmod(0o755)


def test_a_ledger_root_under_a_file_exits_74(tmp_path: Path) -> None:
    # What a root user meets too (a 0555 folder stops only others): the path cannot be a folder.
    (tmp_path / "not-a-folder").write_text("")
    assert_refused(refused_start(tmp_path, compactedLedgerRoot=tmp_path / "not-a-folder" / "ledgers"),
                   EXIT_IOERR, "not-a-folder", "compactedLedgerRoot")


def test_a_plugin_that_exits_on_import_refuses_the_start_with_2_not_its_own_code(tmp_path: Path) -> None:
    assert_refused(refused_start(tmp_path, compactionStrategyPlugins="tests.support.plugins.exits:X"),
                   EXIT_CONFIG, "compactionStrategyPlugins", "tests.support.plugins.exits:X", "SystemExit")


# -- 1. HTTP must not load code ---------------------------------------------------------------------


def test_a_listed_plugin_is_loaded_at_start_and_may_be_chosen(daemon: DaemonProcess, marks: Path,
                                                              kafka: Any) -> None:
    assert (marks / "tests.support.plugins.listed").read_text() == str(daemon.pid)  # loaded at start-up
    topic = kafka.topic(prefix="hardening")  # policies are stored for topics that exist
    response = daemon.http.put(f"/v1/topics/{topic}/policies", json={"strategy": LISTED})
    assert response.status_code == 200, response.text
    assert response.json()["effective"]["strategy"] == LISTED
    assert daemon.http.delete(f"/v1/topics/{topic}/policies").status_code == 200


@pytest.mark.parametrize("strategy", [UNLISTED, "unittest.__main__:X", "compactord.__main__:main"])
def test_a_strategy_that_is_not_allowed_answers_422_imports_nothing_and_the_daemon_stays_up(
        daemon: DaemonProcess, marks: Path, strategy: str) -> None:
    body = assert_error(daemon.http.put("/v1/topics/hardening-unlisted/policies", json={"strategy": strategy}),
                        422, "invalid_argument")
    assert strategy in body["message"] and "publishing-order" in body["message"] and LISTED in body["message"]
    assert not (marks / "tests.support.plugins.unlisted").exists(), "the daemon imported a module a request named"
    assert daemon.process is not None and daemon.process.poll() is None, daemon.log_tail()
    assert daemon.http.get("/healthz").status_code == 200
    # nothing was stored: the name is nowhere (the broker lacks it), as before the request
    assert_error(daemon.http.get("/v1/topics/hardening-unlisted/policies"), 404, "topic_not_found")
    assert not (daemon.root / "hardening-unlisted").exists()


# -- 2. an API that is not open by accident ---------------------------------------------------------


def test_an_empty_token_file_refuses_the_start_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("\n")
    assert_refused(refused_start(tmp_path, httpAuthToken=f"file:{tmp_path / 'token'}", httpBindAddress="0.0.0.0"),
                   EXIT_CONFIG, "httpAuthToken", f"file:{tmp_path / 'token'}", "empty")


def test_a_non_loopback_address_without_a_token_refuses_the_start(tmp_path: Path) -> None:
    assert_refused(refused_start(tmp_path, httpBindAddress="0.0.0.0"), EXIT_CONFIG,
                   "httpBindAddress", "0.0.0.0", "httpAuthToken", "httpAllowUnauthenticated=true")


@pytest.mark.parametrize(("typo", "meant"), [("httpAuthTokn", "httpAuthToken"),
                                             ("s3SecretAccesKey", "s3SecretAccessKey"),
                                             ("kafkaSaslPasword", "kafkaSaslPassword")])
def test_a_misspelled_secret_key_refuses_the_start_without_printing_its_value(tmp_path: Path, typo: str,
                                                                               meant: str) -> None:
    line = assert_refused(refused_start(tmp_path, **{typo: "hunter2-5b0f9e7a"}), EXIT_CONFIG,
                          f"unknown key {typo}; did you mean {meant}?")
    assert "hunter2-5b0f9e7a" not in line


READS = ["/v1/topics", "/v1/tasks", "/v1/info", "/v1/topics/hardening-read/compaction",
         "/v1/topics/hardening-read/horizon", "/v1/topics/hardening-read/history",
         "/v1/topics/hardening-read/compacted?partition=0", "/v1/topics/hardening-read/compacted/last?partition=0"]
ADMIN_ONLY = [("PUT", "/v1/topics/hardening-read/compaction"), ("DELETE", "/v1/topics/hardening-read/compaction"),
              ("GET", "/v1/topics/hardening-read/policies"), ("PUT", "/v1/topics/hardening-read/policies"),
              ("POST", "/v1/topics/hardening-read/unload"), ("POST", "/v1/topics/hardening-read/load"),
              ("DELETE", "/v1/topics/hardening-read"), ("GET", "/openapi.json")]


def test_the_read_token_reads(daemon: DaemonProcess) -> None:
    with daemon.client(token=READ_TOKEN) as reader:
        for path in READS:
            response = reader.get(path)
            assert response.status_code in (200, 404), f"{path}: {response.status_code} {response.text}"
            if response.status_code == 404:  # a name the broker lacks: the read got past auth
                assert response.json()["error"] == "topic_not_found", response.text


def test_the_read_token_is_refused_elsewhere_with_403_naming_the_admin_token(daemon: DaemonProcess) -> None:
    with daemon.client(token=READ_TOKEN) as reader:
        for method, path in ADMIN_ONLY:
            body = assert_error(reader.request(method, path, json={}), 403, "permission_denied")
            assert "httpAuthToken" in body["message"], body
    assert not (daemon.root / "hardening-read").exists()  # nothing the read token asked was done
    with daemon.client() as admin:  # the admin token may
        assert_error(admin.get("/v1/topics/hardening-read/policies"), 404, "topic_not_found")  # past auth
        assert admin.get("/openapi.json").status_code == 200
    with daemon.client(token=None) as anonymous:
        assert_error(anonymous.get("/v1/tasks"), 401, "unauthorized")


def test_strangers_uploads_that_never_end_do_not_take_the_places_of_authorised_requests(
        daemon: DaemonProcess) -> None:
    """Requests without the token (or with a foreign Host) are refused from their headers, before their
    body is read or they take one of the httpMaxConnections places."""
    heads = [b"", b"Authorization: Bearer wrong\r\n",
             f"Host: evil.example:{daemon.port}\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n".encode()]
    strangers = []
    try:
        for i in range(5 * MAX_IN_FLIGHT):
            sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=60)
            strangers.append(sock)
            head = heads[i % len(heads)]
            host = b"" if b"Host:" in head else b"Host: 127.0.0.1\r\n"
            sock.sendall(b"PUT /v1/topics/hardening-upload/policies HTTP/1.1\r\n" + host + head
                         + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n")
        with daemon.client() as admin:
            for _ in range(3 * MAX_IN_FLIGHT):
                assert admin.get("/v1/tasks").status_code == 200
        answers = []
        for sock in strangers:
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
            answers.append(int(data.split()[1]))
        # each refused from its headers, and its connection closed (its body was never read)
        assert [a for i, a in enumerate(answers) if i % 3 == 2] == [400] * (len(answers) // 3), answers
        assert all(a == 401 for i, a in enumerate(answers) if i % 3 != 2), answers
    finally:
        for sock in strangers:
            sock.close()


def test_a_token_that_matches_neither_is_401_also_with_a_read_token_set(daemon: DaemonProcess) -> None:
    with daemon.client(token=READ_TOKEN + "x") as stranger:
        for method, path in [("GET", "/v1/tasks"), ("GET", READS[-1]), *ADMIN_ONLY]:
            body = assert_error(stranger.request(method, path, json={}), 401, "unauthorized")
            assert "neither" in body["message"] and READ_TOKEN not in body["message"], body
    assert not (daemon.root / "hardening-read").exists()


def test_a_foreign_host_header_answers_400_on_loopback_but_probes_answer(daemon: DaemonProcess) -> None:
    with daemon.client() as admin:
        for host in ("evil.example", f"evil.example:{daemon.port}", "127.0.0.2"):
            body = assert_error(admin.get("/v1/tasks", headers={"Host": host}), 400, "host_not_allowed")
            assert "localhost" in body["message"]
        for host in (f"localhost:{daemon.port}", "127.0.0.1", f"[::1]:{daemon.port}"):
            assert admin.get("/v1/tasks", headers={"Host": host}).status_code == 200, host
        for path in ("/healthz", "/readyz", "/metrics"):
            assert admin.get(path, headers={"Host": "10.1.2.3:8642"}).status_code == 200, path
            assert admin.get(path, headers={"Host": "[fd00::5]:8642"}).status_code == 200, path
            assert admin.get(path, headers={"Host": "localhost"}).status_code == 200, path
            # a name that is not loopback's: a DNS-rebinding page reading the topics' backlogs
            assert_error(admin.get(path, headers={"Host": f"evil.example:{daemon.port}"}), 400, "host_not_allowed")


def test_allowed_hosts_when_bound_to_every_address(open_daemon: DaemonProcess) -> None:
    with open_daemon.client() as client:
        assert client.get("/v1/tasks", headers={"Host": f"{OPEN_HOST}:{open_daemon.port}"}).status_code == 200
        body = assert_error(client.get("/v1/tasks", headers={"Host": "evil.example"}), 400, "host_not_allowed")
        assert OPEN_HOST in body["message"]
        assert client.get("/metrics", headers={"Host": "10.1.2.3"}).status_code == 200


def test_a_post_without_a_token_must_say_json(open_daemon: DaemonProcess, kafka: Any) -> None:
    topic = kafka.topic(prefix="hardening")  # an unload is stored for topics that exist
    with httpx.Client(base_url=open_daemon.url, timeout=60.0) as browser_like:
        # what a web page can send cross-site without a CORS preflight: a POST with a "simple" content type
        for path, headers in [(f"/v1/topics/{topic}/unload", {}),
                              (f"/v1/topics/{topic}/unload", {"Content-Type": "text/plain"}),
                              (f"/v1/topics/{topic}/load", {"Content-Type": "application/x-www-form-urlencoded"})]:
            body = assert_error(browser_like.post(path, headers=headers, content=b"{}"), 415,
                                "unsupported_media_type")
            assert "application/json" in body["message"]
        assert not (open_daemon.root / topic).exists(), "a refused request did something"
        response = browser_like.post(f"/v1/topics/{topic}/unload", headers={"Content-Type": "application/json"})
        assert response.status_code == 200, response.text
        assert browser_like.post(f"/v1/topics/{topic}/load", json={}).status_code == 200


def test_put_and_delete_need_no_content_type(open_daemon: DaemonProcess, kafka: Any) -> None:
    """A browser sends PUT and DELETE cross-site only after a preflight that is never granted, so they are
    accepted as curl sends them (no Content-Type, no body)."""
    topic = kafka.topic(prefix="hardening")
    kafka.produce(topic, [("k", "v")])
    with httpx.Client(base_url=open_daemon.url, timeout=60.0) as curl_like:
        triggered = curl_like.put(f"/v1/topics/{topic}/compaction")
        assert triggered.status_code == 202, triggered.text
        assert "content-type" not in triggered.request.headers
        final = wait_state(open_daemon, topic, "Succeed", "Failed", "Cancelled")
        assert final["status"] == "SUCCESS", final
        again = curl_like.put(f"/v1/topics/{topic}/compaction", headers={"Content-Type": "text/plain"})
        assert again.status_code == 202, again.text
        wait_state(open_daemon, topic, "Succeed", "Failed", "Cancelled")
        assert_error(curl_like.delete(f"/v1/topics/{topic}/compaction"), 404, "no_task_running")  # past the guard
        deleted = curl_like.delete(f"/v1/topics/{topic}/policies", headers={"Content-Type": "text/plain"})
        assert deleted.status_code == 200, deleted.text


def test_options_never_grants_cors(open_daemon: DaemonProcess) -> None:
    with httpx.Client(base_url=open_daemon.url, timeout=60.0) as browser_like:
        for path in ("/v1/topics/t/compaction", "/v1/topics/t/unload", "/v1/topics/t", "/v1/tasks", "/healthz"):
            for method in ("PUT", "DELETE", "POST"):
                response = browser_like.options(path, headers={
                    "Origin": "https://evil.example", "Access-Control-Request-Method": method,
                    "Access-Control-Request-Headers": "content-type, authorization"})
                assert response.status_code >= 400, (path, method, response.status_code)
                granted = [h for h in response.headers if h.lower().startswith("access-control-")]
                assert not granted, (path, method, granted)


def test_the_cli_sends_json_on_its_state_changing_requests(open_daemon: DaemonProcess) -> None:
    result = run_cli("cancel", "hardening-cli", "--url", open_daemon.url, timeout=60)
    assert result.returncode == 1 and "no_task_running" in result.stderr, (result.returncode, result.stderr)
