"""The IAM policy and the lifecycle rule of docs/object-storage.md: the policy grants every request the S3
backend makes (each boto3 call in ``compactord/storage`` maps to the IAM action AWS checks for it), the files
under deploy/s3/ are the docs' own blocks, and the lifecycle rule aborts unfinished uploads after a day."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "object-storage.md"
POLICY = ROOT / "deploy" / "s3" / "iam-policy.json"
LIFECYCLE = ROOT / "deploy" / "s3" / "lifecycle.json"

# The IAM action AWS authorizes each S3 call by (the "Actions, resources and condition keys for Amazon S3"
# reference). A call missing here fails the test below, so that a new request of the backend is granted.
ACTION_OF_CALL = {
    "head_bucket": "s3:ListBucket",
    "list_objects_v2": "s3:ListBucket",
    "list_multipart_uploads": "s3:ListBucketMultipartUploads",
    "head_object": "s3:GetObject",
    "get_object": "s3:GetObject",
    "put_object": "s3:PutObject",
    "copy_object": "s3:PutObject",  # and s3:GetObject on the source
    "create_multipart_upload": "s3:PutObject",
    "upload_part": "s3:PutObject",
    "complete_multipart_upload": "s3:PutObject",
    "abort_multipart_upload": "s3:AbortMultipartUpload",
    "delete_objects": "s3:DeleteObject",
}
BUCKET_ACTIONS = {"s3:ListBucket", "s3:ListBucketMultipartUploads"}


def _calls() -> set[str]:
    """The boto3 client methods the S3 backend calls (``c.<method>(`` in compactord/storage)."""
    source = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "compactord" / "storage").glob("*.py"))
    names = set(re.findall(r"\bc\.([a-z_0-9]+)\(", source))
    assert {"put_object", "get_object"} <= names, "the backend's calls are no longer found this way"
    return names


def _doc_blocks() -> list[dict]:
    return [json.loads(b) for b in re.findall(r"```json\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)]


def test_the_files_under_deploy_are_the_docs_blocks() -> None:
    policy, lifecycle = _doc_blocks()
    assert json.loads(POLICY.read_text(encoding="utf-8")) == policy
    assert json.loads(LIFECYCLE.read_text(encoding="utf-8")) == lifecycle


@pytest.mark.parametrize("call", sorted(_calls()))
def test_the_policy_grants_each_request_of_the_backend(call: str) -> None:
    assert call in ACTION_OF_CALL, f"the S3 backend calls {call}: add its IAM action to ACTION_OF_CALL and the policy"
    action = ACTION_OF_CALL[call]
    statements = json.loads(POLICY.read_text(encoding="utf-8"))["Statement"]
    granted = [s for s in statements if s["Effect"] == "Allow" and action in s["Action"]]
    assert granted, f"{call} needs {action}, which the policy does not grant"
    resource = granted[0]["Resource"]
    if action in BUCKET_ACTIONS:
        assert resource == "arn:aws:s3:::compactord-ledgers"  # on the bucket
    else:
        assert resource == "arn:aws:s3:::compactord-ledgers/production/*"  # on the root's objects only


def test_the_lifecycle_rule_aborts_unfinished_uploads_under_the_root_after_a_day() -> None:
    (rule,) = json.loads(LIFECYCLE.read_text(encoding="utf-8"))["Rules"]
    assert rule["Status"] == "Enabled" and rule["Filter"] == {"Prefix": "production/"}
    assert rule["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}
    assert "Expiration" not in rule  # compactord removes the ledgers itself
