"""The Prometheus alerts: each links its runbook section of ``docs/operations.md``, and the rules behave as
their unit tests (``tests/deploy/prometheus/alerts_test.yml``, run by ``promtool test rules``) say: the
delay alert follows each topic's own max lag."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.test_packaging import DEPLOY, ROOT, alert_rules
from tests.support.markdown import github_anchor, heading_anchors

OPERATIONS = ROOT / "docs" / "operations.md"
RULE_TESTS = Path(__file__).parent / "prometheus" / "alerts_test.yml"


def test_heading_anchors_follow_githubs_rules() -> None:
    text = "# compactord\n\n## Alerts\n\n### CompactordDown\n\n```\n# not a heading\n```\n\n## Alerts\n"
    assert heading_anchors(text) == {"compactord", "alerts", "compactorddown", "alerts-1"}
    assert github_anchor("Kafka's `delete` rule, today") == "kafkas-delete-rule-today"


def test_every_alert_links_its_runbook_section() -> None:
    rules = alert_rules()
    assert len(rules) >= 10
    for name, rule in rules.items():
        assert rule["annotations"].get("runbook_url") == f"docs/operations.md#{github_anchor(name)}", name


def test_every_runbook_link_names_a_heading_of_the_operations_guide() -> None:
    if not OPERATIONS.exists():
        pytest.skip(f"{OPERATIONS.relative_to(ROOT)} is not in this tree")
    anchors = heading_anchors(OPERATIONS.read_text(encoding="utf-8"))
    missing = {name: rule["annotations"]["runbook_url"] for name, rule in alert_rules().items()
               if rule["annotations"]["runbook_url"].partition("#")[2] not in anchors}
    assert not missing, f"no such heading in {OPERATIONS.relative_to(ROOT)}: {missing}"


def test_the_deploy_readme_lists_every_alert_with_its_runbook() -> None:
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    for name in alert_rules():
        row = next((line for line in readme.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, f"deploy/README.md has no table row for {name}"
        assert f"(../docs/operations.md#{github_anchor(name)})" in row, row


def test_the_rules_pass_their_unit_tests() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed on this machine (Debian: apt-get install prometheus)")
    assert (DEPLOY / "prometheus" / "alerts.yml").exists()
    result = subprocess.run([promtool, "test", "rules", str(RULE_TESTS)], check=False, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout
