"""deploy/grafana/tiergate.json: a loadable dashboard whose every query parses and names real metrics."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from tests.deploy.known_metrics import REPO, tiergate_metric_names, vllm_metric_names
from tests.deploy.promql import from_grafana, selected_names
from tests.support.tools import require_tool

DASHBOARD = REPO / "deploy" / "grafana" / "tiergate.json"


def _panels() -> list[dict]:
    out = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def _queries() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in _panels() for t in p.get("targets", [])]


def test_dashboard_is_valid_json_with_unique_ids_and_a_datasource_variable():
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in _panels()]
    assert len(ids) == len(set(ids))
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for panel in _panels():
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]


def test_dashboard_covers_what_operators_ask_for():
    text = json.dumps(json.loads(DASHBOARD.read_text()))
    for metric in ("tiergate_requests_total", "tiergate_routing_decisions_total", "tiergate_time_to_first_token",
                   "tiergate_request_duration_seconds", "tiergate_tokens_total", "tiergate_fallbacks_total",
                   "tiergate_upstream_errors_total", "tiergate_edge_slots", "tiergate_edge_busy_slots",
                   "tiergate_cloud_endpoint_requests_running", "tiergate_cache_lookups_total"):
        assert metric in text, metric


def test_savings_are_never_on_the_dashboard_without_their_quality_cost():
    """The cost row: spend against all-cloud, the saving by source, tier shares, cache hit rate, cascade keep rate,
    spend per tenant, and beside them what the savings cost in quality."""
    panels = {p["title"]: p for p in _panels()}
    row = [p["title"] for p in json.loads(DASHBOARD.read_text())["panels"]]
    start = row.index("Cost and savings")
    assert row[start + 1:start + 8] == ["Tier shares", "Spend and all-cloud reference / h", "Saved / h, by source",
                                        "Cache hit rate over time", "Cascade keep rate",
                                        "What the savings cost in quality", "Spend by tenant (top 10, over the range)"]

    def exprs(title: str) -> str:
        return " ".join(t["expr"] for t in panels[title]["targets"])

    assert "tiergate_savings_reference_total" in exprs("Saved / h, by source")
    assert "tiergate_savings_spend_total" in exprs("Saved / h, by source")
    assert "by (source, currency)" in exprs("Saved / h, by source")
    quality = exprs("What the savings cost in quality")
    assert 'tiergate_cascade_total{outcome="escalated"}' in quality
    assert 'source="verify",result="wrong"' in quality and 'source="feedback",result="wrong"' in quality
    assert "tiergate_spend_reference_total" in exprs("Spend and all-cloud reference / h")
    assert "by (tenant, currency)" in exprs("Spend by tenant (top 10, over the range)")


def test_every_query_names_existing_metrics():
    known = tiergate_metric_names() | vllm_metric_names()
    for title, expr in _queries():
        names = selected_names(from_grafana(expr))
        assert names, f"{title}: selects no metric"
        assert names <= known, f"{title}: unknown metrics {sorted(names - known)}"


def test_every_query_parses_in_prometheus(tmp_path: Path):
    """promtool uses Prometheus' own parser: each query becomes a recording rule and must load."""
    promtool = require_tool("promtool", "apt-get install --no-install-recommends prometheus")
    rules = [{"record": f"dashboard:query_{i}", "expr": from_grafana(expr)} for i, (_, expr) in enumerate(_queries())]
    f = tmp_path / "dashboard-queries.yaml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = subprocess.run([promtool, "check", "rules", str(f)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout
