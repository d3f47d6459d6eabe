"""The clients of the daemon: ``DaemonClient``, the one HTTP client of its API (the CLI uses it),
and ``CompactedReader``, the compacted view of a topic, like Pulsar's ``readCompacted``.

It yields the compacted ledger up to the horizon (served by the daemon's HTTP API), then the live
topic after the horizon up to the end offsets fixed when the read starts (tombstones included there),
so that an application bootstraps its state without rewinding the whole log::

    reader = CompactedReader("broker:9092", "prices", url="http://127.0.0.1:8642")
    state = {}
    for entry in reader:
        if entry.is_tombstone:
            state.pop(entry.key, None)
        else:
            state[entry.key] = entry.value

Under the ``event-time`` strategy, ``apply_strategy=True`` yields a tail record only if it wins
against what the reader has seen for its key (the ledger's deletion markers included), so that the
application's state equals the strategy's view.
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

from compactord.config import Settings
from compactord.errors import BrokerUnavailable, DaemonRequestFailed, DaemonUnreachable, NotCompacted
from compactord.event_time import event_time_extractor, event_time_rank
from compactord.model import Entry

__all__ = ["DEFAULT_URL", "CompactedReader", "DaemonClient"]

DEFAULT_URL = "http://127.0.0.1:8642"


class DaemonClient:
    """The daemon's HTTP API, one method per endpoint; each returns the answer's JSON body.

    ``url`` defaults to ``COMPACTORD_URL``, then ``DEFAULT_URL``; ``token`` to ``COMPACTORD_TOKEN``.

    :raises DaemonRequestFailed: the daemon answered with an error (its status and code inside).
    :raises DaemonUnreachable: no answer.
    """

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 60.0) -> None:
        self.url = (url or os.environ.get("COMPACTORD_URL") or DEFAULT_URL).rstrip("/")
        self.token = token if token is not None else os.environ.get("COMPACTORD_TOKEN")
        self.timeout = timeout

    def request(self, method: str, path: str, query: dict[str, Any] | None = None) -> Any:
        url = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        request = urllib.request.Request(url, method=method)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                body = json.loads(exc.read())
                error, text = body.get("error"), f"{body.get('error')}: {body.get('message')}"
            except ValueError:
                error, text = None, str(exc)
            raise DaemonRequestFailed(method, path, exc.code, error, text) from None
        except (urllib.error.URLError, OSError) as exc:
            raise DaemonUnreachable(self.url, getattr(exc, "reason", exc)) from None

    @staticmethod
    def topic_path(topic: str) -> str:
        return f"/v1/topics/{urllib.parse.quote(topic, safe='')}"

    def trigger(self, topic: str, rebuild: bool = False) -> Any:
        return self.request("PUT", f"{self.topic_path(topic)}/compaction", {"rebuild": "true"} if rebuild else None)

    def status(self, topic: str) -> Any:
        return self.request("GET", f"{self.topic_path(topic)}/compaction")

    def cancel(self, topic: str) -> Any:
        return self.request("DELETE", f"{self.topic_path(topic)}/compaction")

    def horizon(self, topic: str) -> Any:
        return self.request("GET", f"{self.topic_path(topic)}/horizon")

    def compacted(self, topic: str, partition: int, start: int = 0, limit: int = 100, *,
                  encoding: str = "base64", include_markers: bool = False) -> Any:
        query = {"partition": partition, "start": start, "limit": limit, "encoding": encoding}
        if include_markers:
            query["include_markers"] = "true"
        return self.request("GET", f"{self.topic_path(topic)}/compacted", query)

    def topics(self) -> Any:
        return self.request("GET", "/v1/topics")

    def tasks(self) -> Any:
        return self.request("GET", "/v1/tasks")


def _b64(value: str | None) -> bytes | None:
    return None if value is None else base64.b64decode(value)


def _rank(e: Entry) -> tuple[bool, int, int]:
    return event_time_rank(e.event_time, e.offset)


class CompactedReader:
    """Iterate the compacted view of ``topic``: ledger entries, then the tail after the horizon."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        url: str | None = None,
        token: str | None = None,
        apply_strategy: bool = False,
        event_time_source: str = "timestamp",
        page_size: int = 1000,
        settings: Settings | None = None,
    ) -> None:
        self.topic = topic
        self._daemon = DaemonClient(url, token)
        self.url, self.token = self._daemon.url, self._daemon.token
        self.apply_strategy = apply_strategy
        self.page_size = page_size
        self.settings = settings or Settings(kafka_bootstrap_servers=bootstrap)
        self._event_time = event_time_extractor(event_time_source)
        self.ledger_entries = 0
        self.tail_records = 0

    # -- HTTP ---------------------------------------------------------------------------------------

    def horizon(self) -> dict[int, int]:
        """The horizon per partition; empty if the topic was never compacted."""
        try:
            body = self._daemon.horizon(self.topic)
        except DaemonRequestFailed as exc:
            if exc.error == NotCompacted.code:
                return {}
            raise
        return {p["partition"]: p["offset"] for p in body["partitions"]}

    def _page(self, partition: int, start: int) -> Any:
        try:
            return self._daemon.compacted(self.topic, partition, start, self.page_size,
                                          include_markers=self.apply_strategy)
        except DaemonRequestFailed as exc:
            if exc.error == NotCompacted.code:
                raise NotCompacted(self.topic) from None
            raise

    def _ledger(self, partition: int) -> Iterator[Entry]:
        start: int | None = 0
        while start is not None:
            body = self._page(partition, start)
            for e in body["entries"]:
                yield Entry(
                    partition=e["partition"], offset=e["offset"], key=_b64(e["key"]), value=_b64(e["value"]),
                    timestamp=e["timestamp"],
                    headers=tuple((h["key"], base64.b64decode(h["value"])) for h in e["headers"]),
                    event_time=e.get("event_time"), marker=bool(e.get("marker", False)),
                )
            start = body["next_start"]

    # -- the view -----------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Entry]:
        from compactord.kafka.admin import KafkaAdmin

        admin = KafkaAdmin(self.settings)
        try:
            ends = admin.offsets(self.topic)  # fixed now: the read ends there
        finally:
            admin.close()
        horizon = self.horizon()
        seen: dict[tuple[int, bytes], tuple[bool, int, int]] = {}
        for partition in sorted(ends):
            if partition in horizon:
                for entry in self._ledger(partition):
                    if entry.key is not None:
                        seen[(partition, entry.key)] = _rank(entry)
                    if not entry.marker:
                        self.ledger_entries += 1
                        yield entry
        yield from self._tail(ends, horizon, seen)

    def _tail(self, ends: dict[int, Any], horizon: dict[int, int],
              seen: dict[tuple[int, bytes], tuple[bool, int, int]]) -> Iterator[Entry]:
        from kafka import TopicPartition

        from compactord.kafka.client import consumer, translate_kafka_errors

        ranges = {p: (max(horizon.get(p, -1) + 1, o.log_start), o.end) for p, o in ends.items()}
        ranges = {p: r for p, r in ranges.items() if r[1] > r[0]}
        if not ranges:
            return
        bootstrap = self.settings.kafka_bootstrap_servers
        with translate_kafka_errors(bootstrap, self.topic):
            cons = consumer(self.settings.kafka_client_config())
        try:
            for p in sorted(ranges):
                start, end = ranges[p]
                tp = TopicPartition(self.topic, p)
                with translate_kafka_errors(bootstrap, self.topic):
                    cons.assign([tp])
                    cons.seek(tp, start)
                    deadline = time.monotonic() + 60
                    while cons.position(tp) < end:
                        if time.monotonic() > deadline:
                            raise BrokerUnavailable(f"reading {self.topic}[{p}] stalled at {cons.position(tp)}")
                        for r in cons.poll(timeout_ms=500).get(tp, ()):
                            if r.offset >= end:
                                break
                            deadline = time.monotonic() + 60
                            entry = Entry(partition=p, offset=r.offset, key=r.key, value=r.value,
                                          timestamp=r.timestamp, headers=tuple(r.headers or ()),
                                          event_time=self._event_time(r.timestamp, r.headers or ()))
                            if self.apply_strategy and entry.key is not None:
                                rank = _rank(entry)
                                if rank <= seen.get((p, entry.key), (False, 0, -1)):
                                    continue
                                seen[(p, entry.key)] = rank
                            self.tail_records += 1
                            yield entry
        finally:
            cons.close()
