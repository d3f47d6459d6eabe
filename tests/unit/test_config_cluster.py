"""The cluster's keys: defaults, each key's validation, and a bad value refusing the start with exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from compactord.cluster import advertised_url, coordination_partition, coordination_topic, group_id
from compactord.config import ENV_PREFIX, Settings, settings_from_properties
from compactord.errors import ConfigError


def settings(**props: str) -> Settings:
    return settings_from_properties(props, env={})


def test_the_defaults_are_a_single_daemon_with_32_partitions_and_a_6_s_session() -> None:
    got = settings()
    assert (got.cluster_name, got.cluster_coordination_partitions, got.cluster_advertised_url,
            got.cluster_session_timeout_ms, got.cluster_tls_ca_file) == ("", 32, "", 6000, "")


@pytest.mark.parametrize("name", ["prod", "eu-west.1_b", "x" * (249 - len("__compactord-"))])
def test_a_cluster_name_is_a_topic_name_fragment(name: str) -> None:
    assert settings(clusterName=name).cluster_name == name


@pytest.mark.parametrize("name", ["a b", "prod/eu", "caf\u00e9", "x" * (250 - len("__compactord-"))])
def test_a_cluster_name_that_is_no_topic_name_fragment_is_refused(name: str) -> None:
    with pytest.raises(ConfigError) as caught:
        settings(clusterName=name)
    assert caught.value.key == "clusterName"
    assert caught.value.value == name
    assert "letters, digits, '.', '_' and '-'" in caught.value.message
    assert "__compactord-NAME at most 249 characters" in caught.value.message


@pytest.mark.parametrize(("key", "good", "bad"), [
    ("clusterCoordinationPartitions", ["1", "1024"], ["0", "1025", "many"]),
    ("clusterSessionTimeoutMs", ["1000", "300000"], ["999", "300001", "6s"]),
])
def test_the_numbers_are_bounded(key: str, good: list[str], bad: list[str]) -> None:
    for value in good:
        settings(**{key: value})
    for value in bad:
        with pytest.raises(ConfigError, match=rf"config key {key}='{value}' is invalid: expected a whole number "
                                              r"from \d+ to \d+"):
            settings(**{key: value})


@pytest.mark.parametrize(("raw", "value"), [("http://10.0.0.5:8642", "http://10.0.0.5:8642"),
                                            ("https://compactord-0.compactord:8642/", "https://compactord-0.compactord:8642"),
                                            ("https://[::1]:8642/api", "https://[::1]:8642/api")])
def test_an_advertised_url_is_an_http_url(raw: str, value: str) -> None:
    assert settings(clusterAdvertisedUrl=raw).cluster_advertised_url == value


@pytest.mark.parametrize("raw", ["compactord-0:8642", "ftp://host", "http://", "http://host:99999",
                                 "http://host/?q=1", "https://user:pw@host"])
def test_an_advertised_url_that_is_no_http_url_is_refused(raw: str) -> None:
    with pytest.raises(ConfigError, match="an http:// or https:// URL") as caught:
        settings(clusterAdvertisedUrl=raw)
    assert caught.value.key == "clusterAdvertisedUrl"


def test_the_ca_file_must_be_readable(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    assert settings(clusterTlsCaFile=str(ca)).cluster_tls_ca_file == str(ca)
    with pytest.raises(ConfigError, match="a readable CA bundle") as caught:
        settings(clusterTlsCaFile=str(tmp_path / "missing.pem"))
    assert caught.value.key == "clusterTlsCaFile"


@pytest.mark.parametrize(("line", "stderr"), [
    ("clusterName=prod cluster", "config key clusterName='prod cluster' is invalid: expected letters, digits"),
    ("clusterCoordinationPartitions=0", ("config key clusterCoordinationPartitions='0' is invalid: expected a "
                                        "whole number from 1 to 1024")),
    ("clusterAdvertisedUrl=compactord-0:8642", ("config key clusterAdvertisedUrl='compactord-0:8642' is invalid: "
                                               "expected an http:// or https:// URL")),
    ("clusterSessionTimeoutMs=500", ("config key clusterSessionTimeoutMs='500' is invalid: expected a whole "
                                    "number from 1000 to 300000")),
    ("clusterTlsCaFile=/nonexistent/ca.pem", ("config key clusterTlsCaFile='/nonexistent/ca.pem' is invalid: a "
                                             "readable CA bundle")),
])
def test_a_bad_cluster_value_refuses_the_start_with_exit_2_and_one_line(tmp_path: Path, line: str,
                                                                        stderr: str) -> None:
    (tmp_path / "broker.conf").write_text(line + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    done = subprocess.run([sys.executable, "-m", "compactord", "run", "--config", "broker.conf"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("compactord: cannot start: " + stderr), done.stderr


def test_the_names_and_the_partition_of_a_topic() -> None:
    assert coordination_topic("prod") == "__compactord-prod"
    assert group_id("prod") == "compactord-prod"
    assert coordination_partition("orders", 32) == 3845127662 % 32  # zlib.crc32(b"orders"), as Java's CRC32
    assert coordination_partition("orders", 1) == 0
    assert {coordination_partition(f"t{i}", 7) for i in range(200)} == set(range(7))


@pytest.mark.parametrize(("props", "port", "url"), [
    ({"clusterAdvertisedUrl": "https://c-0.c:8642"}, 1234, "https://c-0.c:8642"),
    ({"httpBindAddress": "127.0.0.1"}, 8642, "http://127.0.0.1:8642"),
    ({"httpBindAddress": "::1", "httpTlsCertFile": "cert.pem"}, 9000, "https://[::1]:9000"),
])
def test_the_advertised_url_is_the_key_or_derived_from_the_listen_address(props: dict[str, str], port: int,
                                                                         url: str) -> None:
    assert advertised_url(settings(**props), port) == url
