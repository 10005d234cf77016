"""Loading policies: the shipped files load, and every kind of mistake is reported at its file:line:column
with the field path and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiergate.core.types import Features, Priority
from tiergate.policies.engine import PolicyEngine
from tiergate.policies.loader import PolicyError, check_policy, load_policy, parse_policy
from tiergate.policies.model import Policy

from .conftest import BASE

ROOT = Path(__file__).resolve().parents[2]


def test_base_policy_loads_with_typed_fields(write):
    p = load_policy(write(BASE))
    assert isinstance(p, Policy)
    assert list(p.tiers) == ["edge", "cloud"]
    assert p.tiers["edge"].name == "edge" and p.tiers["edge"].kind == "edge"
    assert p.tiers["cloud"].endpoints == ["http://127.0.0.1:8090"]
    assert p.tiers["edge"].max_concurrency is None  # the gateway then sizes from the backends
    assert [r.name for r in p.rules] == ["long", "complex", "default"]
    assert p.rules[0].when.prompt_tokens.min == 2000
    assert p.source.endswith("policy.yaml") and p.base_dir == write(BASE).parent


@pytest.mark.parametrize("name", ["default.yaml", *[f"examples/{f.name}" for f in
                                                     sorted((ROOT / "policies" / "examples").glob("*.yaml"))]])
def test_shipped_policies_load(name):
    p = load_policy(ROOT / "policies" / name)
    assert p.effective_rules()[-1].when.is_catch_all()


def test_shorthands_are_accepted():
    text = BASE.replace("when: {complexity: {min: 0.7}}",
                        "when: {model: [tiergate-cloud], tenant: acme, headers: {X-Beta: 'yes', x-trace: '*'}}")
    p = parse_policy(text)
    w = p.rules[1].when
    assert w.model.in_ == ["tiergate-cloud"] and w.tenant.in_ == ["acme"]
    assert w.headers["x-beta"].equals == "yes" and w.headers["x-trace"].present is True


def test_priority_names_and_numbers():
    text = BASE.replace("when: {complexity: {min: 0.7}}", "when: {priority: {min: High, in: [2, critical]}}")
    cond = parse_policy(text).rules[1].when.priority
    assert cond.allowed() == {Priority.HIGH, Priority.CRITICAL}


def _error(text: str) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml")
    return info.value


def _line_of(text: str, needle: str, nth: int = 1) -> int:
    seen = 0
    for i, line in enumerate(text.splitlines(), 1):
        if needle in line:
            seen += 1
            if seen == nth:
                return i
    raise AssertionError(f"{needle!r} not in the test policy")


CASES = [
    # (id, old, new, line marker in the new text, field path, words of the message)
    ("unknown-tier", "    fallbacks: [edge]\n  - name: default", "    fallbacks: [egde]\n  - name: default",
     "fallbacks: [egde]", "rules[1].fallbacks[0]", ["unknown tier 'egde'", "cloud, edge"]),
    ("unknown-rule-tier", "    tier: cloud\n  - name: complex", "    tier: clod\n  - name: complex",
     "tier: clod", "rules[0].tier", ["unknown tier 'clod'"]),
    ("fallback-to-self", "    fallbacks: [edge]\n  - name: default", "    fallbacks: [cloud]\n  - name: default",
     "fallbacks: [cloud]#2", "rules[1].fallbacks[0]", ["falls back to its own tier"]),
    ("fallback-loop-in-rule", "    fallbacks: [edge]\n  - name: default", "    fallbacks: [edge, edge]\n  - name: default",
     "fallbacks: [edge, edge]", "rules[1].fallbacks[1]", ["fallback loop", "cloud -> edge -> edge"]),
    ("fallback-loop-between-tiers", "    timeouts: {first_byte_s: 30}", "    timeouts: {first_byte_s: 30}\n    fallbacks: [edge]",
     "fallbacks: [cloud]", "tiers.edge.fallbacks", ["fallback loop", "edge -> cloud -> edge"]),
    ("duplicate-rule-name", "  - name: complex", "  - name: long", "- name: long#2", "rules[1].name",
     ["duplicate rule name 'long'"]),
    ("after-catch-all", "  - name: default\n    tier: edge\n", "  - name: default\n    tier: edge\n  - name: late\n    tier: cloud\n",
     "- name: late", "rules[3]", ["unreachable", "'default'"]),
    ("shadowed", "    when: {complexity: {min: 0.7}}", "    when: {prompt_tokens: {min: 3000, max: 5000}}",
     "min: 3000", "rules[1].when", ["unreachable", "earlier rule 'long'"]),
    ("threshold-out-of-range", "min: 0.7", "min: 1.5", "min: 1.5", "rules[1].when.complexity.min",
     ["less than or equal to 1", "1.5"]),
    ("cache-threshold-out-of-range", "threshold: 0.9", "threshold: 9", "threshold: 9", "defaults.cache.threshold",
     ["less than or equal to 1"]),
    ("cache-verify-mode", "threshold: 0.9", "threshold: 0.9, verify_mode: audit", "verify_mode: audit",
     "defaults.cache.verify_mode", ["'tier' or 'shadow'", "'audit'"]),
    ("min-greater-than-max", "{prompt_tokens: {min: 2000}}", "{prompt_tokens: {min: 2000, max: 10}}",
     "max: 10", "rules[0].when.prompt_tokens", ["min (2000) is greater than max (10)"]),
    ("unknown-field", "    tokenizer: builtin:default", "    tokeniser: builtin:default", "tokeniser",
     "tiers.edge.tokeniser", ["unknown field 'tokeniser'", "tokenizer", "max_context"]),
    ("bad-kind", "    kind: edge", "    kind: fog", "kind: fog", "tiers.edge.kind", ["'edge' or 'cloud'", "'fog'"]),
    ("bad-priority", "{complexity: {min: 0.7}}", "{priority: {min: urgent}}", "urgent", "rules[1].when.priority.min",
     ["unknown priority 'urgent'", "low, normal, high, critical"]),
    ("tier-and-reject", "    tier: edge\n", "    tier: edge\n    reject: {status: 429, message: no}\n", "- name: default",
     "rules[2]", ["exactly one of tier or reject"]),
    ("cascade-threshold-out-of-range", "  - name: default\n    tier: edge\n",
     "  - name: default\n    tier: edge\n    cascade: {min_mean_logprob: 0.5}\n", "min_mean_logprob: 0.5",
     "rules[2].cascade.min_mean_logprob", ["less than or equal to 0"]),
    ("cascade-without-a-signal", "  - name: default\n    tier: edge\n",
     "  - name: default\n    tier: edge\n    cascade: {first_tokens: 4}\n", "cascade:", "rules[2].cascade",
     ["at least one of min_mean_logprob"]),
    ("cascade-to-itself", "  - name: default\n    tier: edge\n",
     "  - name: default\n    tier: edge\n    cascade: {min_margin: 1, escalate_to: edge}\n", "escalate_to: edge",
     "rules[2].cascade.escalate_to", ["cannot escalate to its own tier"]),
    ("reject-status", "    tier: edge\n", "    reject: {status: 200, message: no}\n", "status: 200",
     "rules[2].reject.status", ["greater than or equal to 400"]),
    ("endpoint-with-v1", '["http://127.0.0.1:8090"]', '["http://127.0.0.1:8090/v1"]', "8090/v1",
     "tiers.cloud.endpoints", ["without /v1"]),
    ("cloud-without-endpoints", '    endpoints: ["http://127.0.0.1:8090"]\n', "", "  cloud:", "tiers.cloud",
     ["needs endpoints or discovery"]),
    ("reserved-tier-name", "  cloud:\n", "  cache:\n", "tiers:", "tiers", ["reserved"]),
    ("no-catch-all", "  - name: default\n    tier: edge\n", "", "rules:", "rules", ["catch-all", "default_tier"]),
    ("missing-tokenizer-file", "tokenizer: builtin:default", "tokenizer: ./tok/nothere.json", "nothere",
     "tiers.edge.tokenizer", ["does not exist"]),
    ("unknown-builtin-tokenizer", "tokenizer: builtin:default", "tokenizer: builtin:gpt9", "gpt9",
     "tiers.edge.tokenizer", ["unknown builtin tokenizer"]),
    ("wrong-type", "max_tokens: 1000", "max_tokens: lots", "lots", "defaults.max_tokens", ["valid integer"]),
    ("missing-field", "    model: tiergate-cloud\n", "", "  cloud:", "tiers.cloud.model", ["required field 'model'"]),
    ("routing-bound-below-one", "    timeouts: {first_byte_s: 30}", "    timeouts: {first_byte_s: 30}\n    routing: {load_bound: 0.9}",
     "load_bound: 0.9", "tiers.cloud.routing.load_bound", ["greater than or equal to 1"]),
    ("routing-cached-below-bound", "    timeouts: {first_byte_s: 30}",
     "    timeouts: {first_byte_s: 30}\n    routing: {load_bound: 1.5, cached_load_bound: 1.2}", "routing:",
     "tiers.cloud.routing", ["cached_load_bound (1.2) must be >= load_bound (1.5)"]),
    ("routing-unknown-strategy", "    timeouts: {first_byte_s: 30}",
     "    timeouts: {first_byte_s: 30}\n    routing: {strategy: random}", "strategy: random",
     "tiers.cloud.routing.strategy", ["'prefix', 'round_robin' or 'least_load'", "'random'"]),
    ("routing-on-edge", "    kind: edge\n", "    kind: edge\n    routing: {strategy: least_load}\n", "routing:",
     "tiers.edge.routing", ["routing is for cloud tiers"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_validation_error_names_file_line_and_field(case):
    _id, old, new, marker, field, words = case
    assert old in BASE, "test case does not apply to BASE"
    text = BASE.replace(old, new, 1)
    err = _error(text)
    message = str(err)
    matching = [p for p in err.problems if p.field == field]
    assert matching, f"no problem for `{field}` in:\n{message}"
    problem = matching[0]
    needle, _, nth = marker.partition("#")
    marker_line = _line_of(text, needle, int(nth or 1))
    assert problem.line == marker_line, f"expected line {marker_line}, got {problem}"
    assert problem.column is not None and problem.column >= 1
    for w in words:
        assert w in problem.message, f"{w!r} not in {problem.message!r}"
    assert f"p.yaml:{problem.line}:{problem.column}:" in message and f"`{field}`" in message


def test_cloud_routing_is_read_with_defaults(write):
    text = BASE.replace("    timeouts: {first_byte_s: 30}",
                        "    timeouts: {first_byte_s: 30}\n    routing: {strategy: prefix, max_num_seqs: 64}")
    routing = load_policy(write(text)).tiers["cloud"].routing
    assert (routing.strategy, routing.load_bound, routing.affinity_chars, routing.max_num_seqs) == ("prefix", 1.2, 256, 64)
    assert load_policy(write(BASE)).tiers["cloud"].routing is None  # CloudPool's defaults then


def test_all_problems_are_reported_at_once():
    text = BASE.replace("kind: edge", "kind: fog").replace("min: 0.7", "min: 7")
    err = _error(text)
    assert {p.field for p in err.problems} == {"tiers.edge.kind", "rules[1].when.complexity.min"}
    assert str(err).startswith("2 problems")


@pytest.mark.parametrize("cut", [30, 120, len(BASE) // 2, len(BASE) - 40])
def test_half_written_file_is_an_error_not_a_crash(cut):
    text = BASE[:cut]
    policy, problems = check_policy(text, "half.yaml")
    assert policy is None and problems
    assert all(p.severity == "error" for p in problems if p.severity == "error")
    assert all(str(p).startswith("half.yaml:") for p in problems)


def test_yaml_syntax_error_has_position():
    text = BASE.replace("kind: edge", "kind: [edge")
    err = _error(text)
    (p,) = err.problems
    assert "YAML syntax error" in p.message and p.line is not None and p.line >= _line_of(text, "kind: [edge")


def test_a_scalar_that_looks_like_a_number_but_is_not_one_is_located():
    # ruamel resolves `._` as a float and then fails to build it with a bare ValueError (found by tests/fuzz)
    text = BASE.replace("kind: edge", "kind: ._", 1)
    (p,) = _error(text).problems
    assert p.line == _line_of(text, "kind: ._") and p.column == text.splitlines()[p.line - 1].index("._") + 1
    assert "`._` looks like a number" in p.message and "quote it" in p.message


def test_duplicate_yaml_key_is_an_error():
    text = BASE.replace("    kind: edge\n", "    kind: edge\n    kind: cloud\n", 1)
    err = _error(text)
    assert "YAML" in str(err) and "kind" in str(err)


@pytest.mark.parametrize("text,words", [("", "empty"), ("- just\n- a list\n", "mapping"),
                                        ("tiers: {}\nrules: []\n", "at least 1")])
def test_degenerate_documents(text, words):
    assert words in str(_error(text))


def test_unreadable_file(tmp_path):
    with pytest.raises(PolicyError) as info:
        load_policy(tmp_path / "missing.yaml")
    assert "cannot read" in str(info.value) and "missing.yaml" in str(info.value)


def test_warnings_do_not_block_loading():
    text = BASE.replace("{complexity: {min: 0.7}}", "{model: [gpt-4]}").replace(
        "rules:\n", "default_tier: edge\nrules:\n")
    p = parse_policy(text, "w.yaml")
    assert any("'gpt-4' is not a tier's model" in w for w in p.warnings)
    assert any("default_tier is never used" in w for w in p.warnings)


def test_relative_tokenizer_path_resolves_against_policy_dir(tmp_path, write):
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text((ROOT / "complexity" / "tokenizer_default.json").read_text())
    p = load_policy(write(BASE.replace("tokenizer: builtin:default", "tokenizer: tok")))
    assert p.resolve_path(p.tiers["edge"].tokenizer) == tmp_path / "tok"


def test_default_tier_stands_for_a_last_rule():
    text = BASE.replace("  - name: default\n    tier: edge\n", "").replace("rules:\n", "default_tier: edge\nrules:\n")
    p = parse_policy(text)
    last = p.effective_rules()[-1]
    assert last.name == "default" and last.tier == "edge" and last.when.is_catch_all()


def test_a_cascade_on_a_tier_without_logprobs_is_an_error_at_the_rule():
    text = BASE.replace("    tokenizer: builtin:default\n", "    tokenizer: builtin:default\n    logprobs: false\n")
    text = text.replace("  - name: default\n    tier: edge\n",
                        "  - name: default\n    tier: edge\n    cascade: {min_mean_logprob: -0.5}\n")
    problem = next(p for p in _error(text).problems if p.field == "rules[2].cascade")
    assert problem.line == _line_of(text, "cascade:") and "reports no token log-probabilities" in problem.message


def test_a_cascade_escalates_to_the_rules_first_fallback_by_default():
    text = BASE.replace("  - name: default\n    tier: edge\n",
                        "  - name: default\n    tier: edge\n    cascade: {min_mean_logprob: -0.5, first_tokens: 6}\n")
    policy = parse_policy(text)
    cascade = PolicyEngine(policy).decide(_features()).cascade
    assert (cascade.escalate_to, cascade.min_mean_logprob, cascade.first_tokens) == ("cloud", -0.5, 6)


def _features():
    return Features(prompt_tokens=5, priority=Priority.NORMAL, complexity=0.1, requested_model="auto", tenant="t")
