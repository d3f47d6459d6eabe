"""The examples of docs/http-api.md and docs/cli.md, run as written against a real daemon: every curl line of
the HTTP API's endpoint list and every command of the CLI's "Talking to a daemon" list, in the docs' order,
on a topic of their own. An example that names a route, a method, a content type, a command or an option
the daemon does not have fails here."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import Kafka
from tests.support.daemon import DaemonProcess

from .conftest import run_cli

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parents[2] / "docs"
DOC_TOPIC = "prices"  # the topic the examples name


def code_block_after(markdown: str, heading: str) -> list[str]:
    """The lines of the first fenced block after ``heading``."""
    rest = markdown[markdown.index(heading):]
    block = re.search(r"^```[^\n]*\n(.*?)^```", rest, flags=re.MULTILINE | re.DOTALL)
    assert block is not None, f"no code block after {heading!r}"
    return block.group(1).splitlines()


def command_words(line: str) -> list[str]:
    """A shell line's words without its trailing comment."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=False)
    lexer.whitespace_split, lexer.commenters = True, "#"
    return list(lexer)


@pytest.fixture(scope="module")
def doc_daemon(open_daemon: DaemonProcess) -> DaemonProcess:
    return open_daemon  # no token: the examples send none


@pytest.fixture
def topic(doc_daemon: DaemonProcess, kafka: Kafka) -> str:
    name = kafka.topic(partitions=2, prefix="docs")
    kafka.produce(name, [(f"k{i % 5}", f"v{i}", i % 2) for i in range(40)])
    return name


def test_the_http_api_examples(doc_daemon: DaemonProcess, topic: str) -> None:
    lines = code_block_after((DOCS / "http-api.md").read_text(encoding="utf-8"), "## Endpoints")
    headers_of = {"$J": "Content-Type: application/json"}
    ran = 0
    with doc_daemon.client(token=None) as http:
        for line in lines:
            words = command_words(line.replace('"$J"', "$J"))
            if not words or words[0] != "curl":
                continue
            method, headers, body, url = "GET", {}, None, None
            i = 1
            while i < len(words):
                word = words[i]
                if word == "-X":
                    method, i = words[i + 1], i + 2
                elif word == "-H":
                    name, _, value = headers_of.get(words[i + 1], words[i + 1]).partition(":")
                    headers[name.strip()] = value.strip()
                    i += 2
                elif word == "-d":
                    body, i = words[i + 1], i + 2
                else:
                    url, i = word, i + 1
            assert url is not None, line
            path = url.replace("http://127.0.0.1:8642", "").replace(f"/{DOC_TOPIC}/", f"/{topic}/")
            path = re.sub(rf"/{DOC_TOPIC}$", f"/{topic}", path)
            response = http.request(method, path, headers=headers, content=body)
            ran += 1
            assert response.status_code < 500 and response.status_code not in (405, 415, 422), (line, response.text)
            if response.status_code == 404:  # a domain answer (no such task, topic gone), never an unknown route
                assert response.json().get("error") not in (None, "not_found"), (line, response.text)
    assert ran >= 10, f"only {ran} curl examples found"


def test_the_cli_examples(doc_daemon: DaemonProcess, topic: str) -> None:
    lines = code_block_after((DOCS / "cli.md").read_text(encoding="utf-8"), "## Talking to a daemon")
    ran = 0
    for line in lines:
        words = command_words(line)
        if not words or words[0] != "compactord":
            continue
        args = [topic if word == DOC_TOPIC else word for word in words[1:]]
        result = run_cli("--url", doc_daemon.url, *args)
        ran += 1
        # 1: the daemon's answer (e.g. no task to cancel); 2 would be a usage error of the example itself
        assert result.returncode in (0, 1), (line, result.stderr)
        assert "Traceback" not in result.stderr and "usage:" not in result.stderr, (line, result.stderr)
    assert ran >= 8, f"only {ran} CLI examples found"
