"""Hypothesis on the policy loader: whatever an operator (or a half-finished save) puts in the file,
`parse_policy` answers with a `Policy` or a `PolicyError` that locates every problem — never another
exception — and every policy generated valid by construction loads, round-trips through YAML unchanged,
and drives a `PolicyEngine` whose decisions only name the policy's own rules and tiers.
"""

from __future__ import annotations

import io
import string

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from tiergate.core.types import Features, Priority
from tiergate.policies.engine import PolicyEngine
from tiergate.policies.loader import PolicyError, parse_policy
from tiergate.policies.model import Policy

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
SOURCE = "fuzz.yaml"


def dump(data: object) -> str:
    y = YAML(typ="safe", pure=True)
    y.default_flow_style = False
    buf = io.StringIO()
    y.dump(data, buf)
    return buf.getvalue()


def outcome(text: str) -> Policy | PolicyError:
    """Policy or PolicyError; anything else fails the test. A PolicyError must locate each problem."""
    try:
        return parse_policy(text, SOURCE)
    except PolicyError as exc:
        assert exc.problems, "a PolicyError without problems"
        for p in exc.problems:
            assert p.source == SOURCE and p.message and p.severity == "error"
            assert p.line is None or p.line >= 1
            assert str(p).startswith(f"{SOURCE}:")
        assert str(exc)
        return exc


# ---- arbitrary input ------------------------------------------------------------------------------------------

yaml_chars = st.text(alphabet=st.sampled_from(list(string.printable) + ["é", "\u2028", "\x00", "\ufeff"]),
                     max_size=300)


@FUZZ
@given(text=st.one_of(st.text(max_size=300), yaml_chars))
@example(text="")
@example(text="tiers: [")
@example(text="? [a, b]\n: c\n")
@example(text="a: &x [1]\nb: *x\n")
@example(text="!!python/object:os.system {}\n")
@example(text="---\na: 1\n---\nb: 2\n")
@example(text="a: ._\n")  # resolved as a float, then not one: ruamel raised a bare ValueError
def test_arbitrary_text(text):
    out = outcome(text)
    if isinstance(out, Policy):
        PolicyEngine(out)


scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False),
                    st.text(max_size=12), st.sampled_from(["edge", "cloud", "low", "high", "auto", "*"]))
yaml_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.one_of(st.text(max_size=10), st.sampled_from(
        ["tiers", "rules", "kind", "model", "when", "tier", "fallbacks", "name", "endpoints", "priority", "min", "max",
         "in", "keywords", "any", "reject", "status", "message", "cache", "timeouts", "defaults", "default_tier"])),
        inner, max_size=5)), max_leaves=30)


@FUZZ
@given(doc=yaml_values)
def test_arbitrary_yaml_structures(doc):
    out = outcome(dump(doc))
    if isinstance(out, Policy):
        PolicyEngine(out)


# ---- valid by construction ------------------------------------------------------------------------------------

names = st.from_regex(r"[a-z][a-z0-9_-]{0,8}", fullmatch=True).filter(lambda n: n not in ("cache", "default"))
urls = st.builds(lambda h, p: f"http://10.0.{h}.1:{p}", st.integers(0, 255), st.integers(1, 65535))
priorities = st.sampled_from(["low", "normal", "high", "critical"])
positive = st.floats(0.01, 600, allow_nan=False)


def ordered(lo: st.SearchStrategy, hi_max) -> st.SearchStrategy[dict]:
    return st.tuples(lo, lo).map(sorted).flatmap(lambda ab: st.fixed_dictionaries(
        {}, optional={"min": st.just(ab[0]), "max": st.just(ab[1])}))


timeouts = st.fixed_dictionaries({}, optional={"connect_s": positive, "first_byte_s": positive,
                                               "between_chunks_s": positive, "total_s": positive,
                                               "queue_s": st.floats(0, 60)})
cache = st.fixed_dictionaries({}, optional={"enabled": st.booleans(), "semantic": st.booleans(),
                                            "threshold": st.floats(0, 1), "ttl_s": st.integers(0, 10**6),
                                            "max_temperature": st.floats(0, 2)})


