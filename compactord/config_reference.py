"""The configuration reference (``docs/configuration.md``) and ``broker.conf.example``, generated from the
keys of ``Settings`` so that neither can drift from the code.

    python -m compactord.config_reference            # rewrite both files
    python -m compactord.config_reference --check    # exit 1 when either is stale

A test regenerates both in memory and compares them with the files.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import textwrap
from pathlib import Path

from compactord.config_keys import ENV_PREFIX, GROUPS, KEYS, Key

__all__ = ["EXAMPLE_PATH", "REFERENCE_PATH", "example", "main", "reference", "stale"]

REFERENCE_PATH = "docs/configuration.md"
EXAMPLE_PATH = "broker.conf.example"
_SOURCE = "compactord/config_keys.py"
_COMMAND = "python -m compactord.config_reference"
_WIDTH = 105  # the comment width of the shipped .conf files

# The rules of the file, written once for both outputs (code in backquotes, which broker.conf.example drops).
_RULES = (
    ("The file is parsed like `java.util.Properties`: `key=value` (or `key: value`, or `key value`), one a "
     "line; `#` and `!` start comments; a line ending in `\\` continues on the next line; a backslash stands "
     "for itself only when doubled (write the regex `^foo\\.bar$` as `^foo\\\\.bar$`)."),
    "An empty value means the default.",
    ("An unknown key or a bad value refuses the start (exit status 2) with the key, the value and what is "
     "allowed; an unknown key names the nearest known one and never shows its value (it may be a misspelled "
     "secret)."),
    (f"The environment variable `{ENV_PREFIX}<key>` overrides `<key>` (for example "
     f"`{ENV_PREFIX}httpPort=9000`); `spark.*` keys can be set in the file only."),
    ("Secrets ({secrets}) may be written `file:/path`: the value is then the content of that file, without "
     "its trailing newline; an empty file refuses the start (it must not turn authentication off)."),
)
_SPARK_RULE = ("Any `spark.*` key is passed to Spark as it is; a value that its JVM refuses at the start refuses "
               "the start too (exit status 2, with the JVM's own reason). For example:")
_SPARK_EXAMPLES = (
    "spark.driver.memory=1g",
    "spark.executor.memory=2g",
    "spark.executorEnv.PYSPARK_PYTHON=/opt/compactord/bin/python",
)
_PULSAR_RULE = "`[Pulsar]` marks a key that Apache Pulsar's broker.conf has too, with the same meaning."


def _rules() -> list[str]:
    secrets = ", ".join(f"`{key.name}`" for key in KEYS if key.secret)
    return [rule.format(secrets=secrets) if "{secrets}" in rule else rule for rule in _RULES]


def _plain(text: str) -> str:
    """``text`` without Markdown's backquotes; a quoted single character keeps plain quotes ('#')."""
    return re.sub(r"`(.)`", r"'\1'", text).replace("`", "")


def _comment(text: str, first: str = "# ", rest: str = "# ") -> list[str]:
    return textwrap.wrap(text, _WIDTH, initial_indent=first, subsequent_indent=rest,
                         break_long_words=False, break_on_hyphens=False)


def example() -> str:
    """The text of ``broker.conf.example``: every key set to its default under its doc."""
    lines = [
        "# broker.conf.example: every configuration key of compactord, set to its default.",
        "#",
        "# Copy this file to broker.conf and change what you need (compactord run --config broker.conf).",
        f"# Generated from {_SOURCE} by {_COMMAND}: edit the keys there.",
        f"# {REFERENCE_PATH} is the reference of every key.",
        "#",
    ]
    for rule in _rules():
        lines += _comment(_plain(rule), "# - ", "#   ")
    lines += _comment(_plain(_SPARK_RULE), "# - ", "#   ")
    lines += [f"#{setting}" for setting in _SPARK_EXAMPLES]
    lines += _comment(_plain(_PULSAR_RULE), "# - ", "#   ")
    for group, title in GROUPS.items():
        lines += ["", "", "#" * 100, f"# {title}", "#" * 100]
        for key in _keys_of(group):
            doc = ("[Pulsar] " if key.pulsar else "") + key.doc
            lines += ["", *_comment(doc), f"{key.name}={key.default}"]
    return "\n".join(lines) + "\n"


