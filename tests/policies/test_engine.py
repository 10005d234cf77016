"""The engine: first matching rule wins, every condition kind, the Decision it builds, and explain."""

from __future__ import annotations

import itertools

import pytest

from tiergate.core.types import CacheRule, Features, Priority, Timeouts
from tiergate.policies.engine import PolicyEngine
from tiergate.policies.loader import parse_policy
from tiergate.policies.model import Policy

from .conftest import BASE


def feats(**kw) -> Features:
    base = dict(prompt_tokens=10, priority=Priority.NORMAL, complexity=0.1, requested_model="auto", tenant="t1",
                text="hello", headers={}, stream=False)
    return Features(**{**base, **kw})


@pytest.fixture
def engine() -> PolicyEngine:
    return PolicyEngine(parse_policy(BASE))


def test_first_matching_rule_wins(engine):
    assert engine.decide(feats()).rule == "default"
    assert engine.decide(feats(complexity=0.8)).rule == "complex"
    # both `long` and `complex` hold: the earlier one decides
    assert engine.decide(feats(prompt_tokens=5000, complexity=0.9)).rule == "long"
    assert engine.decide(feats(prompt_tokens=1999, complexity=0.69)).rule == "default"
    assert engine.decide(feats(prompt_tokens=2000)).rule == "long"  # bounds are inclusive


def test_decision_merges_defaults_tier_and_rule(engine):
    d = engine.decide(feats(complexity=0.9))
    assert d.tier == "cloud" and d.fallbacks == ("edge",) and d.tiers == ("cloud", "edge")
    assert d.cache == CacheRule(enabled=True, semantic=True, threshold=0.9, ttl_s=600, max_temperature=0.3)
    assert d.timeouts == Timeouts(connect_s=1, first_byte_s=30, between_chunks_s=30.0, total_s=600.0, queue_s=2)
    assert d.max_tokens_cap == 1000
    # a rule without fallbacks inherits its tier's (edge -> cloud); the cloud tier has none
    assert engine.decide(feats()).fallbacks == ("cloud",)
    assert engine.decide(feats(prompt_tokens=3000)).fallbacks == ()
    # tier timeouts apply only to that tier's decisions
    assert engine.decide(feats()).timeouts.first_byte_s == Timeouts().first_byte_s


def test_decisions_are_built_once(engine):
    assert engine.decide(feats()) is engine.decide(feats(text="other"))


RULES = """\
rules:
  - name: tok
    when: {prompt_tokens: {min: 100, max: 200}}
    tier: cloud
  - name: pri-in
    when: {priority: {in: [critical]}}
    tier: cloud
  - name: pri-max
    when: {priority: {max: low}}
    tier: edge
    fallbacks: []
  - name: model
    when: {model: [tiergate-cloud]}
    tier: cloud
  - name: tenant
    when: {tenant: [acme, globex]}
    tier: cloud
  - name: hdr-eq
    when: {headers: {X-Route: cloud}}
    tier: cloud
  - name: hdr-in
    when: {headers: {x-group: {in: [a, b]}}}
    tier: cloud
  - name: hdr-present
    when: {headers: {x-debug: {present: true}}}
    tier: edge
    cache: {enabled: false}
  - name: kw-any
    when: {keywords: {any: [SQL, "step by step"]}}
    tier: cloud
  - name: kw-all
    when: {keywords: {all: [invoice, refund]}}
    tier: cloud
    max_tokens: 50
  - name: stream
    when: {stream: true}
    tier: edge
    timeouts: {between_chunks_s: 5}
  - name: blocked
    when: {tenant: [banned]}
    reject: {status: 403, message: "Tenant suspended.", code: suspended}
  - name: rest
    tier: edge
"""


@pytest.fixture
def rich_engine() -> PolicyEngine:
    return PolicyEngine(parse_policy(BASE.split("rules:\n")[0] + RULES))


@pytest.mark.parametrize("kw,rule", [
    ({"prompt_tokens": 150}, "tok"),
    ({"prompt_tokens": 201}, "rest"),
    ({"priority": Priority.CRITICAL}, "pri-in"),
    ({"priority": Priority.HIGH}, "rest"),
    ({"priority": Priority.LOW}, "pri-max"),
    ({"requested_model": "tiergate-cloud"}, "model"),
    ({"tenant": "globex"}, "tenant"),
    ({"headers": {"x-route": "cloud"}}, "hdr-eq"),
    ({"headers": {"x-route": "Cloud"}}, "rest"),  # values are case-sensitive
    ({"headers": {"x-group": "b"}}, "hdr-in"),
    ({"headers": {"x-debug": ""}}, "hdr-present"),
    ({"text": "write an sql query"}, "kw-any"),  # keywords are case-insensitive
    ({"text": "use PostgreSQL"}, "rest"),  # ... and whole words
    ({"text": "Think Step By Step."}, "kw-any"),
    ({"text": "refund this invoice"}, "kw-all"),
    ({"text": "refund only"}, "rest"),
    ({"stream": True}, "stream"),
    ({"tenant": "banned"}, "blocked"),
])
def test_each_condition_kind(rich_engine, kw, rule):
    assert rich_engine.decide(feats(**kw)).rule == rule