@st.composite
def valid_policies(draw) -> dict:
    tier_names = draw(st.lists(names, min_size=1, max_size=4, unique=True))
    tiers = {}
    for i, name in enumerate(tier_names):
        kind = draw(st.sampled_from(["edge", "cloud"]))
        cfg: dict = {"kind": kind, "model": f"model-{name}"}
        eps = draw(st.lists(urls, min_size=1 if kind == "cloud" else 0, max_size=3, unique=True))
        if eps:
            cfg["endpoints"] = eps
        later = tier_names[i + 1:]  # fallbacks only point forward: no loops by construction
        if later and draw(st.booleans()):
            cfg["fallbacks"] = draw(st.lists(st.sampled_from(later), max_size=len(later), unique=True))
        if draw(st.booleans()):
            cfg["timeouts"] = draw(timeouts)
        if draw(st.booleans()):
            cfg["max_concurrency"] = draw(st.integers(1, 1000))
        if draw(st.booleans()):
            cfg["max_context"] = draw(st.integers(1, 200_000))
        tiers[name] = cfg

    def action() -> dict:
        if draw(st.integers(0, 5)) == 0:
            return {"reject": {"status": draw(st.integers(400, 599)), "message": draw(st.text(min_size=1, max_size=20)),
                               "code": draw(st.from_regex(r"[a-z0-9_]{1,12}", fullmatch=True))}}
        tier = draw(st.sampled_from(tier_names))
        out: dict = {"tier": tier}
        others = [t for t in tier_names if t != tier]
        if others and draw(st.booleans()):
            out["fallbacks"] = draw(st.lists(st.sampled_from(others), max_size=len(others), unique=True))
        if draw(st.booleans()):
            out["max_tokens"] = draw(st.integers(1, 100_000))
        if draw(st.booleans()):
            out["cache"] = draw(cache)
        if draw(st.booleans()):
            out["timeouts"] = draw(timeouts)
        return out

    rules = []
    for j, rname in enumerate(draw(st.lists(names, max_size=5, unique=True))):
        # A keyword of its own keeps every rule reachable whatever else it asks for.
        when: dict = {"keywords": {"any": [f"kw{j}"]}}
        if draw(st.booleans()):
            when["prompt_tokens"] = draw(ordered(st.integers(0, 10_000), None))
        if draw(st.booleans()):
            when["complexity"] = draw(ordered(st.floats(0, 1), None))
        if draw(st.booleans()):
            when["priority"] = {"min": draw(priorities)}
        if draw(st.booleans()):
            when["model"] = draw(st.lists(st.sampled_from(["auto", *[t["model"] for t in tiers.values()]]),
                                          min_size=1, max_size=3, unique=True))
        if draw(st.booleans()):
            when["stream"] = draw(st.booleans())
        if draw(st.booleans()):
            when["headers"] = {"x-team": draw(st.sampled_from(["a", "b", "*"]))}
        rules.append({"name": rname, "when": when, **action()})
    doc: dict = {"version": 1, "tiers": tiers}
    if draw(st.booleans()):
        doc["defaults"] = {"cache": draw(cache), "timeouts": draw(timeouts)}
    last = draw(st.sampled_from(tier_names))
    if draw(st.booleans()) and all(r["name"] != "default" for r in rules):
        doc["default_tier"] = last
    else:
        rules.append({"name": "catch-all", "tier": last})
    doc["rules"] = rules
    return doc


features = st.builds(
    Features, prompt_tokens=st.integers(0, 20_000), priority=st.sampled_from(list(Priority)),
    complexity=st.floats(0, 1), requested_model=st.sampled_from(["auto", "nope", "model-a"]),
    tenant=st.text(max_size=5), text=st.sampled_from(["", "kw0 here", "KW1 kw2", "nothing", "kw3 kw4"]),
    headers=st.sampled_from([{}, {"x-team": "a"}, {"x-team": "b"}]), stream=st.booleans())


@settings(FUZZ, max_examples=120)
@given(doc=valid_policies(), feats=st.lists(features, min_size=1, max_size=5))
def test_valid_policies_load_round_trip_and_decide(doc, feats):
    text = dump(doc)
    policy = parse_policy(text, SOURCE)  # valid by construction: a PolicyError here is a loader bug
    assert set(policy.tiers) == set(doc["tiers"])
    # Round trip: what the model dumps is a policy file that loads back to the same policy.
    again = parse_policy(dump(policy.model_dump(mode="json", by_alias=True, exclude_none=True)), SOURCE)
    assert again == policy
    engine = PolicyEngine(policy)
    rule_names = {r.name for r in policy.effective_rules()}
    for f in feats:
        d = engine.decide(f)
        assert d.rule in rule_names
        if d.reject is None:
            assert d.tier in policy.tiers and set(d.fallbacks) <= set(policy.tiers) and d.tier not in d.fallbacks
        else:
            assert d.tier is None and 400 <= d.reject.status <= 599
        assert engine.explain(f).decision == d
        assert PolicyEngine(again).decide(f) == d


@st.composite
def mutated(draw) -> dict:
    """A valid policy with one node replaced, deleted or joined by an unknown key."""
    doc = draw(valid_policies())
    node, path = doc, []
    while isinstance(node, (dict, list)) and node and draw(st.integers(0, 3)) > 0:
        key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else list(range(len(node)))))
        path.append(key)
        parent, node = node, node[key]
    if not path:
        return {"junk": draw(yaml_values)} | doc
    op = draw(st.sampled_from(["replace", "delete", "extra"]))
    if op == "replace" or (op == "extra" and not isinstance(node, dict)):
        parent[path[-1]] = draw(yaml_values)
    elif op == "delete":
        del parent[path[-1]]
    else:
        node[draw(st.text(min_size=1, max_size=8))] = draw(yaml_values)
    return doc


@settings(FUZZ, max_examples=150)
@given(doc=mutated())
def test_mutated_policies(doc):
    out = outcome(dump(doc))
    if isinstance(out, Policy):
        PolicyEngine(out).decide(Features(10, Priority.NORMAL, 0.5, "auto", "t"))


# ---- found by fuzzing: failing until fixed (see docs/reliability.md) -------------------------------------------

@pytest.mark.parametrize("line", ["  e: {kind: edge, model: m, tokenizer: '%s.json'}",
                                  "  e: {kind: edge, model: m}\ncomplexity_model: '%s'"])
def test_overlong_file_name_is_a_policy_error(line):
    text = "tiers:\n" + line % ("a" * 5000) + "\nrules: [{name: r, tier: e}]\n"
    assert isinstance(outcome(text), PolicyError)
