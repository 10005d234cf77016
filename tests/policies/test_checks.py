"""policies/checks: what is wrong with a structurally valid policy as a whole, each problem with the path of the
field at fault (which the loader turns into a file:line), and warnings apart from errors.

The checks run here on a `Policy` built from YAML directly, so each promise is seen without the loader's
positioning; tests/policies/test_loader.py checks the same problems end to end at their YAML lines.
"""

from __future__ import annotations

from pathlib import Path

from ruamel.yaml import YAML

from tiergate.policies.checks import Issue, hook_problem, semantic_issues
from tiergate.policies.model import Policy

from .conftest import BASE


def _policy(text: str, base_dir: Path | None = None) -> Policy:
    policy = Policy.model_validate(YAML(typ="safe").load(text))
    return policy.bind("policy.yaml", base_dir or Path.cwd())


def _found(text: str, base_dir: Path | None = None, check_files: bool = True) -> list[tuple[str, str, str]]:
    """(dotted path, severity, message) of every issue, in the order they come."""
    issues = semantic_issues(_policy(text, base_dir), check_files=check_files)
    assert all(isinstance(i, Issue) for i in issues)
    return [(".".join(map(str, i.path)), i.severity, i.message) for i in issues]


TWO_TIERS = """\
version: 1
tiers:
  edge: {kind: edge, model: m-edge}
  cloud: {kind: cloud, model: m-cloud, endpoints: ["http://127.0.0.1:1"]}
rules:
"""


def test_a_sound_policy_has_no_issues() -> None:
    assert _found(BASE) == []


def test_every_problem_comes_back_at_once_each_at_its_field() -> None:
    text = TWO_TIERS.replace("m-edge}", "m-edge, fallbacks: [edge, clod]}") + """\
  - {name: a, tier: cloud, fallbacks: [edge, edge]}
  - {name: a, tier: nowhere}
"""
    paths = [(p, sev) for p, sev, _ in _found(text)]
    assert paths == [
        ("rules.1.tier", "error"),  # unknown tier
        ("tiers.edge.fallbacks.1", "error"),  # unknown tier
        ("tiers.edge.fallbacks.0", "error"),  # falls back to itself
        ("rules.0.fallbacks.1", "error"),  # loop within the rule
        ("rules.1.name", "error"),  # duplicate name
        ("rules.1", "error"),  # unreachable: rule 0 matches every request
    ]


def test_a_cascade_needs_logprobs_from_its_tier_and_somewhere_to_escalate() -> None:
    no_logprobs = TWO_TIERS.replace("m-edge}", "m-edge, logprobs: false}") + \
        "  - {name: c, tier: edge, fallbacks: [cloud], cascade: {min_margin: 1}}\n"
    assert _found(no_logprobs) == [("rules.0.cascade", "error", "tier 'edge' reports no token log-probabilities "
                                    "(logprobs: false), which a cascade judges by")]
    nowhere = TWO_TIERS + "  - {name: c, tier: edge, cascade: {min_margin: 1}}\n"
    assert _found(nowhere) == [("rules.0.cascade", "error",
                                "a cascade needs escalate_to or a fallback tier to escalate to")]
    via_tier = TWO_TIERS.replace("m-edge}", "m-edge, fallbacks: [cloud]}") + \
        "  - {name: c, tier: edge, cascade: {min_margin: 1}}\n"
    assert _found(via_tier) == []  # the tier's own fallback is a target


def test_discovery_is_for_cloud_tiers_and_a_cloud_tier_needs_servers() -> None:
    text = """\
version: 1
tiers:
  edge: {kind: edge, model: m-edge, discovery: {dns: edge.local, port: 8080}}
  cloud: {kind: cloud, model: m-cloud}
rules:
  - {name: all, tier: edge}
"""
    assert [(p, sev) for p, sev, _ in _found(text)] == [("tiers.edge.discovery", "error"), ("tiers.cloud", "error")]


def test_a_tier_listed_twice_in_fallbacks_is_an_error() -> None:
    text = TWO_TIERS.replace("m-edge}", "m-edge, fallbacks: [cloud, cloud]}") + "  - {name: all, tier: edge}\n"
    assert _found(text) == [("tiers.edge.fallbacks", "error", "a tier is listed twice in fallbacks")]


