"""The API's guard, decided on method, path and headers alone (the daemon tests drive it over HTTP)."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from compactord.api.auth import check_bearer_token, check_content_type, check_host, is_read_endpoint
from compactord.errors import AuthenticationRequired, HostNotAllowed, PermissionDenied, UnsupportedMediaType

ADMIN, READ = b"admin", b"read"


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:8642", "127.0.0.1", "127.0.0.1:1", "[::1]",
                                  "[::1]:8642", "::1"])
def test_loopback_names_pass_when_bound_to_loopback(host: str) -> None:
    check_host(host, loopback=True, allowed=())


@pytest.mark.parametrize("host", [None, "", "evil.example", "evil.example:8642", "127.0.0.2", "localhost.evil",
                                  "localhost:80x", "[::1", "10.0.0.5:8642"])
def test_other_names_are_refused_when_bound_to_loopback(host: str | None) -> None:
    with pytest.raises(HostNotAllowed) as raised:
        check_host(host, loopback=True, allowed=())
    assert "localhost, 127.0.0.1 or [::1]" in str(raised.value)


def test_allowed_hosts_when_not_bound_to_loopback() -> None:
    check_host("anything.example:1", loopback=False, allowed=())  # empty: any
    allowed = ("compactord.example", "10.0.0.5:8642")
    check_host("Compactord.Example:8642", loopback=False, allowed=allowed)
    check_host("10.0.0.5:8642", loopback=False, allowed=allowed)
    for bad in ("evil.example", "10.0.0.5:9999", "localhost", None):
        with pytest.raises(HostNotAllowed):
            check_host(bad, loopback=False, allowed=allowed)


@pytest.mark.parametrize(("method", "path", "read"), [
    ("GET", "/v1/topics", True), ("GET", "/v1/tasks", True), ("HEAD", "/v1/topics/t/compaction", True),
    ("GET", "/v1/topics/t/horizon", True), ("GET", "/v1/topics/t/compacted", True),
    ("GET", "/v1/topics/t/compacted/last", True), ("GET", "/v1/topics/t/history", True),
    ("GET", "/v1/topics/t/compaction/preview", False), ("POST", "/v1/topics/t/compaction/preview", False),
    ("PUT", "/v1/topics/t/compaction", False), ("DELETE", "/v1/topics/t/compaction", False),
    ("GET", "/v1/topics/t/policies", False), ("POST", "/v1/topics/t/unload", False),
    ("DELETE", "/v1/topics/t", False), ("GET", "/v1/topics/t", False), ("GET", "/docs", False),
    ("GET", "/v1/topics/t/compacted/last/x", False), ("GET", "/v1/topics/a/b/horizon", False),
])
def test_the_read_token_allows_the_reads_only(method: str, path: str, read: bool) -> None:
    assert is_read_endpoint(method, path) is read
    check_bearer_token("Bearer admin", ADMIN, READ, method, path)  # the admin token allows everything
    if read:
        check_bearer_token("Bearer read", ADMIN, READ, method, path)
    else:
        with pytest.raises(PermissionDenied) as raised:
            check_bearer_token("Bearer read", ADMIN, READ, method, path)
        assert "httpAuthToken" in str(raised.value) and "httpReadToken" in str(raised.value)


def test_no_token_or_one_that_matches_neither_is_401() -> None:
    with pytest.raises(AuthenticationRequired):
        check_bearer_token("", ADMIN, READ, "GET", "/v1/topics")
    for read_token in (READ, b""):  # with a read token configured or not (an empty one matches nothing)
        for method, path in (("GET", "/v1/topics"), ("PUT", "/v1/topics/t/compaction")):
            with pytest.raises(AuthenticationRequired) as raised:
                check_bearer_token("Bearer other", ADMIN, read_token, method, path)
            assert raised.value.status == 401 and "neither" in str(raised.value)
    with pytest.raises(AuthenticationRequired):
        check_bearer_token("Bearer read", ADMIN, b"", "GET", "/v1/topics")
    with pytest.raises(PermissionDenied) as denied:  # a valid token without the right
        check_bearer_token("Bearer read", ADMIN, READ, "PUT", "/v1/topics/t/compaction")
    assert denied.value.status == 403


def test_a_post_without_authorization_must_say_json() -> None:
    check_content_type("POST", Headers({"content-type": "application/json"}))
    check_content_type("POST", Headers({"content-type": "Application/JSON; charset=utf-8"}))
    check_content_type("POST", Headers({"authorization": "Bearer x"}))  # a browser cannot add this cross-site
    for headers in ({}, {"content-type": "text/plain"}, {"content-type": "application/x-www-form-urlencoded"}):
        with pytest.raises(UnsupportedMediaType):
            check_content_type("POST", Headers(headers))


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH"])
def test_methods_a_browser_must_preflight_need_no_content_type(method: str) -> None:
    for headers in ({}, {"content-type": "text/plain"}, {"content-type": "application/x-www-form-urlencoded"}):
        check_content_type(method, Headers(headers))


def test_reads_need_no_content_type() -> None:
    check_content_type("GET", Headers({}))
    check_content_type("HEAD", Headers({"content-type": "text/plain"}))


def test_the_guard_decides_on_the_scope_path_whatever_the_host_header_says() -> None:
    # request.url is rebuilt from the Host header: 'x/healthz?' there would make its path /healthz.
    import asyncio

    from compactord.api.auth import ApiGuard

    reached: list[str] = []

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        reached.append(scope["path"])

    sent: list[dict[str, object]] = []

    async def send(message):  # type: ignore[no-untyped-def]
        sent.append(message)

    async def receive():  # type: ignore[no-untyped-def]
        return {"type": "http.request", "body": b""}

    guard = ApiGuard(app, token=ADMIN, read_token=b"", loopback=False, allowed_hosts=())
    scope = {"type": "http", "method": "GET", "path": "/v1/tasks", "raw_path": b"/v1/tasks", "query_string": b"",
             "root_path": "", "scheme": "http", "server": ("127.0.0.1", 8642),
             "headers": [(b"host", b"x/healthz?")]}
    asyncio.run(guard(scope, receive, send))
    assert not reached and sent[0]["status"] == 401
