"""docs/configuration.md and broker.conf.example are generated from ``Settings`` and agree with it; each
key says what it allows, in the words its error uses."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from compactord import config_reference
from compactord.config import ENV_PREFIX, GROUPS, KEYS, Key
from compactord.config_reference import EXAMPLE_PATH, REFERENCE_PATH
from compactord.config_values import class_ref, text
from compactord.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
COMMAND = [sys.executable, "-m", "compactord.config_reference"]
HINT = "run python -m compactord.config_reference"
# Values that every parser but the free-form ones rejects: "(" is no number, address, reference or regex;
# a URL is no local path.
BAD_VALUES = ("(", "hdfs://namenode/ledgers")


@pytest.mark.parametrize(("path", "generate"), [(REFERENCE_PATH, config_reference.reference),
                                               (EXAMPLE_PATH, config_reference.example)])
def test_generated_file_agrees_with_the_code(path: str, generate: Callable[[], str]) -> None:
    current = (ROOT / path).read_text(encoding="latin-1" if path == EXAMPLE_PATH else "utf-8")
    assert current == generate(), f"{path} is stale: {HINT}"


@pytest.mark.parametrize("key", KEYS, ids=lambda key: key.name)
def test_each_key_says_what_it_allows(key: Key) -> None:
    assert key.allowed.strip()


@pytest.mark.parametrize("key", KEYS, ids=lambda key: key.name)
def test_a_rejected_value_is_told_the_allowed_text(key: Key) -> None:
    """The reference's text is the error's: a bad value's message ends with ``expected <allowed>``."""
    rejected = []
    for value in BAD_VALUES:
        try:
            key.parse(key.name, value)
        except ConfigError as exc:
            rejected.append(value)
            assert str(exc).endswith(f"expected {key.allowed}")
    assert bool(rejected) is (key.parse not in (text, class_ref)), rejected


@pytest.mark.parametrize("key", KEYS, ids=lambda key: key.name)
def test_reference_documents_each_key(key: Key) -> None:
    reference = config_reference.reference()
    section = reference.split(f"\n### {key.name}\n", 1)[1].split("\n### ", 1)[0]
    assert key.doc in section
    assert f"- Default: `{key.default}`" in section if key.default else "- Default: (none)" in section
    assert f"- Allowed: {key.allowed}" in section
    assert f"- Environment: `{ENV_PREFIX}{key.name}`" in section
    assert ("- Pulsar:" in section) is key.pulsar
    assert ("- Secret: may be written `file:/path`" in section) is key.secret
    # ... under the heading of its section, and in the table of every key.
    assert reference.index(f"\n## {GROUPS[key.group]}\n") < reference.index(f"\n### {key.name}\n")
    assert f"| [`{key.name}`](#{key.name.lower()})" in reference


def test_reference_states_the_rules_of_the_file() -> None:
    reference = config_reference.reference()
    for rule in (f"`{ENV_PREFIX}<key>` overrides `<key>`", "`spark.*` keys can be set in the file only",
                 "Any `spark.*` key is passed to Spark", "may be written `file:/path`",
                 "An empty value means the default",
                 "an unknown key names the nearest known one and never shows its value"):
        assert rule in reference


def _copy(tmp_path: Path) -> Path:
    for path in (REFERENCE_PATH, EXAMPLE_PATH):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes((ROOT / path).read_bytes())
    return tmp_path


def test_check_passes_on_the_repository() -> None:
    done = subprocess.run([*COMMAND, "--check", "--root", str(ROOT)], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("path", [REFERENCE_PATH, EXAMPLE_PATH])
def test_check_fails_on_a_stale_file_and_the_command_regenerates_it(tmp_path: Path, path: str) -> None:
    root = _copy(tmp_path)
    stale = root / path
    stale.write_text(stale.read_text(encoding="latin-1").replace("httpPort", "httpPortal"),
                     encoding="latin-1")
    done = subprocess.run([*COMMAND, "--check", "--root", str(root)], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 1
    assert f"{path} is stale: {HINT}" in done.stderr
    # The diff shows what the code says where the file says otherwise.
    assert [line for line in done.stderr.splitlines() if line.startswith("+") and "httpPort" in line
            and "httpPortal" not in line]
    regenerated = subprocess.run([*COMMAND, "--root", str(root)], capture_output=True, text=True, check=False)
    assert regenerated.returncode == 0, regenerated.stderr
    assert stale.read_bytes() == (ROOT / path).read_bytes()


def test_the_command_creates_docs_when_missing(tmp_path: Path) -> None:
    done = subprocess.run([*COMMAND, "--root", str(tmp_path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / REFERENCE_PATH).read_text(encoding="utf-8") == config_reference.reference()
    assert (tmp_path / EXAMPLE_PATH).read_text(encoding="latin-1") == config_reference.example()
