"""``DaemonClient``: the one HTTP client of the daemon's API (the CLI, the demo and
``reader.CompactedReader`` use it).

Its waits are bounded in two steps, so that a URL that names something else (the broker's address,
printed beside the API's) fails in seconds rather than at the answer's bound: a connection is made
within ``CONNECT_TIMEOUT``; an answer that has not begun within ``ANSWER_START`` sends a probe of
``/healthz``, and unless that gets an HTTP answer the other end is not the API (``NotCompactordApi``).
A daemon that answers the probe is slow by design on this route (a cancel, a broker-bound request, an
exact preview): the wait goes on to the client's own ``timeout``.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import urllib.parse
from typing import Any

from compactord.errors import DaemonRequestFailed, DaemonUnreachable, NotCompactordApi

__all__ = ["ANSWER_START", "CONNECT_TIMEOUT", "DEFAULT_URL", "DaemonClient", "with_scheme"]

DEFAULT_URL = "http://127.0.0.1:8642"
CONNECT_TIMEOUT = 3.0  # seconds to make the TCP (and TLS) connection
ANSWER_START = 5.0  # seconds for an answer's status line to begin before /healthz is asked


class DaemonClient:
    """The daemon's HTTP API, one method per endpoint; each returns the answer's JSON body.

    ``url`` defaults to ``COMPACTORD_URL``, then ``DEFAULT_URL``; ``token`` to ``COMPACTORD_TOKEN``.
    ``timeout`` bounds the wait for an answer (the routes that wait on the broker answer within 30 s,
    ``cancel`` and ``delete-topic`` within ~10 s; an exact preview needs a longer one).

    :raises DaemonRequestFailed: the daemon answered with an error (its status and code inside).
    :raises NotCompactordApi: something answers at the URL, but not as the daemon's API.
    :raises DaemonUnreachable: no answer.
    """

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 60.0) -> None:
        self.url = with_scheme(url or os.environ.get("COMPACTORD_URL") or DEFAULT_URL)
        self.token = token if token is not None else os.environ.get("COMPACTORD_TOKEN")
        self.timeout = timeout

    def request(self, method: str, path: str, query: dict[str, Any] | None = None, body: Any = None) -> Any:
        target = path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode()
        # The daemon refuses a POST that has neither a token nor this header (415); PUT and DELETE need neither.
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            status, payload = self._exchange(method, target, data, headers)
        except NotCompactordApi:
            raise
        except (OSError, http.client.HTTPException) as exc:
            # "Connection refused", without "[Errno 111]"
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
            raise DaemonUnreachable(self.url, reason) from None
        if status < 400:
            return json.loads(payload or b"null")
        try:
            answer = json.loads(payload)
            error, text = answer.get("error"), f"{answer.get('error')}: {answer.get('message')}"
        except (ValueError, AttributeError):
            error, text = None, f"HTTP {status}"
        if status == 401:
            text += "; give the daemon's token with --token or COMPACTORD_TOKEN"
        raise DaemonRequestFailed(method, path, status, error, text)

    # -- the transport ------------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        parts = urllib.parse.urlsplit(self.url)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        return kind(parts.netloc, timeout=CONNECT_TIMEOUT)

    def _exchange(self, method: str, target: str, data: bytes | None,
                  headers: dict[str, str]) -> tuple[int, bytes]:
        """One request on its own connection: the answer's status and body."""
        prefix = urllib.parse.urlsplit(self.url).path  # a daemon behind a path prefix
        conn = self._connection()
        try:
            conn.request(method, prefix + target, body=data, headers=headers)
            if not _begins(conn, min(ANSWER_START, self.timeout)):
                self._require_api()
                if not _begins(conn, max(self.timeout - ANSWER_START, 0.0)):
                    raise TimeoutError(f"no answer within {self.timeout:g} s")
            assert conn.sock is not None
            conn.sock.settimeout(self.timeout)
            try:
                response = conn.getresponse()
            except (http.client.BadStatusLine, ConnectionError):
                self._require_api()  # closed, or answered in another protocol: is anything there the API?
                raise
            return response.status, response.read()
        finally:
            conn.close()

    def _require_api(self) -> None:
        """:raises NotCompactordApi: ``/healthz`` gets no HTTP answer either."""
        conn = self._connection()
        prefix = urllib.parse.urlsplit(self.url).path
        try:
            conn.request("GET", prefix + "/healthz")
            if _begins(conn, ANSWER_START):
                conn.getresponse()
                return
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()
        raise NotCompactordApi(urllib.parse.urlsplit(self.url).netloc)

    @staticmethod
    def topic_path(topic: str) -> str:
        return f"/v1/topics/{urllib.parse.quote(topic, safe='')}"

    def trigger(self, topic: str, rebuild: bool = False) -> Any:
        return self.request("PUT", f"{self.topic_path(topic)}/compaction", {"rebuild": "true"} if rebuild else None)

    def preview(self, topic: str, exact: bool = False) -> Any:
        """What the next compaction would do (``exact``: the read and choose steps, which can take long)."""
        if exact:  # a task: POST, never a GET a web page could send
            return self.request("POST", f"{self.topic_path(topic)}/compaction/preview", body={})
        return self.request("GET", f"{self.topic_path(topic)}/compaction/preview")

    def status(self, topic: str) -> Any:
        return self.request("GET", f"{self.topic_path(topic)}/compaction")

    def cancel(self, topic: str) -> Any:
        return self.request("DELETE", f"{self.topic_path(topic)}/compaction")

    def horizon(self, topic: str, ledger_id: int | None = None) -> Any:
        query = {"ledger_id": ledger_id} if ledger_id is not None else None
        return self.request("GET", f"{self.topic_path(topic)}/horizon", query)

    def compacted(self, topic: str, partition: int, start: int = 0, limit: int = 100, *,
                  encoding: str = "base64", include_markers: bool = False, ledger_id: int | None = None) -> Any:
        query: dict[str, Any] = {"partition": partition, "start": start, "limit": limit, "encoding": encoding}
        if include_markers:
            query["include_markers"] = "true"
        if ledger_id is not None:
            query["ledger_id"] = ledger_id
        return self.request("GET", f"{self.topic_path(topic)}/compacted", query)

    def topics(self) -> Any:
        return self.request("GET", "/v1/topics")

    def history(self, topic: str, limit: int = 50, cursor: str | None = None) -> Any:
        query: dict[str, Any] = {"limit": limit}
        if cursor is not None:
            query["cursor"] = cursor
        return self.request("GET", f"{self.topic_path(topic)}/history", query)

    def tasks(self, topic: str | None = None) -> Any:
        return self.request("GET", "/v1/tasks", {"topic": topic} if topic else None)

    def info(self) -> Any:
        return self.request("GET", "/v1/info")

    def readiness(self) -> Any:
        return self.request("GET", "/readyz")

    def policies(self, topic: str) -> Any:
        return self.request("GET", f"{self.topic_path(topic)}/policies")

    def set_policies(self, topic: str, policies: dict[str, Any]) -> Any:
        return self.request("PUT", f"{self.topic_path(topic)}/policies", body=policies)

    def delete_policies(self, topic: str) -> Any:
        return self.request("DELETE", f"{self.topic_path(topic)}/policies")

    def unload(self, topic: str) -> Any:
        return self.request("POST", f"{self.topic_path(topic)}/unload")

    def load(self, topic: str) -> Any:
        return self.request("POST", f"{self.topic_path(topic)}/load")

    def delete_topic(self, topic: str) -> Any:
        return self.request("DELETE", self.topic_path(topic))


def with_scheme(url: str) -> str:
    """``url`` without its trailing slash, ``http://`` put in front of a bare ``host:port``."""
    url = url.strip().rstrip("/")
    return url if "://" in url else f"http://{url}"


def _begins(conn: http.client.HTTPConnection, wait: float) -> bool:
    """Whether the answer begins (bytes, or the end of the connection) within ``wait`` seconds."""
    assert conn.sock is not None
    readable, _, _ = select.select([conn.sock], [], [], wait)
    return bool(readable)