def _keys_of(group: str) -> list[Key]:
    return [key for key in KEYS if key.group == group]


def _code(value: str) -> str:
    return f"`{value}`" if value else "(none)"


def reference() -> str:
    """The text of ``docs/configuration.md``."""
    lines = [
        "# Configuration reference",
        "",
        (f"<!-- Generated from {_SOURCE} by `{_COMMAND}`; edit the keys there. A test fails when this file "
         "and the code disagree. -->"),
        "",
        ("compactord reads one file of Java properties, `broker.conf`: `compactord run --config broker.conf` "
         "(without `--config`, every key has its default). "
         f"[`{EXAMPLE_PATH}`](../{EXAMPLE_PATH}) sets every key to its default; [`config/`](../config) holds "
         "ready files (an embedded trial, production, a Spark standalone cluster, SASL and TLS)."),
        "",
        "## Rules",
        "",
        *(f"- {rule}" for rule in _rules()),
        f"- {_SPARK_RULE}",
        "",
        "  ```properties",
        *(f"  {setting}" for setting in _SPARK_EXAMPLES),
        "  ```",
        "",
        "## Keys",
        "",
        "| Key | Section | Default | Allowed |",
        "| --- | --- | --- | --- |",
    ]
    for key in KEYS:
        flags = "".join((" [Pulsar]" if key.pulsar else "", " (secret)" if key.secret else ""))
        lines.append(f"| [`{key.name}`](#{key.name.lower()}){flags} | {key.group} | {_code(key.default)} "
                     f"| {key.allowed} |")
    lines += ["", ("A key marked [Pulsar] is also a key of Apache Pulsar's broker.conf, with the same "
                   "meaning; one marked (secret) may be written `file:/path`.")]
    for group, title in GROUPS.items():
        lines += ["", f"## {title}"]
        for key in _keys_of(group):
            lines += ["", f"### {key.name}", "", key.doc, "", f"- Default: {_code(key.default)}",
                      f"- Allowed: {key.allowed}", f"- Section: {key.group}",
                      f"- Environment: `{ENV_PREFIX}{key.name}`"]
            if key.pulsar:
                lines.append("- Pulsar: also a key of Apache Pulsar's broker.conf, with the same meaning")
            if key.secret:
                lines.append("- Secret: may be written `file:/path` (the value is that file's content)")
    return "\n".join(lines) + "\n"


def _outputs() -> dict[str, str]:
    return {REFERENCE_PATH: reference(), EXAMPLE_PATH: example()}


def stale(root: Path) -> dict[str, list[str]]:
    """The generated files under ``root`` that differ from the code: path -> a unified diff (file -> code)."""
    found: dict[str, list[str]] = {}
    for path, text in _outputs().items():
        target = root / path
        current = target.read_text(encoding="latin-1" if path == EXAMPLE_PATH else "utf-8") \
            if target.exists() else ""
        if current != text:
            found[path] = list(difflib.unified_diff(current.splitlines(), text.splitlines(), path,
                                                    f"{path} (generated)", lineterm=""))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=_COMMAND, description="Generate (or check) the configuration reference and broker.conf.example.")
    parser.add_argument("--check", action="store_true", help="exit 1 when a generated file is stale")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the repository (default: the checkout this module is in)")
    args = parser.parse_args(argv)
    if args.check:
        differences = stale(args.root)
        for path, diff in differences.items():
            print(f"{path} is stale: run {_COMMAND}", file=sys.stderr)
            print("\n".join(diff[:40]), file=sys.stderr)
        return 1 if differences else 0
    for path, text in _outputs().items():
        target = args.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="latin-1" if path == EXAMPLE_PATH else "utf-8")
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
