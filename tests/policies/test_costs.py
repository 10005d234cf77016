"""The policy's cost model: the arithmetic of a request's cost, and the `costs` section's validation and display."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tiergate.policies.cli import policy_app
from tiergate.policies.costs import CostsConfig, PriceBasis, TierPrice, format_cost, token_cost
from tiergate.policies.loader import PolicyError, check_policy, parse_policy

from .conftest import BASE

COSTS = """\
costs:
  currency: USD
  reference_tier: cloud
  prices:
    cloud: {prompt_per_1k: 0.6, cached_prompt_per_1k: 0.15, completion_per_1k: 2.4}
    edge: {prompt_per_1k: 0.01, completion_per_1k: 0.03}
"""


def _with_costs(costs: str = COSTS) -> str:
    return BASE.replace("rules:\n", costs + "rules:\n", 1)


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


# ---- arithmetic -----------------------------------------------------------------------------------------------


def test_cost_is_tokens_over_a_thousand_times_each_price():
    p = TierPrice(prompt_per_1k=0.6, cached_prompt_per_1k=0.15, completion_per_1k=2.4)
    assert token_cost(p, 1000, 0) == pytest.approx(0.6)
    assert token_cost(p, 0, 1000) == pytest.approx(2.4)
    assert token_cost(p, 42, 7) == pytest.approx(42 / 1000 * 0.6 + 7 / 1000 * 2.4)
    # the cached part of the prompt is priced at the cached price, the rest at the prompt price
    assert token_cost(p, 1000, 10, cached_tokens=400) == pytest.approx(0.6 * 0.6 + 0.4 * 0.15 + 0.01 * 2.4)


def test_cached_tokens_default_to_the_prompt_price_and_are_bounded_by_the_prompt():
    p = TierPrice(prompt_per_1k=1.0, completion_per_1k=2.0)
    assert p.cached_prompt == 1.0
    assert token_cost(p, 100, 0, cached_tokens=50) == pytest.approx(0.1)
    assert token_cost(p, 100, 0, cached_tokens=500) == pytest.approx(0.1)  # a backend over-reporting: at most all
    assert token_cost(p, -5, -1, cached_tokens=-3) == 0.0


def test_no_price_costs_nothing_and_the_reference_is_the_reference_tiers_price():
    c = CostsConfig(reference_tier="cloud", prices={"cloud": TierPrice(prompt_per_1k=1, completion_per_1k=3)})
    assert c.cost("edge", 1000, 1000) == 0.0  # a tier without prices
    assert c.cost("cache", 1000, 1000) == 0.0
    assert c.reference(500, 100) == pytest.approx(0.5 + 0.3)
    assert c.cost("cloud", 500, 100) == c.reference(500, 100)


def test_the_header_format_keeps_ten_decimals():
    assert format_cost(42 / 1000 * 0.6 + 7 / 1000 * 2.4) == "0.0420000000"
    assert format_cost(1 / 1000 * 0.00002) == "0.0000000200"
    assert float(format_cost(0.123456789012)) == pytest.approx(0.123456789012, abs=1e-10)


# ---- validation -----------------------------------------------------------------------------------------------


def test_a_costs_section_loads():
    p = parse_policy(_with_costs())
    assert p.costs is not None and p.costs.currency == "USD" and p.costs.reference_tier == "cloud"
    assert p.costs.prices["cloud"].cached_prompt == 0.15 and p.costs.prices["edge"].cached_prompt == 0.01
    assert parse_policy(BASE).costs is None  # no section: spend is not counted


@pytest.mark.parametrize("field", ["prompt_per_1k", "cached_prompt_per_1k", "completion_per_1k"])
def test_a_negative_price_is_an_error_naming_the_field_and_its_line(field):
    text = _with_costs(COSTS.replace("    edge: {prompt_per_1k: 0.01, completion_per_1k: 0.03}",
                                     f"    edge: {{prompt_per_1k: 0.01, completion_per_1k: 0.03, {field}: -1}}"
                                     if field == "cached_prompt_per_1k" else
                                     f"    edge: {{{field}: -1}}"))
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml")
    (problem,) = info.value.problems
    assert problem.field == f"costs.prices.edge.{field}"
    assert problem.line == _line_of(text, "    edge: {")
    assert "greater than or equal to 0" in problem.message
    assert str(problem).startswith(f"p.yaml:{problem.line}:")


@pytest.mark.parametrize("bad, field, words", [
    ("prompt_per_1k: .nan", "costs.prices.cloud.prompt_per_1k", "finite"),
    ("prompt_per_1k: .inf", "costs.prices.cloud.prompt_per_1k", "finite"),
    ("prompt_per_1k: cheap", "costs.prices.cloud.prompt_per_1k", "number"),
    ("per_second: 3", "costs.prices.cloud.per_second", "unknown field 'per_second'; allowed here: prompt_per_1k"),
])
def test_prices_must_be_finite_numbers_and_known_fields(bad, field, words):
    text = _with_costs(COSTS.replace("prompt_per_1k: 0.6", bad, 1))
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml")
    assert [p.field for p in info.value.problems] == [field]
    assert words in info.value.problems[0].message


def test_unknown_tiers_in_costs_are_errors_and_a_tier_without_prices_a_warning():
    text = _with_costs(COSTS.replace("reference_tier: cloud", "reference_tier: clod")
                       .replace("    edge: {", "    egde: {"))
    policy, problems = check_policy(text, "p.yaml")
    assert policy is None
    errors = {p.field: p for p in problems if p.severity == "error"}
    assert set(errors) == {"costs.reference_tier", "costs.prices.egde"}
    assert "unknown tier 'clod'" in errors["costs.reference_tier"].message
    assert errors["costs.reference_tier"].line == _line_of(text, "reference_tier: clod")
    assert errors["costs.prices.egde"].line == _line_of(text, "    egde: {")
    warnings = [p for p in problems if p.severity == "warning"]
    assert [w.message for w in warnings] == ["tier 'edge' has no prices: its tokens count as costing 0 USD"]

    policy, problems = check_policy(_with_costs(COSTS.replace("    edge: {prompt_per_1k: 0.01, "
                                                              "completion_per_1k: 0.03}\n", "")), "p.yaml")
    assert policy is not None
    assert [(p.field, p.severity) for p in problems] == [("costs.prices", "warning")]


def test_reference_tier_is_required_and_currency_is_a_label():
    with pytest.raises(PolicyError) as info:
        parse_policy(_with_costs(COSTS.replace("  reference_tier: cloud\n", "")), "p.yaml")
    assert [p.field for p in info.value.problems] == ["costs.reference_tier"]
    with pytest.raises(PolicyError) as info:
        parse_policy(_with_costs(COSTS.replace("currency: USD", "currency: 'US $'")), "p.yaml")
    assert [p.field for p in info.value.problems] == ["costs.currency"]


# ---- policy check -----------------------------------------------------------------------------------------------


def test_policy_check_shows_the_cost_model(tmp_path):
    f = tmp_path / "policy.yaml"
    f.write_text(_with_costs(COSTS.replace("    edge: {prompt_per_1k: 0.01, completion_per_1k: 0.03}\n", "")))
    r = CliRunner().invoke(policy_app, ["check", str(f), "--no-servers"])
    assert r.exit_code == 0, r.output
    assert "warning: `costs.prices`: tier 'edge' has no prices" in r.output
    assert "costs: USD per 1,000 tokens (prompt / cached prompt / completion); savings against 'cloud'" in r.output
    assert "  cloud: 0.6 / 0.15 / 2.4" in r.output
    assert "  edge: no prices (counted as 0)" in r.output

    r = CliRunner().invoke(policy_app, ["check", str(f), "--no-servers", "--json"])
    out = json.loads(r.stdout)
    assert out["costs"]["reference_tier"] == "cloud" and out["costs"]["prices"]["cloud"]["completion_per_1k"] == 2.4

    f.write_text(BASE)
    r = CliRunner().invoke(policy_app, ["check", str(f), "--no-servers"])
    assert "costs: none (no `costs` section: spend and savings are not counted)" in r.output


# ---- a self-hosted tier priced by node time -------------------------------------------------------------------

NODE = "    edge: {node: {per_second: 0.0004, tokens_per_s: 25%s}}"


def _node_costs(extra: str = "") -> str:
    return _with_costs(COSTS.replace("    edge: {prompt_per_1k: 0.01, completion_per_1k: 0.03}", NODE % extra))


def test_a_node_priced_tier_derives_its_price_per_token_from_a_benchmark():
    costs = parse_policy(_node_costs()).costs
    assert costs is not None
    price = costs.tier_price("edge")
    assert price is not None
    # a second of node time buys 25 tokens: 1,000 tokens take 40 s at 0.0004 per second
    assert price.completion_per_1k == pytest.approx(0.016) and price.prompt_per_1k == 0.0
    assert costs.cost("edge", 300, 250) == pytest.approx(250 / 1000 * 0.016)
    assert costs.basis("edge") is PriceBasis.BENCHMARK and costs.basis("cloud") is PriceBasis.TOKENS
    assert costs.basis("cache") is None
    assert costs.throughput("edge") == (25, PriceBasis.BENCHMARK) and costs.throughput("cloud") is None
    costs.read_live_throughput(lambda tier: 1000.0)  # benchmark means benchmark, whatever the nodes say
    assert costs.tier_price("edge") == price


def test_live_throughput_prices_by_the_nodes_own_figure_and_the_benchmark_until_one_reports():
    costs = parse_policy(_node_costs(", throughput: live")).costs
    assert costs is not None
    assert costs.throughput("edge") == (25, PriceBasis.BENCHMARK_NO_READING)  # nothing bound yet
    readings: dict[str, float | None] = {"edge": None}
    costs.read_live_throughput(readings.get)
    assert costs.basis("edge") is PriceBasis.BENCHMARK_NO_READING
    assert costs.cost("edge", 0, 1000) == pytest.approx(0.016)
    readings["edge"] = 50.0
    assert costs.throughput("edge") == (50.0, PriceBasis.LIVE)
    assert costs.cost("edge", 0, 1000) == pytest.approx(0.008)  # twice as fast: half the price
    for nonsense in (0.0, -3.0, float("nan"), float("inf")):
        readings["edge"] = nonsense
        assert costs.basis("edge") is PriceBasis.BENCHMARK_NO_READING
        assert costs.cost("edge", 0, 1000) == pytest.approx(0.016)


@pytest.mark.parametrize("node, field, words", [
    ("{per_second: 0, tokens_per_s: 25}", "costs.prices.edge.node.per_second", "greater than 0"),
    ("{per_second: 0.1, tokens_per_s: -1}", "costs.prices.edge.node.tokens_per_s", "greater than 0"),
    ("{per_second: 0.1}", "costs.prices.edge.node.tokens_per_s", "required"),
    ("{per_second: 0.1, tokens_per_s: .inf}", "costs.prices.edge.node.tokens_per_s", "finite"),
    ("{per_second: 0.1, tokens_per_s: 5, throughput: measured}", "costs.prices.edge.node.throughput", "benchmark"),
])
def test_node_time_is_validated_naming_file_line_and_field(node, field, words):
    text = _with_costs(COSTS.replace("    edge: {prompt_per_1k: 0.01, completion_per_1k: 0.03}",
                                     f"    edge: {{node: {node}}}"))
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml")
    (problem,) = info.value.problems
    assert problem.field == field and words in problem.message, problem
    assert str(problem).startswith(f"p.yaml:{_line_of(text, '    edge: {node')}:")


def test_token_prices_and_node_time_together_are_an_error():
    text = _with_costs(COSTS.replace("    edge: {prompt_per_1k: 0.01, completion_per_1k: 0.03}",
                                     "    edge: {completion_per_1k: 0.03, node: {per_second: 1, tokens_per_s: 5}}"))
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml")
    (problem,) = info.value.problems
    assert problem.field == "costs.prices.edge" and "not both" in problem.message


def test_live_throughput_is_for_edge_tiers():
    text = _with_costs(COSTS.replace("    cloud: {prompt_per_1k: 0.6, cached_prompt_per_1k: 0.15, completion_per_1k: 2.4}",
                                     "    cloud: {node: {per_second: 0.01, tokens_per_s: 900, throughput: live}}"))
    policy, problems = check_policy(text, "p.yaml")
    assert policy is None
    (problem,) = [p for p in problems if p.severity == "error"]
    assert problem.field == "costs.prices.cloud.node.throughput" and "'cloud' is a cloud tier" in problem.message
    assert problem.line == _line_of(text, "    cloud: {node")


def test_policy_check_says_which_throughput_a_derived_price_uses(tmp_path):
    f = tmp_path / "policy.yaml"
    f.write_text(_node_costs())
    r = CliRunner().invoke(policy_app, ["check", str(f), "--no-servers"])
    assert r.exit_code == 0, r.output
    assert ("  edge: 0 / 0 / 0.016  (derived: 0.0004 per node-second / 25 tokens/s; throughput: the benchmark "
            "figure in this policy)") in r.output
    f.write_text(_node_costs(", throughput: live"))
    r = CliRunner().invoke(policy_app, ["check", str(f), "--no-servers"])
    assert "throughput: measured live by its nodes; until one reports, the benchmark figure)" in r.output
    r = CliRunner().invoke(policy_app, ["check", str(f), "--no-servers", "--json"])
    assert json.loads(r.stdout)["costs"]["prices"]["edge"]["node"] == {
        "per_second": 0.0004, "tokens_per_s": 25.0, "throughput": "live"}
