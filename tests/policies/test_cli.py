"""The operator commands: policy check/explain/simulate/schema, classify and classifier train/evaluate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from aiohttp import web
from ruamel.yaml import YAML
from typer.testing import CliRunner

from tests.support.servers import aiohttp_server
from tiergate.complexity.features import FEATURES
from tiergate.complexity.model import DEFAULT_MODEL_FILE
from tiergate.policies.cli import SCHEMA_FILE, classify, policy_app, schema_text
from tiergate.policies.loader import DEFAULT_POLICY

from .conftest import BASE

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _classify_app():
    app = typer.Typer()
    app.command()(classify)
    return app


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_check_ok_and_warnings(write):
    r = runner.invoke(policy_app, ["check", str(write(BASE))])
    assert r.exit_code == 0, r.output
    assert "ok:" in r.output and "3 rules" in r.output
    r = runner.invoke(policy_app, ["check", str(DEFAULT_POLICY)])
    assert r.exit_code == 0, r.output


def test_check_says_which_complexity_model_and_what_it_was_trained_on(write, tmp_path):
    r = runner.invoke(policy_app, ["check", str(DEFAULT_POLICY)])
    assert r.exit_code == 0, r.output
    assert f"complexity model: {DEFAULT_MODEL_FILE} (the shipped default" in r.output
    assert "trained on 10278 prompts from 6 sources" in r.output and "mmlu_dev 9261" in r.output
    assert "license:" in r.output and "CC BY-NC 4.0" in r.output

    d = json.loads(DEFAULT_MODEL_FILE.read_text())
    d["meta"]["trained_on"] = {"sources": {"support": {"rows": 120}, "sales": {"rows": 80}},
                               "files": [{"name": "ours.jsonl", "sha256": "ab" * 32, "rows": 200}],
                               "license": "our own traffic"}
    (tmp_path / "ours.json").write_text(json.dumps(d))
    path = write("complexity_model: ours.json\n" + BASE)
    r = runner.invoke(policy_app, ["check", str(path)])
    assert r.exit_code == 0, r.output
    assert f"complexity model: {tmp_path / 'ours.json'} (set by complexity_model" in r.output
    assert "trained on 200 prompts from 2 sources: support 120, sales 80" in r.output
    assert "ours.jsonl (sha256 abababababab)" in r.output and "license: our own traffic" in r.output
    r = runner.invoke(policy_app, ["check", "--json", str(path)])
    model = json.loads(r.output)["complexity_model"]
    assert model["shipped"] is False and model["sources"] == {"support": 120, "sales": 80}
    assert model["license"] == "our own traffic" and model["format"] == "tiergate-complexity/3"


def test_check_invalid_lists_every_problem_and_exits_2(write):
    path = write(BASE.replace("kind: edge", "kind: fog").replace("min: 0.7", "min: 7"))
    r = runner.invoke(policy_app, ["check", str(path)])
    assert r.exit_code == 2
    assert f"{path}:8:11: `tiers.edge.kind`" in r.output
    assert "`rules[1].when.complexity.min`" in r.output and "2 problems" in r.output


def test_check_json(write):
    r = runner.invoke(policy_app, ["check", "--json", str(write(BASE.replace("min: 0.7", "min: 7")))])
    assert r.exit_code == 2
    out = json.loads(r.output)
    assert out["ok"] is False and out["problems"][0]["field"] == "rules[1].when.complexity.min"
    assert out["problems"][0]["line"] == 22


def test_explain_shows_features_rules_and_decision(write):
    r = runner.invoke(policy_app, ["explain", str(write(BASE)), "--prompt", "hello there", "--priority", "high"])
    assert r.exit_code == 0, r.output
    assert "prompt_tokens" in r.output and "complexity" in r.output and "priority       high" in r.output
    for rule in ("long", "complex", "default"):
        assert rule in r.output
    assert "[ ] prompt_tokens >= 2000" in r.output
    assert "decision: edge -> cloud (rule default)" in r.output


def test_explain_json_and_headers(write):
    text = BASE.replace("when: {complexity: {min: 0.7}}", "when: {headers: {x-route: cloud}}")
    r = runner.invoke(policy_app, ["explain", str(write(text)), "--prompt", "hi", "--header", "X-Route=cloud",
                                   "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["decision"]["rule"] == "complex" and out["decision"]["tier"] == "cloud"
    assert [t["outcome"] for t in out["rules"]] == ["no match", "matched", "not reached"]
    assert 0.0 <= out["complexity"]["score"] <= 1.0 and len(out["complexity"]["features"]) == len(FEATURES)
    assert out["complexity"]["scored_by"] == "head" and 0.0 <= out["complexity"]["trust"] <= 1.0


def test_explain_says_how_the_complexity_came_about(write):
    r = runner.invoke(policy_app, ["explain", str(write(BASE)), "--prompt", "Compare two sorting algorithms."])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.strip().startswith("complexity"))
    assert "head z" in line and "length z" in line and "largest head terms" in line
    far = runner.invoke(policy_app, ["explain", str(write(BASE)), "--prompt", "日本語の文章です。" * 40])
    line = next(x for x in far.output.splitlines() if x.strip().startswith("complexity"))
    assert "unlike the training prompts" in line and "scored by length alone" in line


def test_explain_rejects_bad_priority(write):
    r = runner.invoke(policy_app, ["explain", str(write(BASE)), "--prompt", "x", "--priority", "urgent"])
    assert r.exit_code == 2 and "unknown priority" in r.output


TRAFFIC = [
    json.dumps({"prompt": "What is the capital of France?"}),
    "this is not json",
    json.dumps({"messages": [{"role": "user", "content": "x " * 2500}], "tenant": "acme"}),
    json.dumps({"nothing": 1}),
    "",
    json.dumps({"prompt": "What is the capital of France?"}),
    json.dumps({"prompt": "hot", "temperature": 1.2}),
    json.dumps({"messages": [{"role": "wizard", "content": "x"}]}),
    json.dumps({"prompt": "a", "headers": {"x-tiergate-priority": "urgent"}}),
    json.dumps([1, 2]),
]


def test_simulate_per_request_lines_and_totals(write, tmp_path):
    traffic = tmp_path / "traffic.jsonl"
    traffic.write_text("\n".join(TRAFFIC) + "\n")
    r = runner.invoke(policy_app, ["simulate", str(write(BASE)), str(traffic)])
    assert r.exit_code == 0, r.output
    rows = _json_lines(r.stdout)
    per_request, totals = rows[:-1], rows[-1]["totals"]
    assert [row["line"] for row in per_request] == [1, 2, 3, 4, 6, 7, 8, 9, 10]
    errors = {row["line"]: row["error"] for row in per_request if "error" in row}
    assert set(errors) == {2, 4, 8, 9, 10}
    assert "not JSON" in errors[2] and "prompt" in errors[4] and "unknown priority" in errors[9]
    decided = {row["line"]: row for row in per_request if "error" not in row}
    assert decided[3]["tier"] == "cloud" and decided[3]["rule"] == "long" and decided[3]["prompt_tokens"] > 2000
    assert decided[1]["tier"] == "edge" and decided[1]["cache"] == "eligible"
    assert decided[6]["cache"] == "repeat" and decided[7]["cache"] == "too hot"
    assert totals["requests"] == 9 and totals["decided"] == 4 and totals["errors"] == 5
    assert totals["tiers"] == {"cloud": {"count": 1, "share": 0.25}, "edge": {"count": 3, "share": 0.75}}
    assert totals["cache"]["eligible"] == 3 and totals["cache"]["exact_repeats"] == 1


def test_simulate_reports_the_cloud_share_of_each_source(write, tmp_path):
    traffic = tmp_path / "traffic.jsonl"
    lines = [{"prompt": "hello", "source": "chat"}, {"prompt": "x " * 2500, "source": "batch"},
             {"prompt": "hi there", "source": "chat"}, {"prompt": "no source here"},
             {"prompt": "p", "source": "chat", "headers": {"x-tiergate-priority": "urgent"}}]
    traffic.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = runner.invoke(policy_app, ["simulate", str(write(BASE)), str(traffic)])
    assert r.exit_code == 0, r.output
    rows = _json_lines(r.stdout)
    assert rows[0]["source"] == "chat" and "source" not in rows[3]
    sources = rows[-1]["totals"]["sources"]
    assert sources["batch"] == {"decided": 1, "cloud_share": 1.0, "edge_share": 0.0, "rejected_share": 0.0}
    assert sources["chat"]["decided"] == 2 and sources["(no source)"]["decided"] == 1
    assert sources["chat"]["cloud_share"] + sources["chat"]["edge_share"] == 1.0
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"prompt": "hello"}) + "\n")
    r = runner.invoke(policy_app, ["simulate", str(write(BASE)), str(plain)])
    assert "sources" not in _json_lines(r.stdout)[-1]["totals"]  # no labels, no per-source totals


def test_classify_reads_stdin_in_order_with_per_line_errors():
    r = runner.invoke(_classify_app(), ["-"], input="\n".join(TRAFFIC) + "\n")
    assert r.exit_code == 0, r.output
    rows = _json_lines(r.stdout)
    assert [row["line"] for row in rows] == [1, 2, 3, 4, 6, 7, 8, 9, 10]
    for row in rows:
        if "error" not in row:
            assert {"tier", "rule", "complexity", "prompt_tokens"} <= set(row)
            assert 0.0 <= row["complexity"] <= 1.0
    assert rows[0]["tier"] == "edge" and rows[2]["rule"] == "long-prompt"
    assert rows[0]["complexity"] == rows[4]["complexity"]  # deterministic


def test_classify_file_with_policy_option(write, tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_text(json.dumps({"prompt": "hi"}) + "\n")
    r = runner.invoke(_classify_app(), [str(f), "--policy", str(write(BASE))])
    assert r.exit_code == 0, r.output
    (row,) = _json_lines(r.stdout)
    assert row["rule"] == "default" and row["prompt_tokens"] == 1


def test_classify_missing_file():
    r = runner.invoke(_classify_app(), ["/nonexistent/in.jsonl"])
    assert r.exit_code == 2 and "cannot read" in r.output


def test_shipped_schema_is_up_to_date():
    assert SCHEMA_FILE.read_text() == schema_text(), "run: tiergate policy schema --out policies/schema.json"
    r = runner.invoke(policy_app, ["schema", "--check", str(SCHEMA_FILE)])
    assert r.exit_code == 0, r.output


def test_shipped_policies_validate_against_the_schema():
    jsonschema = pytest.importorskip("jsonschema")

    schema = json.loads(SCHEMA_FILE.read_text())
    for f in [DEFAULT_POLICY, *sorted((ROOT / "policies" / "examples").glob("*.yaml"))]:
        jsonschema.validate(YAML(typ="safe").load(f.read_text()), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"tiers": {"e": {"kind": "fog", "model": "m"}}}, schema)


CASCADE_POLICY = BASE.replace("  - name: default\n    tier: edge\n",
                              "  - name: default\n    tier: edge\n    cascade: {min_mean_logprob: -0.5, first_tokens: 8}\n")


def test_explain_and_simulate_show_a_cascade_and_estimate_what_it_keeps(write, tmp_path):
    policy = write(CASCADE_POLICY)
    r = runner.invoke(policy_app, ["explain", str(policy), "--prompt", "Hi, how are you?"])
    assert r.exit_code == 0, r.output
    assert "cascade: answer from edge first; keep it if mean log-probability >= -0.5 over the first 8 tokens, " \
           "else escalate to cloud" in r.output
    traffic = tmp_path / "t.jsonl"
    traffic.write_text("\n".join(json.dumps(x) for x in [
        {"prompt": "a", "cascade": {"mean_logprob": -0.2, "tokens": 8, "finish_reason": "stop", "edge_tokens": 30}},
        {"prompt": "b", "cascade": {"mean_logprob": -0.9, "tokens": 8, "edge_tokens": 40}},
        {"prompt": "c", "cascade": {"mean_logprob": -0.1, "tokens": 8, "finish_reason": "length", "edge_tokens": 50}},
        {"prompt": "d"}]) + "\n")
    r = runner.invoke(policy_app, ["simulate", str(policy), str(traffic)])
    assert r.exit_code == 0, r.output
    rows = _json_lines(r.output)
    assert [row.get("cascade") for row in rows[:-1]] == ["kept", "escalated:low_mean_logprob", "escalated:length",
                                                         "unknown"]
    totals = rows[-1]["totals"]["cascade"]
    assert totals["rules"]["default"] == {"requests": 4, "with_confidence": 3, "kept": 1, "escalated": 2,
                                          "kept_share": round(1 / 3, 4)}
    assert totals["escalated_edge_tokens"] == 90 and totals["escalated_share_of_all"] == 0.5


def _models_server(max_model_len: int):
    """A server answering /v1/models the way vLLM and edge-node serve do."""
    async def models(_request):
        return web.json_response({"object": "list", "data": [{"id": "served", "object": "model",
                                                              "max_model_len": max_model_len}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    return aiohttp_server(app)


def test_check_warns_when_a_tier_promises_more_context_than_its_servers_serve(write):
    with _models_server(2048) as small, _models_server(8192) as big:
        policy = write(f"""\
