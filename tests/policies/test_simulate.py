"""policies/simulate: what `policy simulate` reports per request and in totals, the numbers an operator sizes
tiers and thresholds by (shares per tier and kind, rejects, rules, what the cache could answer, per source)."""

from __future__ import annotations

import pytest

from tiergate.core.types import CacheRule, Cascade, Decision, Features, Priority, Reject
from tiergate.policies.loader import parse_policy
from tiergate.policies.simulate import UNLABELLED, Simulation

from .conftest import BASE


def _features(text: str = "hello", tenant: str = "t", temperature: float | None = None) -> Features:
    return Features(prompt_tokens=len(text.split()), priority=Priority.HIGH, complexity=0.123456,
                    requested_model="auto", tenant=tenant, text=text, temperature=temperature)


EDGE = Decision(rule="default", tier="edge", fallbacks=("cloud",))
CLOUD = Decision(rule="complex", tier="cloud")
REJECT = Decision(rule="blocked", tier=None, reject=Reject(429, "no"))


@pytest.fixture
def sim() -> Simulation:
    return Simulation(parse_policy(BASE))


def test_a_row_describes_the_decision(sim: Simulation) -> None:
    assert sim.row(_features("what is tea"), EDGE) == {
        "tier": "edge", "rule": "default", "fallbacks": ["cloud"], "complexity": 0.1235, "prompt_tokens": 3,
        "priority": "high", "cache": "eligible"}
    assert sim.row(_features(), EDGE, source="chat")["source"] == "chat"


def test_the_cache_column_says_off_too_hot_eligible_or_an_exact_repeat(sim: Simulation) -> None:
    off = Decision(rule="default", tier="edge", cache=CacheRule(enabled=False))
    assert sim.row(_features("a"), off)["cache"] == "off"
    assert sim.row(_features("a", temperature=0.9), EDGE)["cache"] == "too hot"  # above max_temperature 0.3
    assert sim.row(_features("a", temperature=0.3), EDGE)["cache"] == "eligible"
    assert sim.row(_features("a"), EDGE)["cache"] == "repeat"
    assert sim.row(_features("a", tenant="other"), EDGE)["cache"] == "eligible"  # tenants never share answers
    assert sim.row(_features("a"), CLOUD)["cache"] == "eligible"  # another tier's model: another answer
    cache = sim.totals()["cache"]
    assert (cache["eligible"], cache["exact_repeats"], cache["semantic_lookups"]) == (4, 1, 4)
    assert cache["eligible_share"] == round(4 / 6, 4) and cache["exact_repeat_share"] == round(1 / 6, 4)


def test_a_reject_is_counted_by_status_and_never_cached(sim: Simulation) -> None:
    row = sim.row(_features(), REJECT)
    assert row["reject"] == 429 and row["cache"] == "none" and row["tier"] is None
    sim.row(_features(), EDGE)
    totals = sim.totals()
    assert totals["rejected"] == {"count": 1, "share": 0.5, "by_status": {"429": 1}}
    assert totals["tiers"] == {"edge": {"count": 1, "share": 0.5}}


def test_totals_give_shares_per_tier_and_kind_rules_by_count_and_errors(sim: Simulation) -> None:
    for d in (EDGE, EDGE, EDGE, CLOUD):
        sim.row(_features(), d)
    sim.error()
    totals = sim.totals()
    assert (totals["requests"], totals["decided"], totals["errors"]) == (5, 4, 1)
    assert totals["tiers"] == {"cloud": {"count": 1, "share": 0.25}, "edge": {"count": 3, "share": 0.75}}
    assert totals["kinds"] == {"cloud": {"count": 1, "share": 0.25}, "edge": {"count": 3, "share": 0.75}}
    assert list(totals["rules"].items()) == [("default", 3), ("complex", 1)]  # most used first
    assert "sources" not in totals  # no line named its source


def test_nothing_decided_gives_zero_shares(sim: Simulation) -> None:
    sim.error()
    totals = sim.totals()
    assert totals["requests"] == 1 and totals["rejected"]["share"] == 0.0 and totals["cache"]["eligible_share"] == 0.0


def test_per_source_totals_show_a_kind_of_traffic_the_mix_hides(sim: Simulation) -> None:
    """Once any line names its source; lines without one are grouped as UNLABELLED."""
    for d in (CLOUD, CLOUD, CLOUD, EDGE):
        sim.row(_features(), d, source="batch-eval")
    for d in (EDGE, EDGE, EDGE, REJECT):
        sim.row(_features(), d, source="support-chat")
    sim.row(_features(), EDGE)
    assert sim.totals()["sources"] == {
        UNLABELLED: {"decided": 1, "cloud_share": 0.0, "edge_share": 1.0, "rejected_share": 0.0},
        "batch-eval": {"decided": 4, "cloud_share": 0.75, "edge_share": 0.25, "rejected_share": 0.0},
        "support-chat": {"decided": 4, "cloud_share": 0.0, "edge_share": 0.75, "rejected_share": 0.25},
    }


