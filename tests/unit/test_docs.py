"""The documentation as files: a short README, links that resolve, no journal phrases anywhere in the tree,
an error-code table and a layout map that match the code."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from compactord import errors
from tests.support.markdown import FENCE, github_anchor, heading_anchors

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README_MAX_LINES = 250

# An ordinal, or this/last/next/previous, followed by the word "stop": how a work round was narrated.
_ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
             "fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth")
JOURNAL_STOP = re.compile(rf"\b({_ORDINALS}|\d+(st|nd|rd|th)|this|last|next|previous)\s+stop\b", re.IGNORECASE)
# "issue N" as the subject: a markdown heading's text, or a docstring's first words.
ISSUE_HEADING = re.compile(r"^#{1,6}\s+\(?issue\s+\d+", re.IGNORECASE | re.MULTILINE)
ISSUE_DOCSTRING = re.compile(r"(\"\"\"|''')\s*\(?issue\s+\d+", re.IGNORECASE)

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def linked_documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", ROOT / "deploy" / "README.md",
            *sorted(DOCS.glob("*.md"))]


def anchors(path: Path) -> set[str]:
    return heading_anchors(path.read_text(encoding="utf-8"))


_WEED_MINI = re.compile(r"\.venv/bin/weed mini .*?&", re.DOTALL)
_EPHEMERAL_PORTS = 32768  # Linux's ip_local_port_range starts here: a listener above may take a client's port


def test_the_s3_trial_server_opens_only_what_the_trial_uses() -> None:
    """The ``weed mini`` line of the S3 trial, the same in README.md, docs/object-storage.md and
    config/s3-trial.conf: what the trial does not use off (as tests/support/s3_server.py has it), and every port
    it opens, with its gRPC port (+10000), below the ephemeral range."""
    sources = [ROOT / "README.md", DOCS / "object-storage.md", ROOT / "config" / "s3-trial.conf"]
    commands = set()
    for path in sources:
        text = re.sub(r"^#\s*", "", path.read_text(encoding="utf-8"), flags=re.MULTILINE)
        (found,) = _WEED_MINI.findall(text)
        commands.add(" ".join(found.replace("\\\n", " ").split()))
    (command,) = commands
    flags = dict(arg.partition("=")[::2] for arg in command.split() if arg.startswith("-"))
    assert {flags.get(name) for name in ("-admin.ui", "-webdav", "-master.telemetry")} == {"false"}, command
    assert {flags.get(name) for name in ("-s3.port.iceberg", "-s3.port.lance")} == {"0"}, command
    defaults = {"-master.port": 9333, "-volume.port": 8080, "-filer.port": 8888, "-s3.port": 8333,
                "-admin.port": 23646}  # weed mini -h
    ports = {name: int(flags.get(name, default)) for name, default in defaults.items()}
    assert all(port + 10000 < _EPHEMERAL_PORTS for port in ports.values()), ports


def test_github_anchor_follows_githubs_rules() -> None:
    assert github_anchor("compactord, Pulsar, Kafka and RocketMQ side by side") == \
        "compactord-pulsar-kafka-and-rocketmq-side-by-side"
    assert github_anchor("Strategies (`compactionStrategy`)") == "strategies-compactionstrategy"
    assert github_anchor("CompactordCompactionDelayHigh") == "compactordcompactiondelayhigh"
    assert github_anchor("Kafka's delete rule") == "kafkas-delete-rule"


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, at most {README_MAX_LINES}: move reference material to docs/")


def test_every_relative_link_resolves_to_a_file_and_heading() -> None:
    broken: list[str] = []
    for doc in linked_documents():
        assert doc.is_file(), f"{doc.relative_to(ROOT)} is missing"
        text = FENCE.sub("", doc.read_text(encoding="utf-8"))
        for target in LINK.findall(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, fragment = target.partition("#")
            linked = (doc.parent / file_part).resolve() if file_part else doc
            where = f"{doc.relative_to(ROOT)}: ({target})"
            if not linked.exists():
                broken.append(f"{where} -> no file {file_part}")
            elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
                broken.append(f"{where} -> no heading #{fragment} in {linked.relative_to(ROOT)}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_link_check_sees_a_broken_fragment(tmp_path: Path) -> None:
    doc = tmp_path / "a.md"
    doc.write_text("# A title\n\n## Some part\n", encoding="utf-8")
    assert "some-part" in anchors(doc) and "a-title" in anchors(doc)
    assert "other-part" not in anchors(doc)


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    files = []
    for name in names.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file() or path == Path(__file__).resolve():
            continue  # this file holds the patterns themselves
        head = path.read_bytes()[:8192]
        if b"\0" not in head:
            files.append(path)
    return files


def test_no_file_narrates_how_it_was_written() -> None:
    found: list[str] = []
    for path in tracked_text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        name = path.relative_to(ROOT)
        for match in JOURNAL_STOP.finditer(text):
            found.append(f"{name}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)!r}")
        if path.suffix == ".md":
            for match in ISSUE_HEADING.finditer(text):
                found.append(f"{name}:{text.count(chr(10), 0, match.start()) + 1}: heading {match.group(0)!r}")
        if path.suffix == ".py":
            for match in ISSUE_DOCSTRING.finditer(text):
                found.append(f"{name}:{text.count(chr(10), 0, match.start()) + 1}: docstring {match.group(0)!r}")
    assert not found, ("describe behaviour, not how it was written; cite an issue as '(see #N)':\n"
                       + "\n".join(found))


@pytest.mark.parametrize("phrase", ["the eleventh stop", "This Stop", "the 3rd stop", "last  stop"])
def test_the_journal_pattern_matches(phrase: str) -> None:
    assert JOURNAL_STOP.search(phrase)


@pytest.mark.parametrize("text", ['"""Issue 10, points 0 to 2"""', "'''(issue 4) probes'''"])
def test_the_issue_docstring_pattern_matches(text: str) -> None:
    assert ISSUE_DOCSTRING.search(text)


def test_the_journal_patterns_leave_ordinary_words() -> None:
    for text in ("the servers stop", "see #9", "it stops at the horizon", "a non-stop read", "first, stop it"):
        assert not JOURNAL_STOP.search(text), text
    assert not ISSUE_HEADING.search("## Errors (see issue 9)")
    assert not ISSUE_DOCSTRING.search('"""Probes that answer (see #10)."""')


def error_classes() -> list[type[errors.CompactordError]]:
    found, todo = [], [errors.CompactordError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [cls for cls in found if cls.__module__ == errors.__name__]


def test_the_error_codes_table_names_every_error_class() -> None:
    text = (DOCS / "http-api.md").read_text(encoding="utf-8")
    section = text.split("## Error codes", 1)[1]
    rows = {m.group(1): (int(m.group(2)), m.group(3))
            for m in re.finditer(r"^\| `([a-z_]+)` \| (\d{3}) \| `(\w+)` \|", section, flags=re.MULTILINE)}
    expected = {cls.code: (cls.status, cls.__name__) for cls in error_classes()}
    missing = sorted(set(expected) - set(rows))
    extra = sorted(set(rows) - set(expected))
    wrong = sorted(code for code in set(rows) & set(expected) if rows[code] != expected[code])
    assert not (missing or extra or wrong), (
        f"docs/http-api.md's error table against compactord/errors.py: missing {missing}, not in the code "
        f"{extra}, wrong status or class {[(c, rows[c], expected[c]) for c in wrong]}")


def layout_map() -> set[str]:
    """The paths the layout map in docs/design.md names: one entry a line, two spaces per level."""
    text = (DOCS / "design.md").read_text(encoding="utf-8")
    section = text.split("## How the code is laid out", 1)[1]
    block = re.search(r"^```\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    assert block, "docs/design.md's layout map should be the first code block of 'How the code is laid out'"
    stack: list[str] = []
    names: set[str] = set()
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name = line.split()[0]
        stack[depth:] = [name]
        names.add("".join(stack).rstrip("/"))
    return names


def modules() -> set[str]:
    """Every package directory and module under compactord/ (``__init__.py`` stands for its package)."""
    found = set()
    for path in (ROOT / "compactord").rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(ROOT)
        if path.name != "__init__.py":
            found.add(rel.as_posix())
        found.update(parent.as_posix() for parent in rel.parents if parent != Path("."))
    return found


def test_the_layout_map_matches_the_tree() -> None:
    named = layout_map()
    missing = sorted(modules() - named)
    extra = sorted(name for name in named if not (ROOT / name).exists())
    assert not (missing or extra), (
        f"docs/design.md's layout map (How the code is laid out) against the tree: not named {missing}; "
        f"named but not in the tree {extra}")