def test_default_is_reserved_for_the_rule_default_tier_stands_for() -> None:
    text = TWO_TIERS.replace("rules:\n", "default_tier: edge\nrules:\n") + \
        "  - {name: default, tier: cloud, when: {tenant: acme}}\n"
    assert [(p, sev) for p, sev, _ in _found(text)] == [("rules.0.name", "error")]
    as_catch_all = TWO_TIERS + "  - {name: default, tier: cloud}\n"
    assert _found(as_catch_all) == []  # without default_tier, a rule may be called default


def test_what_is_odd_but_workable_is_a_warning() -> None:
    text = TWO_TIERS.replace("m-cloud,", "m-edge,").replace("rules:\n", "default_tier: cloud\nrules:\n") + """\
  - {name: pinned, tier: cloud, when: {model: [gpt-4]}}
  - {name: all, tier: edge}
"""
    found = _found(text)
    assert {sev for _, sev, _ in found} == {"warning"}
    assert [p for p, _, _ in found] == ["default_tier", "rules.0.when.model.in.0", "tiers.edge.model"]
    assert "never used" in found[0][2] and "'gpt-4' is not a tier's model" in found[1][2]
    assert "used by more than one tier" in found[2][2]


def test_distill_names_rules_that_exist_and_a_hook_that_loads() -> None:
    base = TWO_TIERS.replace("rules:\n", "default_tier: edge\nrules:\n") + "  - {name: chat, tier: cloud, " \
        "when: {tenant: acme}}\ndistill: {tenants: [acme], rules: [chat, default, caht], redact: {hook: HOOK}}\n"
    found = _found(base.replace("HOOK", "textwrap:dedent"))
    assert found == [("distill.rules.2", "error", "unknown rule 'caht'; rules: chat, default")]
    missing = _found(base.replace("HOOK", "no_such_module_xyz:clean"))[1]
    assert missing[0] == "distill.redact.hook" and "cannot be loaded" in missing[2]
    assert len(_found(base.replace("HOOK", "no_such_module_xyz:clean"), check_files=False)) == 1  # not imported


def test_hook_problem_says_why_a_hook_cannot_serve() -> None:
    assert hook_problem("textwrap:dedent") is None
    assert "'textwrap:nope' cannot be loaded" in (hook_problem("textwrap:nope") or "")
    assert hook_problem("string:digits") == "redaction hook 'string:digits' is not callable"


def test_files_the_policy_names_must_exist_and_load(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("{half a tokenizer")
    (tmp_path / "model.json").write_text("not a model")
    text = TWO_TIERS.replace("m-edge}", "m-edge, tokenizer: ./missing.json}") \
        .replace("m-cloud,", "m-cloud, tokenizer: broken.json,") \
        .replace("rules:\n", "complexity_model: model.json\nrules:\n") + "  - {name: all, tier: edge}\n"
    found = _found(text, tmp_path)
    assert [(p, sev) for p, sev, _ in found] == [("tiers.edge.tokenizer", "error"), ("tiers.cloud.tokenizer", "error"),
                                                 ("complexity_model", "error")]
    assert "does not exist" in found[0][2] and "does not load" in found[1][2] and "does not load" in found[2][2]
    assert _found(text, tmp_path, check_files=False) == []
    gone = text.replace("complexity_model: model.json", "complexity_model: gone.json")
    assert "tiergate classifier train" in _found(gone, tmp_path)[-1][2]


def test_a_tokenizer_the_gateway_can_stand_in_for_is_only_a_warning(tmp_path: Path) -> None:
    """An uncached Hugging Face name: prompts are counted with the built-in tokenizer until it is there."""
    text = TWO_TIERS.replace("m-edge}", "m-edge, tokenizer: someorg/not-cached-anywhere}") + \
        "  - {name: all, tier: edge}\n"
    ((path, severity, message),) = _found(text, tmp_path)
    assert (path, severity) == ("tiers.edge.tokenizer", "warning") and "builtin:default" in message
    unknown_builtin = text.replace("someorg/not-cached-anywhere", "builtin:gpt9")
    assert [sev for _, sev, _ in _found(unknown_builtin, tmp_path)] == ["error"]