def test_a_cascade_rule_replays_the_recorded_confidence(sim: Simulation) -> None:
    cascade = Decision(rule="default", tier="edge", cascade=Cascade(escalate_to="cloud", min_mean_logprob=-0.5))
    assert sim.row(_features(), cascade, cascade={"mean_logprob": -0.1})["cascade"] == "kept"
    assert sim.row(_features(), cascade, cascade={"mean_logprob": -2, "edge_tokens": 9})["cascade"] == \
        "escalated:low_mean_logprob"
    assert "cascade" not in sim.row(_features(), EDGE)  # not a cascade rule: nothing to replay
    totals = sim.totals()["cascade"]
    assert totals["rules"]["default"]["kept"] == 1 and totals["escalated_edge_tokens"] == 9
    assert totals["escalated_share_of_all"] == round(1 / 3, 4)


# ---- cost -----------------------------------------------------------------------------------------------------

PRICED = BASE.replace("rules:\n", """costs:
  currency: EUR
  reference_tier: cloud
  prices:
    cloud: {prompt_per_1k: 1.0, completion_per_1k: 2.0}
    edge: {node: {per_second: 0.001, tokens_per_s: 10}}
rules:
""", 1)
CASCADE = Decision(rule="default", tier="edge", cascade=Cascade(escalate_to="cloud", min_mean_logprob=-0.5))


def test_each_request_is_priced_and_the_saving_split_by_edge_cache_cascade_and_cloud() -> None:
    sim = Simulation(parse_policy(PRICED), assumed_completion=50)
    edge_per_token = 0.001 / 10  # a node-second buys 10 completion tokens
    # edge: 1000 completion tokens at 0.0001 each; the same on the cloud: 3 prompt tokens and 1000 completion
    row = sim.row(_features("what is tea"), EDGE, line={"completion_tokens": 1000})
    assert row["cost"] == pytest.approx(1000 * edge_per_token)
    assert row["reference"] == pytest.approx((3 * 1.0 + 1000 * 2.0) / 1000)
    # the same request again: an exact repeat a warm cache answers for nothing
    assert sim.row(_features("what is tea"), EDGE, line={"completion_tokens": 1000})["cost"] == 0.0
    # the cloud itself saves nothing; no completion_tokens: its max_tokens
    row = sim.row(_features("a b", tenant="u"), CLOUD, line={"max_tokens": 100})
    assert row["cost"] == row["reference"] == pytest.approx((2 + 200) / 1000)
    # cascade kept: the edge's price; escalated: the edge's thrown-away tokens plus the cloud's answer
    kept = sim.row(_features("k", tenant="v"), CASCADE, cascade={"mean_logprob": -0.1}, line={})
    assert kept["cost"] == pytest.approx(50 * edge_per_token)  # neither given: the assumed 50
    escalated = sim.row(_features("e", tenant="w"), CASCADE, cascade={"mean_logprob": -2, "tokens": 30},
                        line={"completion_tokens": 40})
    assert escalated["cost"] == pytest.approx(30 * edge_per_token + (1 + 80) / 1000)
    assert "cost" not in sim.row(_features(), REJECT, line={})  # nothing answered, nothing priced

    cost = sim.totals()["cost"]
    assert cost["currency"] == "EUR" and cost["reference_tier"] == "cloud"
    assert cost["saved_by"] == pytest.approx({
        "edge": 2.003 - 0.1, "cache": 2.003, "cloud": 0.0,
        "cascade": (1 + 100) / 1000 - 50 * edge_per_token - 30 * edge_per_token})
    assert cost["saved"] == pytest.approx(sum(cost["saved_by"].values()))
    assert cost["saved"] == pytest.approx(cost["reference"] - cost["spend"])
    assert cost["spend_by_tier"] == pytest.approx({"cache": 0.0, "cloud": 0.202 + 0.081,
                                                   "edge": 0.1 + 0.005 + 0.003})
    assert cost["completion_tokens_assumed"] == 2  # max_tokens and the assumed 50


def test_a_policy_without_costs_prices_nothing(sim: Simulation) -> None:
    assert "cost" not in sim.row(_features(), EDGE, line={"completion_tokens": 5})
    assert "cost" not in sim.totals()