def test_rule_actions(rich_engine):
    assert rich_engine.decide(feats(headers={"x-debug": "1"})).cache.enabled is False
    assert rich_engine.decide(feats(text="invoice refund")).max_tokens_cap == 50
    assert rich_engine.decide(feats(stream=True)).timeouts.between_chunks_s == 5
    assert rich_engine.decide(feats(priority=Priority.LOW)).fallbacks == ()
    d = rich_engine.decide(feats(tenant="banned"))
    assert d.tier is None and d.tiers == () and d.reject is not None
    assert (d.reject.status, d.reject.message, d.reject.code) == (403, "Tenant suspended.", "suspended")


def test_default_tier_decides_when_nothing_matches():
    text = BASE.replace("  - name: default\n    tier: edge\n", "").replace("rules:\n", "default_tier: cloud\nrules:\n")
    engine = PolicyEngine(parse_policy(text))
    d = engine.decide(feats())
    assert (d.rule, d.tier) == ("default", "cloud")


def test_explain_lists_every_rule_with_reasons(engine):
    ex = engine.explain(feats(prompt_tokens=50, complexity=0.8))
    assert [(t.rule, t.outcome) for t in ex.tried] == [("long", "no match"), ("complex", "matched"),
                                                       ("default", "not reached")]
    long_check = ex.tried[0].checks[0]
    assert long_check.condition == "prompt_tokens >= 2000" and not long_check.held
    assert long_check.observed == "prompt_tokens = 50"
    assert ex.tried[1].checks[0].held and ex.tried[1].matched
    assert ex.decision is engine.decide(feats(prompt_tokens=50, complexity=0.8))
    d = ex.to_dict()
    assert d["decision"]["tier"] == "cloud" and d["rules"][1]["outcome"] == "matched"
    assert d["features"]["priority"] == "normal"


def test_explain_agrees_with_decide_on_many_inputs(rich_engine):
    texts = ["", "sql", "invoice refund", "step by step"]
    for tokens, pri, text, stream in itertools.product([0, 150, 5000], list(Priority), texts, [False, True]):
        f = feats(prompt_tokens=tokens, priority=pri, text=text, stream=stream)
        assert rich_engine.explain(f).decision is rich_engine.decide(f)


def test_engine_refuses_a_policy_without_catch_all():
    p = Policy.model_validate({"tiers": {"edge": {"kind": "edge", "model": "m"}},
                               "rules": [{"name": "x", "when": {"stream": True}, "tier": "edge"}]})
    with pytest.raises(ValueError, match="catch-all"):
        PolicyEngine(p)


def test_the_default_policys_explicit_model_rules_respect_priority_and_the_probe_comes_first():
    """policies/default.yaml, as shipped: naming `tiergate-cloud` does not lift low-priority work off the edge
    (the rule's comment, and `default`'s: all low-priority traffic stays on the edge), and the maintenance probe
    rejects whatever model the request names."""
    from tiergate.policies.loader import DEFAULT_POLICY, load_policy

    engine = PolicyEngine(load_policy(DEFAULT_POLICY))

    def decided(**kw) -> tuple[str, str | None]:
        d = engine.decide(feats(**kw))
        return d.rule, d.tier

    assert decided(requested_model="tiergate-cloud", priority=Priority.LOW) == ("default", "edge")
    assert decided(requested_model="tiergate-cloud", priority=Priority.NORMAL) == ("explicit-cloud", "cloud")
    assert decided(requested_model="tiergate-cloud", priority=Priority.CRITICAL) == ("explicit-cloud", "cloud")
    assert decided(requested_model="tiergate-edge", priority=Priority.LOW) == ("explicit-edge", "edge")
    # a low-priority prompt too long for the edge still goes where it can be answered
    assert decided(requested_model="tiergate-cloud", priority=Priority.LOW, prompt_tokens=3000) == (
        "long-prompt", "cloud")
    for model in ("auto", "tiergate-edge", "tiergate-cloud"):
        assert decided(requested_model=model, headers={"x-tiergate-probe": "reject"}) == ("maintenance-probe", None)
