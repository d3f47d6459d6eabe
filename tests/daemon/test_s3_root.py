"""The daemon on an S3 ledger root (the session's SeaweedFS): it checks the bucket at start, compacts into it
and serves reads from it over HTTP; wrong credentials refuse the start with exit 74 and one line."""

from __future__ import annotations

import base64
import uuid
from typing import Any

from tests.support.daemon import compact
from tests.support.s3_server import BUCKET, SECRET_KEY

EXIT_IOERR = 74


def test_a_daemon_compacts_into_and_reads_from_an_s3_root(launch: Any, kafka: Any, s3_server: Any) -> None:
    prefix = f"daemon-{uuid.uuid4().hex[:12]}"
    daemon = launch("s3", root=f"s3://{BUCKET}/{prefix}", **s3_server.daemon_conf())  # type: ignore[arg-type]
    topic = kafka.topic(prefix="s3")
    records = [(f"k{i % 40}", f"v{i}") for i in range(200)]
    kafka.produce(topic, records)
    compact(daemon, topic)
    page = daemon.http.get(f"/v1/topics/{topic}/compacted", params={"partition": 0, "limit": 1000})
    assert page.status_code == 200, page.text
    view = {base64.b64decode(e["key"]): base64.b64decode(e["value"]) for e in page.json()["entries"]}
    assert view == {f"k{k}".encode(): f"v{160 + k}".encode() for k in range(40)}
    last = daemon.http.get(f"/v1/topics/{topic}/compacted/last", params={"partition": 0, "encoding": "utf8"})
    assert last.status_code == 200 and (last.json()["key"], last.json()["value"]) == ("k39", "v199")
    info = daemon.http.get("/v1/info").json()
    assert info["ledger_root"] == f"s3://{BUCKET}/{prefix}" and SECRET_KEY not in str(info)
    keys = [info.key for info in s3_server.store(prefix).list(f"{topic}/")]
    assert f"{topic}/CURRENT" in keys and any(k.endswith(".parquet") for k in keys)
    assert not (daemon.workdir / "ledgers").exists() and not (daemon.workdir / "s3:").exists()


def test_wrong_s3_credentials_refuse_the_start_with_one_line(launch: Any, s3_server: Any) -> None:
    daemon = launch.prepare("s3-denied", root=f"s3://{BUCKET}/denied",  # type: ignore[arg-type]
                            **s3_server.daemon_conf(s3SecretAccessKey="not-the-secret"))
    daemon.start()
    assert daemon.wait_exit(120) == EXIT_IOERR, daemon.log_tail()
    assert "compactedLedgerRoot=s3://" in daemon.log_text(), daemon.log_tail()
    assert "not-the-secret" not in daemon.log_text()
