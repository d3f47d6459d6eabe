"""``DaemonClient``: the one HTTP client of the daemon's API (the CLI, the demo and
``compacted_reader.CompactedReader`` use it).

Its waits are bounded in two steps, so that a URL that names something else (the broker's address,
printed beside the API's) fails in seconds rather than at the answer's bound: a connection is made
within ``CONNECT_TIMEOUT``; an answer that has not begun within a fifth of ``ANSWER_START`` sends a
probe of ``/healthz``, and unless the answer or the probe's begins within ``ANSWER_START`` of the
request the other end is not the API (``NotCompactordApi``). A daemon that answers the probe is slow by
design on this route (a cancel, a broker-bound request, an exact preview): the wait goes on to the
client's own ``timeout``. An HTTP answer that is not the API's (an error without its JSON body, a body
that is not JSON) is the API's only if ``/healthz`` answers as the daemon's: else the URL is another
HTTP service's (an S3 server's, say).

The URL is ``http://`` or ``https://`` (``host:port`` alone means ``http://``); any other scheme is
refused (``InvalidArgument``).
"""

from __future__ import annotations

import http.client
import json
import os
import select
import urllib.parse
from typing import Any

from compactord.errors import DaemonRequestFailed, DaemonUnreachable, InvalidArgument, NotCompactordApi

__all__ = ["ANSWER_START", "CONNECT_TIMEOUT", "DEFAULT_URL", "DaemonClient", "with_scheme"]

DEFAULT_URL = "http://127.0.0.1:8642"
CONNECT_TIMEOUT = 3.0  # seconds to make the TCP (and TLS) connection
ANSWER_START = 5.0  # seconds for an answer's (or the /healthz probe's) status line to begin


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
        try:
            answer, is_json = json.loads(payload or b"null"), True
        except ValueError:
            answer, is_json = None, False
        if status < 400 and is_json:
            return answer
        if isinstance(answer, dict) and isinstance(answer.get("error"), str) and "message" in answer:
            error, text = answer["error"], f"{answer['error']}: {answer['message']}"
        else:  # not the API's answer: a proxy's in front of the daemon, or another service's
            self._require_api(answered=f"answers HTTP {status}" + ("" if is_json else " (not JSON)"))
            error, text = None, f"HTTP {status}" + ("" if is_json else ", not JSON")
        if status == 401:
            text += "; give the daemon's token with --token or COMPACTORD_TOKEN"
        raise DaemonRequestFailed(method, path, status, error, text, answer)

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
            first = min(ANSWER_START / 5, self.timeout)
            if not _begins(conn, first):
                self._probe_while_waiting(conn, max(min(ANSWER_START, self.timeout) - first, 0.0))
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

    def _probe_while_waiting(self, conn: http.client.HTTPConnection, wait: float) -> None:
        """Ask ``/healthz`` while ``conn``'s answer is awaited: returns when either begins within ``wait``.

        :raises NotCompactordApi: neither begins, or the probe gets no HTTP answer.
        """
        probe = self._connection()
        try:
            probe.request("GET", urllib.parse.urlsplit(self.url).path + "/healthz")
            assert conn.sock is not None and probe.sock is not None
            readable, _, _ = select.select([conn.sock, probe.sock], [], [], wait)
            if conn.sock in readable:
                return  # the answer begins
            if readable:
                probe.getresponse()  # an HTTP answer: something HTTP is there, slow on this route
                return
        except (OSError, http.client.HTTPException):
            pass
        finally:
            probe.close()
        raise NotCompactordApi(urllib.parse.urlsplit(self.url).netloc)

    def _require_api(self, answered: str | None = None) -> None:
        """Without ``answered``: ``/healthz`` gets an HTTP answer. With it (what the URL answered that
        is not the API's): ``/healthz`` answers as the daemon's, with its JSON body.

        :raises NotCompactordApi: it does not.
        """
        conn = self._connection()
        prefix = urllib.parse.urlsplit(self.url).path
        try:
            conn.request("GET", prefix + "/healthz")
            if _begins(conn, ANSWER_START):
                response = conn.getresponse()
                if answered is None or _is_health_body(response.read()):
                    return
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()
        raise NotCompactordApi(urllib.parse.urlsplit(self.url).netloc, answered)

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

    def topics(self, state: str | None = None, prefix: str | None = None, page: int = 1000) -> Any:
        """Every known topic (``state``, ``prefix``: only those), a page of ``page`` at a time until the last."""
        query: dict[str, Any] = {"limit": page}
        if state:
            query["state"] = state
        if prefix:
            query["prefix"] = prefix
        body = self.request("GET", "/v1/topics", query)
        topics = list(body["topics"])
        while body.get("next_after"):
            body = self.request("GET", "/v1/topics", {**query, "after": body["next_after"]})
            topics.extend(body["topics"])
        return {**body, "topics": topics}

    def history(self, topic: str, limit: int = 50, cursor: str | None = None) -> Any:
        query: dict[str, Any] = {"limit": limit}
        if cursor is not None:
            query["cursor"] = cursor
        return self.request("GET", f"{self.topic_path(topic)}/history", query)

    def tasks(self, topic: str | None = None) -> Any:
        return self.request("GET", "/v1/tasks", {"topic": topic} if topic else None)

    def info(self) -> Any:
        return self.request("GET", "/v1/info")

    def cluster(self) -> Any:
        return self.request("GET", "/v1/cluster")

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
    """``url`` without its trailing slash, ``http://`` put in front of a bare ``host:port``.

    :raises InvalidArgument: a scheme other than http and https, no host, or a port that is not a number.
    """
    given = url
    url = url.strip()
    url = url if "://" in url else f"http://{url}"
    parts = urllib.parse.urlsplit(url)
    problem = None
    if parts.scheme not in ("http", "https"):
        problem = f"its scheme is {parts.scheme or 'empty'}"
    elif not parts.hostname:
        problem = "it names no host"
    else:
        try:
            parts.port  # noqa: B018 (urllib checks the port when it is read)
        except ValueError:
            problem = "its port is not a number from 0 to 65535"
    if problem:
        raise InvalidArgument(f"daemon URL {given!r}: {problem}; give http://HOST:PORT or https://HOST:PORT "
                              "(HOST:PORT alone means http://)")
    return url.rstrip("/")


def _is_health_body(payload: bytes) -> bool:
    """Whether ``payload`` is the daemon's ``/healthz`` body: ``{"status": "ok"}``, or its error body."""
    try:
        body = json.loads(payload)
    except ValueError:
        return False
    return isinstance(body, dict) and (body.get("status") == "ok" or body.get("error") == "unhealthy")


def _begins(conn: http.client.HTTPConnection, wait: float) -> bool:
    """Whether the answer begins (bytes, or the end of the connection) within ``wait`` seconds."""
    assert conn.sock is not None
    readable, _, _ = select.select([conn.sock], [], [], wait)
    return bool(readable)
