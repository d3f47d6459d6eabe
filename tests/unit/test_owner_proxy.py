"""A cluster member forwards the requests that change a topic to the topic's owner (``api/proxy.py``), over
real HTTP: the member is an ASGI app served by uvicorn, the owner a stand-in server that records what it got."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from compactord.api import proxy
from compactord.api.proxy import FORWARDED_HEADER, OwnerProxy, owned_topic
from compactord.daemon.cluster import Owner
from compactord.embedded import free_port
from tests.support.json_server import JsonHandler, serving

MEMBER = "http://127.0.0.1:1/member-a"


class _Owner(JsonHandler):
    """Records each request (method, path, headers, body) and answers 202 with Retry-After, as an owner's
    trigger answers; ``answer_bytes`` > 0: a body that large instead."""

    got: list[dict[str, Any]]
    answer_bytes = 0

    def _record(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.got.append({"method": self.command, "path": self.path, "headers": self.headers,  # case-insensitive
                         "body": self.rfile.read(length)})
        if self.answer_bytes:
            self.send_json("x" * self.answer_bytes)
            return
        data = json.dumps({"by": "owner"}).encode()
        self.send_response(202)
        self.send_header("Content-Type", "application/json")
        self.send_header("Retry-After", "7")
        self.send_header("X-Internal", "not passed on")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_PUT = do_POST = do_DELETE = do_GET = _record  # http.server's names


async def _local(request: Request) -> JSONResponse:
    return JSONResponse({"by": "member", "path": request.url.path})


@pytest.fixture
def owners() -> dict[str, Owner]:
    return {}


@pytest.fixture
def member(owners: dict[str, Owner]) -> Iterator[str]:
    """A member's API: every route answers itself ({"by": "member"}) unless the proxy forwards it; a topic's
    owner is what ``owners`` says (default: this member)."""
    app = Starlette(routes=[Route("/{path:path}", _local, methods=["GET", "PUT", "POST", "DELETE"])])
    wrapped = OwnerProxy(app, owner_of=lambda topic: owners.get(topic, Owner(here=True)), member=MEMBER,
                         timeout_s=5)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(wrapped, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="member", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the member's server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture
def owner() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    got: list[dict[str, Any]] = []
    with serving(_Owner, got=got) as port:
        yield f"http://127.0.0.1:{port}", got


def test_the_routes_that_change_a_topic_are_the_owner_s() -> None:
    assert owned_topic("PUT", "/v1/topics/t.1/compaction") == "t.1"
    assert owned_topic("DELETE", "/v1/topics/t/compaction") == "t"
    assert owned_topic("PUT", "/v1/topics/t/policies") == "t"
    assert owned_topic("POST", "/v1/topics/t/unload") == "t"
    assert owned_topic("POST", "/v1/topics/t/load") == "t"
    assert owned_topic("DELETE", "/v1/topics/t") == "t"
    # reads are every member's
    for method, path in [("GET", "/v1/topics/t/compaction"), ("GET", "/v1/topics/t/compacted"),
                         ("GET", "/v1/topics/t/policies"), ("GET", "/v1/topics"), ("GET", "/v1/topics/t/horizon")]:
        assert owned_topic(method, path) is None, (method, path)


def test_a_trigger_sent_to_a_member_is_carried_out_by_the_owner(
        member: str, owner: tuple[str, list[dict[str, Any]]], owners: dict[str, Owner]) -> None:
    url, got = owner
    owners["prices"] = Owner(here=False, url=url)
    answer = httpx.put(f"{member}/v1/topics/prices/compaction?rebuild=true", content=b'{"a": 1}',
                       headers={"Authorization": "Bearer s3cret", "Content-Type": "application/json"})
    assert (answer.status_code, answer.json()) == (202, {"by": "owner"})
    assert answer.headers["Retry-After"] == "7" and "X-Internal" not in answer.headers
    [request] = got
    assert (request["method"], request["path"], request["body"]) == ("PUT", "/v1/topics/prices/compaction?rebuild=true",
                                                                      b'{"a": 1}')
    assert request["headers"]["Authorization"] == "Bearer s3cret"
    assert request["headers"]["X-Compactord-Forwarded"] == MEMBER


def test_a_topic_owned_here_and_every_read_are_answered_here(
        member: str, owner: tuple[str, list[dict[str, Any]]], owners: dict[str, Owner]) -> None:
    url, got = owner
    owners["elsewhere"] = Owner(here=False, url=url)
    assert httpx.put(f"{member}/v1/topics/mine/compaction").json()["by"] == "member"
    assert httpx.get(f"{member}/v1/topics/elsewhere/compacted").json()["by"] == "member"
    assert httpx.get(f"{member}/v1/topics/elsewhere/compaction").json()["by"] == "member"
    assert got == []


def test_a_topic_without_an_owner_is_503_no_owner_with_retry_after(member: str, owners: dict[str, Owner]) -> None:
    owners["t"] = Owner(here=False, url=None)
    answer = httpx.post(f"{member}/v1/topics/t/unload")
    assert answer.status_code == 503 and answer.json()["error"] == "no_owner"
    assert answer.headers["Retry-After"] == "1"
    assert "rebalancing" in answer.json()["message"]


def test_a_forwarded_request_is_never_forwarded_again(
        member: str, owner: tuple[str, list[dict[str, Any]]], owners: dict[str, Owner]) -> None:
    url, got = owner
    owners["t"] = Owner(here=False, url=url)  # the topic moved on while the request was on its way here
    answer = httpx.delete(f"{member}/v1/topics/t", headers={FORWARDED_HEADER: "http://127.0.0.1:2"})
    assert answer.status_code == 503 and answer.json()["error"] == "no_owner"
    assert got == []


def test_an_owner_that_does_not_answer_is_503_owner_unreachable(member: str, owners: dict[str, Owner],
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    owners["t"] = Owner(here=False, url=f"http://127.0.0.1:{free_port()}")  # nothing listens there
    answer = httpx.put(f"{member}/v1/topics/t/policies", json={"thresholdBytes": 1})
    assert answer.status_code == 503 and answer.json()["error"] == "owner_unreachable"
    assert answer.headers["Retry-After"] == "1"
    assert "did not answer PUT /v1/topics/t/policies" in caplog.text  # the whole reason in the log only


def test_an_owner_s_answer_past_the_bound_is_not_passed_on(
        member: str, owners: dict[str, Owner], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(proxy, "MAX_ANSWER_BYTES", 1000)
    got: list[dict[str, Any]] = []
    with serving(_Owner, got=got, answer_bytes=5000) as port:
        owners["t"] = Owner(here=False, url=f"http://127.0.0.1:{port}")
        answer = httpx.put(f"{member}/v1/topics/t/compaction")
    assert answer.status_code == 503 and answer.json()["error"] == "owner_unreachable"
    assert got and "more than 1000 bytes" in caplog.text