version: 1
tiers:
  edge: {{kind: edge, model: m-edge, max_context: 2048, endpoints: ["{big.url}"]}}
  cloud: {{kind: cloud, model: m-cloud, served_model: served, max_context: 8192, endpoints: ["{small.url}", "http://127.0.0.1:1"]}}
rules:
  - {{name: default, tier: edge, fallbacks: [cloud]}}
""")
        r = runner.invoke(policy_app, ["check", str(policy)])
        assert r.exit_code == 0, r.output  # a warning: the policy still loads
        assert (f"warning: tier `cloud`: max_context 8192 is larger than the 2048 tokens {small.url} serves"
                in r.output), r.output
        assert f"ok: tier `edge`: {big.url} serves 8192 tokens" in r.output
        assert "note: tier `cloud`: could not read the context of http://127.0.0.1:1" in r.output
        r = runner.invoke(policy_app, ["check", "--json", str(policy)])
        servers = {s["endpoint"]: s for s in json.loads(r.output)["servers"]}
        assert servers[small.url]["too_small"] and servers[small.url]["context"] == 2048
        assert not servers[big.url]["too_small"] and servers["http://127.0.0.1:1"]["error"]
        r = runner.invoke(policy_app, ["check", "--no-servers", str(policy)])
        assert "tier `cloud`" not in r.output


def test_simulate_compares_the_shipped_default_and_cascade_policies_by_cost(tmp_path):
    """The command docs/policy.md shows: both shipped policies on the shipped traffic file, side by side."""
    repo = Path(__file__).resolve().parents[2]
    default, cascade = repo / "policies" / "default.yaml", repo / "policies" / "examples" / "cascade.yaml"
    traffic = repo / "policies" / "examples" / "traffic.jsonl"
    r = runner.invoke(policy_app, ["simulate", str(default), str(traffic), "--compare", str(cascade), "--json"])
    assert r.exit_code == 0, r.output
    runs = json.loads(r.stdout)["policies"]
    assert [Path(p["file"]).name for p in runs] == ["default.yaml", "cascade.yaml"]
    plain, cascading = (p["totals"] for p in runs)
    assert plain["decided"] == cascading["decided"] == sum(1 for line in traffic.read_text().splitlines() if line)
    for totals in (plain, cascading):
        cost = totals["cost"]
        assert cost["saved"] == pytest.approx(cost["reference"] - cost["spend"], abs=1e-5)
        assert cost["saved"] == pytest.approx(sum(cost["saved_by"].values()), abs=1e-5)
        assert 0 < cost["spend"] < cost["reference"]
    assert "cascade" not in plain["cost"]["saved_by"] and "cascade" in cascading["cost"]["saved_by"]
    assert cascading["cascade"]["escalated_share_of_all"] > 0  # its saving is shown with what it escalated

    r = runner.invoke(policy_app, ["simulate", str(default), str(traffic), "--compare", str(cascade)])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].split() == [str(default), str(cascade)]
    table = {line[:32].strip(): line[32:].split() for line in lines[1:]}
    assert table["saved (USD)"] == [f"{plain['cost']['saved']:.6f}", f"{cascading['cost']['saved']:.6f}"]
    assert table["saved by cascade"][0] == "-" and table["quality: cascade kept"][0] == "-"


def test_simulate_compare_refuses_a_bad_second_policy(write, tmp_path):
    traffic = tmp_path / "t.jsonl"
    traffic.write_text(json.dumps({"prompt": "hi"}) + "\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\ntiers: {}\n")
    r = runner.invoke(policy_app, ["simulate", str(write(BASE)), str(traffic), "--compare", str(bad)])
    assert r.exit_code == 2 and "error:" in r.output
