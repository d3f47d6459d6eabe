"""Every route's real answer is its model (``compactord/api/models.py``), the one the OpenAPI document
is generated from: each body of the shared daemon is validated with ``Model.model_validate``, and the
models forbid keys they do not name, so a key a body has and its model lacks fails here. Every operation of
``/openapi.json`` is answered at least once, with the model its document names for that status.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from compactord.api import models
from tests.support.daemon import DaemonProcess, compact, wait_state

from .conftest import MONITOR_PATTERN

pytestmark = pytest.mark.slow


class Checked:
    """The answers validated so far, by operation (method and path template) and status."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.daemon = daemon
        self.document = daemon.http.get("/openapi.json").json()
        self.seen: set[tuple[str, str]] = set()

    def __call__(self, method: str, template: str, response: httpx.Response, *statuses: int
                 ) -> dict[str, Any]:
        """``response`` (to ``method`` on ``template``) has one of ``statuses`` and a body its model
        validates; the model is the one the document names for its status."""
        got = response.status_code
        assert got in statuses, f"{method} {template}: {got} {response.text}"
        responses = self.document["paths"][template][method.lower()]["responses"]
        ref = responses[str(response.status_code)]["content"]["application/json"]["schema"]["$ref"]
        model: type[BaseModel] = getattr(models, ref.rsplit("/", 1)[-1])
        body: dict[str, Any] = response.json()
        model.model_validate(body)  # raises, naming the key, on a key the model lacks or a wrong value
        self.seen.add((method.lower(), template))
        return body

    def call(self, method: str, template: str, *statuses: int, params: dict[str, Any] | None = None,
             json: Any = None, **path: str) -> dict[str, Any]:
        response = self.daemon.http.request(method, template.format(**path), params=params, json=json)
        return self(method, template, response, *statuses)


def test_every_route_answers_its_model(shared_daemon: DaemonProcess, kafka: Any) -> None:
    check = Checked(shared_daemon)
    # A topic the monitor refreshes (the broker's view is in the listing); too few records to trigger it.
    topic = kafka.topic(partitions=2, prefix="mon")
    assert MONITOR_PATTERN.startswith("mon-")
    # A recent timestamp: the topic stays on the broker after the daemon deletes its view, and the shared
    # daemon's monitor would see its backlog as the oldest (test_monitor.py's maximum delay).
    recent_ms = int(time.time() * 1000) - 1000
    kafka.produce(topic, [("k0", "a", 0, recent_ms, [("h", b"\x00"), ("e", b"")]), ("k1", "b", 0),
                          ("k0", None, 0), (None, "no-key", 1), ("k2", "c", 1)])

    check.call("GET", "/healthz", 200)
    check.call("GET", "/readyz", 200)
    check.call("GET", "/v1/info", 200)
    assert check.call("GET", "/v1/cluster", 200)["name"] == ""  # no cluster's member (test_cluster.py: one)
    never = check.call("GET", "/v1/topics/{topic}/compaction", 200, topic=topic)
    assert never["status"] == "NOT_RUN"
    check.call("GET", "/v1/topics/{topic}/compacted", 404, params={"partition": 0}, topic=topic)
    check.call("DELETE", "/v1/topics/{topic}/compaction", 404, topic=topic)  # no_task_running
    # A read budget: the run's status carries its read throttle.
    put = check.call("PUT", "/v1/topics/{topic}/policies", 200, json={"maxReadBytesPerSecond": 1 << 30,
                                                                      "minDirtyRatio": 0}, topic=topic)
    assert put["policies"]["minDirtyRatio"] == 0 and type(put["policies"]["minDirtyRatio"]) is int  # as given
    check.call("GET", "/v1/topics/{topic}/policies", 200, topic=topic)
    check.call("GET", "/v1/topics/{topic}/compaction/preview", 200, topic=topic)

    final = compact(shared_daemon, topic)
    models.Task.model_validate(final)
    assert final["read_throttle"] is not None
    check.call("GET", "/v1/topics/{topic}/compaction", 200, topic=topic)
    check.call("GET", "/v1/tasks", 200, params={"topic": topic})
    check.call("GET", "/v1/topics/{topic}/history", 200, topic=topic)
    check.call("GET", "/v1/topics/{topic}/horizon", 200, topic=topic)
    for markers in (False, True):
        page = check.call("GET", "/v1/topics/{topic}/compacted", 200, topic=topic,
                          params={"partition": 0, "include_markers": markers})
        assert page["entries"] and ("marker" in page["entries"][0]) is markers
    check.call("GET", "/v1/topics/{topic}/compacted/last", 200, params={"partition": 1}, topic=topic)
    check.call("DELETE", "/v1/topics/{topic}/policies", 200, topic=topic)
    exact = check.call("POST", "/v1/topics/{topic}/compaction/preview", 200, topic=topic)
    assert exact["exact"] is True and "kept_digest" in exact
    listing = check.call("GET", "/v1/topics", 200)
    assert any(t["topic"] == topic and t["broker"] is not None for t in listing["topics"]), listing

    # A trigger, and a cancel that finds it running (200 or 202), switching (409) or done (404).
    check.call("PUT", "/v1/topics/{topic}/compaction", 202, topic=topic, params={"rebuild": True})
    check.call("DELETE", "/v1/topics/{topic}/compaction", 200, 202, 404, 409, topic=topic)
    wait_state(shared_daemon, topic, "Succeed", "Failed", "Cancelled")
    check.call("POST", "/v1/topics/{topic}/unload", 200, 202, topic=topic)
    check.call("POST", "/v1/topics/{topic}/load", 200, topic=topic)
    check.call("DELETE", "/v1/topics/{topic}", 200, 202, topic=topic)

    operations = {(method, path) for path, ops in check.document["paths"].items() for method in ops}
    assert operations - check.seen == {("get", "/metrics")}  # Prometheus text, not JSON
