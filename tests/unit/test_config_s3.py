"""The storage keys of an S3 ledger root: what ``compactedLedgerRoot`` accepts, the s3* keys' rules between
them, and ``open_store`` making the store they describe (no request made: the region is given, never looked up).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from compactord.config import settings_from_properties
from compactord.errors import ConfigError
from compactord.storage import LocalStore, open_store
from compactord.storage.s3 import S3Store

S3 = {"compactedLedgerRoot": "s3://ledgers-bucket/prod/compactord", "s3Region": "eu-west-1"}


def test_an_s3_root_is_kept_normalized() -> None:
    s = settings_from_properties({**S3, "compactedLedgerRoot": "s3://ledgers-bucket/prod/compactord/"}, env={})
    assert s.compacted_ledger_root == "s3://ledgers-bucket/prod/compactord"
    assert settings_from_properties({**S3, "compactedLedgerRoot": "s3://ledgers-bucket"},
                                    env={}).compacted_ledger_root == "s3://ledgers-bucket"


@pytest.mark.parametrize("root, problem", [
    ("s3a://bucket/x", "s3a://"),
    ("s3://Bad_Bucket/x", "not an S3 bucket name"),
    ("s3://b/x", "not an S3 bucket name"),
    ("s3://bucket/a//b", "empty, '.' or '..' segment"),
    ("s3://bucket/a/../b", "empty, '.' or '..' segment"),
])
def test_a_bad_s3_root_is_refused_with_what_is_allowed(root: str, problem: str) -> None:
    with pytest.raises(ConfigError, match="compactedLedgerRoot") as caught:
        settings_from_properties({**S3, "compactedLedgerRoot": root}, env={})
    assert problem in caught.value.message and "s3://BUCKET/PREFIX" in caught.value.message


def test_an_s3_root_needs_its_region() -> None:
    with pytest.raises(ConfigError, match=r"s3Region.*required.*s3://ledgers-bucket/prod/compactord"):
        settings_from_properties({"compactedLedgerRoot": S3["compactedLedgerRoot"]}, env={})
    settings_from_properties({"compactedLedgerRoot": "/var/lib/ledgers"}, env={})  # a path needs none


def test_credentials_come_in_pairs() -> None:
    with pytest.raises(ConfigError, match="s3SecretAccessKey.*together, or neither"):
        settings_from_properties({**S3, "s3AccessKeyId": "AKIAX"}, env={})
    with pytest.raises(ConfigError, match="s3AccessKeyId.*together"):
        settings_from_properties({**S3, "s3SecretAccessKey": "shh"}, env={})


def test_the_secret_key_may_be_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "s3-secret"
    secret.write_text("very-secret\n")
    s = settings_from_properties({**S3, "s3AccessKeyId": "AKIAX", "s3SecretAccessKey": f"file:{secret}"}, env={})
    assert s.s3_secret_access_key == "very-secret"
    assert "very-secret" not in repr(open_store(s.compacted_ledger_root, s))


def test_encryption_keys() -> None:
    with pytest.raises(ConfigError, match="s3ServerSideEncryption.*AES256, aws:kms"):
        settings_from_properties({**S3, "s3ServerSideEncryption": "aes"}, env={})
    with pytest.raises(ConfigError, match="s3KmsKeyId.*needs s3ServerSideEncryption=aws:kms"):
        settings_from_properties({**S3, "s3ServerSideEncryption": "AES256", "s3KmsKeyId": "alias/x"}, env={})
    s = settings_from_properties({**S3, "s3ServerSideEncryption": "aws:kms", "s3KmsKeyId": "alias/x"}, env={})
    store = open_store(s.compacted_ledger_root, s)
    assert isinstance(store, S3Store)
    assert store.options.write_args() == {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "alias/x"}


def test_path_style_is_the_default_with_an_endpoint() -> None:
    assert settings_from_properties(S3, env={}).s3_path_style is False
    assert settings_from_properties({**S3, "s3Endpoint": "http://127.0.0.1:9000"}, env={}).s3_path_style is True
    assert settings_from_properties({**S3, "s3Endpoint": "http://127.0.0.1:9000", "s3PathStyleAccess": "false"},
                                    env={}).s3_path_style is False
    with pytest.raises(ConfigError, match="s3Endpoint.*http:// or https://"):
        settings_from_properties({**S3, "s3Endpoint": "127.0.0.1:9000"}, env={})


def test_open_store_makes_the_store_the_root_names(tmp_path: Path) -> None:
    s = settings_from_properties({**S3, "s3Endpoint": "http://127.0.0.1:9000", "s3AccessKeyId": "AKIAX",
                                  "s3SecretAccessKey": "shh-its-secret"}, env={})
    store = open_store(s.compacted_ledger_root, s)
    assert isinstance(store, S3Store) and (store.bucket, store.prefix) == ("ledgers-bucket", "prod/compactord")
    assert store.describe() == "s3://ledgers-bucket/prod/compactord"
    assert "shh-its-secret" not in repr(store) and "shh-its-secret" not in repr(store.options)
    assert store.options.path_style is True and store.options.region == "eu-west-1"
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    with pytest.raises(ConfigError, match="s3Region"):
        open_store("s3://ledgers-bucket/x")  # no settings, no region
    with pytest.raises(ConfigError, match=r"s3a:// is not supported.*s3://BUCKET/PREFIX"):
        open_store("s3a://ledgers-bucket/x", s)
