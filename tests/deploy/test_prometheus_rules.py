"""deploy/prometheus/rules.yaml: valid for Prometheus, unit-tested alert by alert, and about metrics that exist."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tests.deploy.known_metrics import REPO, tiergate_metric_names
from tests.deploy.promql import selected_names
from tests.support.kube import render_chart
from tests.support.tools import require_tool

RULES = REPO / "deploy" / "prometheus" / "rules.yaml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "rules.test.yaml"
PROMTOOL_HINT = "apt-get install --no-install-recommends prometheus"


def _rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_promtool_accepts_the_rules():
    promtool = require_tool("promtool", PROMTOOL_HINT)
    proc = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in proc.stdout


def test_alert_unit_tests_pass():
    promtool = require_tool("promtool", PROMTOOL_HINT)
    proc = subprocess.run([promtool, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True,
                          cwd=RULE_TESTS.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_notices_a_broken_rule(tmp_path: Path):
    """The check above is not vacuous: a typo in an expression fails it."""
    promtool = require_tool("promtool", PROMTOOL_HINT)
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups:\n- name: x\n  rules:\n  - alert: X\n    expr: sum(rate(tiergate_requests_total[5m])\n")
    assert subprocess.run([promtool, "check", "rules", str(bad)], capture_output=True).returncode != 0


def test_every_alert_is_shown_firing_by_a_unit_test():
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {case["alertname"] for t in tests for case in t.get("alert_rule_test", []) if case.get("exp_alerts")}
    alerts = {r["alert"] for r in _rules() if "alert" in r}
    assert alerts - fired == set(), "alerts without a firing unit test"


def test_rules_select_only_metrics_that_exist():
    known = tiergate_metric_names() | {r["record"] for r in _rules() if "record" in r}
    for rule in _rules():
        unknown = selected_names(rule["expr"]) - known
        assert not unknown, f"{rule.get('alert') or rule.get('record')}: unknown metrics {sorted(unknown)}"


def test_alerts_carry_severity_summary_and_a_runbook_that_exists():
    ops = (REPO / "docs" / "operations.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", ops, flags=re.MULTILINE)}
    for rule in _rules():
        if "alert" not in rule:
            continue
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        anchor = rule["annotations"]["runbook"].split("#", 1)[1]
        assert anchor in anchors, f"{rule['alert']}: docs/operations.md has no section #{anchor}"


def test_the_chart_ships_the_same_rules():
    objs = render_chart({"monitoring": {"prometheusRule": {"enabled": True}}})
    (rule,) = [o for o in objs if o["kind"] == "PrometheusRule"]
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
