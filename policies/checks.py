"""Checks across a whole policy file: tier references, fallback loops, duplicate or unreachable rules, files.

Field-level rules live on the models (`policies.model`); these need the whole file. Each problem comes back as
the path of the offending field, so the loader can point at the exact YAML line (`policies.loader`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from tiergate.complexity.model import ComplexityModel
from tiergate.complexity.tokens import TokenizerNotFound, load_tokenizer, resolve_tokenizer
from tiergate.policies.model import AUTO_MODEL, BUILTIN_TOKENIZER, DEFAULT_RULE_NAME, Policy
from tiergate.policies.router_config import router_issues

__all__ = ["Issue", "semantic_issues"]

@dataclass(frozen=True, slots=True)
class Issue:
    """One problem in a policy: where (a path into the file) and what. Warnings do not block loading."""

    path: tuple[str | int, ...]
    message: str
    severity: Literal["error", "warning"] = "error"


def _tier_refs(policy: Policy) -> Iterator[tuple[tuple[str | int, ...], str]]:
    if policy.default_tier is not None:
        yield ("default_tier",), policy.default_tier
    for i, rule in enumerate(policy.rules):
        if rule.tier is not None:
            yield ("rules", i, "tier"), rule.tier
        for j, fb in enumerate(rule.fallbacks or ()):
            yield ("rules", i, "fallbacks", j), fb
        if rule.cascade is not None and rule.cascade.escalate_to is not None:
            yield ("rules", i, "cascade", "escalate_to"), rule.cascade.escalate_to
    for name, tier in policy.tiers.items():
        for j, fb in enumerate(tier.fallbacks):
            yield ("tiers", name, "fallbacks", j), fb


def _tier_cycles(policy: Policy) -> list[list[str]]:
    """Cycles in the tiers' default fallback graph (edge -> cloud -> edge)."""
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 = on stack, 2 = done

    def visit(name: str, stack: list[str]) -> None:
        state[name] = 1
        stack.append(name)
        for fb in policy.tiers[name].fallbacks:
            if fb not in policy.tiers or fb == name:
                continue
            if state.get(fb) == 1:
                cycles.append(stack[stack.index(fb):] + [fb])
            elif fb not in state:
                visit(fb, stack)
        stack.pop()
        state[name] = 2

    for name in policy.tiers:
        if name not in state:
            visit(name, [])
    return cycles


def _cascade_issues(policy: Policy, i: int) -> list[Issue]:
    """A cascade needs log-probabilities from its first tier and another tier to escalate to."""
    rule = policy.rules[i]
    if rule.cascade is None or rule.tier not in policy.tiers:
        return []
    out = []
    if not policy.tiers[rule.tier].logprobs:
        out.append(Issue(("rules", i, "cascade"), f"tier {rule.tier!r} reports no token log-probabilities "
                                                  "(logprobs: false), which a cascade judges by"))
    target = policy.cascade_target(rule)
    if target is None:
        out.append(Issue(("rules", i, "cascade"), "a cascade needs escalate_to or a fallback tier to escalate to"))
    elif target == rule.tier:
        out.append(Issue(("rules", i, "cascade", "escalate_to"), f"a cascade cannot escalate to its own tier "
                                                                 f"{target!r}"))
    return out


def _cost_issues(policy: Policy) -> list[Issue]:
    """Prices for tiers that exist, a reference tier that exists; a tier without prices is a warning (it costs 0)."""
    costs = policy.costs
    if costs is None:
        return []
    allowed = ", ".join(sorted(policy.tiers))
    out = []
    if costs.reference_tier not in policy.tiers:
        out.append(Issue(("costs", "reference_tier"), f"unknown tier {costs.reference_tier!r}; tiers defined: {allowed}"))
    for name, price in costs.prices.items():
        if name not in policy.tiers:
            out.append(Issue(("costs", "prices", name), f"unknown tier {name!r}; tiers defined: {allowed}"))
        elif price.node is not None and price.node.throughput == "live" and policy.tiers[name].kind != "edge":
            out.append(Issue(("costs", "prices", name, "node", "throughput"),
                             f"throughput: live reads edge nodes' heartbeats; {name!r} is a "
                             f"{policy.tiers[name].kind} tier (use benchmark)"))
    for name in policy.tiers:
        if name not in costs.prices:
            out.append(Issue(("costs", "prices"), f"tier {name!r} has no prices: its tokens count as costing 0 "
                                                  f"{costs.currency}", "warning"))
    return out


def _budget_issues(policy: Policy) -> list[Issue]:
    """Budgets are in money, so they need `costs`; a downgrade goes to a tier that exists."""
    budgets = policy.budgets
    if budgets is None:
        return []
    out = []
    if budgets.tenants and policy.costs is None:
        out.append(Issue(("budgets",), "budgets are in money: they need a `costs` section to price requests"))
    for name, budget in budgets.tenants.items():
        if budget.downgrade_to is not None and budget.downgrade_to not in policy.tiers:
            out.append(Issue(("budgets", "tenants", name, "downgrade_to"),
                             f"unknown tier {budget.downgrade_to!r}; tiers defined: {', '.join(sorted(policy.tiers))}"))
    return out


def hook_problem(spec: str) -> str | None:
    """Why `module:function` cannot serve as a redaction hook, or None."""
    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        return f"redaction hook {spec!r} cannot be loaded: {exc}"
    return None if callable(fn) else f"redaction hook {spec!r} is not callable"


def semantic_issues(policy: Policy, check_files: bool = True) -> list[Issue]:
    """Everything wrong with a structurally valid policy, in file order, each with its path."""
    issues: list[Issue] = []
    known = sorted(policy.tiers)
    allowed = ", ".join(known)

    for path, ref in _tier_refs(policy):
        if ref not in policy.tiers:
            issues.append(Issue(path, f"unknown tier {ref!r}; tiers defined: {allowed}"))

    served_by = {tier.model: name for name, tier in policy.tiers.items()}
    for pattern, target in policy.model_aliases.items():
        if pattern == AUTO_MODEL or not pattern.strip() or len(pattern) > 256:
            issues.append(Issue(("model_aliases", pattern), "an alias is a model name or glob of 1 to 256 characters, "
                                                            "never `auto` (it always means: let the policy choose)"))
        if target != AUTO_MODEL and target not in policy.tiers:
            issues.append(Issue(("model_aliases", pattern), f"alias target {target!r} is neither `auto` nor a tier; "
                                                            f"tiers defined: {allowed}"))
        if pattern in served_by:
            issues.append(Issue(("model_aliases", pattern), f"{pattern!r} is tier {served_by[pattern]!r}'s own model "
                                                            f"name; an alias for it would never apply"))

    for name, tier in policy.tiers.items():
        if tier.kind == "cloud" and not tier.endpoints and tier.discovery is None:
            issues.append(Issue(("tiers", name), "a cloud tier needs endpoints or discovery"))
        if tier.kind == "edge" and tier.discovery is not None:
            issues.append(Issue(("tiers", name, "discovery"),
                                "discovery is for cloud tiers; edge nodes register with the gateway themselves"))
        if tier.routing is not None and (tier.kind == "edge" or tier.stand_in):
            issues.append(Issue(("tiers", name, "routing"),
                                "routing is for cloud tiers of vLLM servers; edge nodes and a stand-in are picked "
                                "by load"))
        for j, fb in enumerate(tier.fallbacks):
            if fb == name:
                issues.append(Issue(("tiers", name, "fallbacks", j), f"tier {name!r} falls back to itself"))
        if len(set(tier.fallbacks)) != len(tier.fallbacks):
            issues.append(Issue(("tiers", name, "fallbacks"), "a tier is listed twice in fallbacks"))
    for cycle in _tier_cycles(policy):
        issues.append(Issue(("tiers", cycle[0], "fallbacks"), "fallback loop: " + " -> ".join(cycle)))

    seen_names: dict[str, int] = {}
    catch_all_at: int | None = None
    for i, rule in enumerate(policy.rules):
        if rule.name in seen_names:
            issues.append(Issue(("rules", i, "name"),
                                f"duplicate rule name {rule.name!r} (also rule #{seen_names[rule.name] + 1})"))
        else:
            seen_names[rule.name] = i
        if rule.name == DEFAULT_RULE_NAME and policy.default_tier is not None and \
                not policy.rules[-1].when.is_catch_all():
            issues.append(Issue(("rules", i, "name"),
                                f"rule name {DEFAULT_RULE_NAME!r} is reserved for default_tier; rename the rule"))
        if rule.tier is not None and rule.fallbacks:
            chain = [rule.tier, *rule.fallbacks]
            for j, fb in enumerate(rule.fallbacks):
                if fb == rule.tier:
                    issues.append(Issue(("rules", i, "fallbacks", j), f"rule falls back to its own tier {fb!r}"))
                elif fb in chain[: j + 1]:
                    issues.append(Issue(("rules", i, "fallbacks", j),
                                        "fallback loop: " + " -> ".join(chain[: j + 2])))
        issues.extend(_cascade_issues(policy, i))
        if catch_all_at is not None:
            issues.append(Issue(("rules", i),
                                f"rule {rule.name!r} is unreachable: rule {policy.rules[catch_all_at].name!r} "
                                "before it matches every request"))
            continue
        for k in range(i):
            earlier = policy.rules[k]
            if earlier.when.covers(rule.when):
                issues.append(Issue(("rules", i, "when"),
                                    f"rule {rule.name!r} is unreachable: every request it matches is already "
                                    f"matched by the earlier rule {earlier.name!r}"))
                break
        if rule.when.is_catch_all():
            catch_all_at = i

    if policy.distill is not None:
        names = {r.name for r in policy.effective_rules()}
        for j, name in enumerate(policy.distill.rules):
            if name not in names:
                issues.append(Issue(("distill", "rules", j), f"unknown rule {name!r}; rules: {', '.join(sorted(names))}"))
        if check_files and policy.distill.redact.hook:
            problem = hook_problem(policy.distill.redact.hook)
            if problem:
                issues.append(Issue(("distill", "redact", "hook"), problem))

    issues.extend(_cost_issues(policy))
    issues.extend(_budget_issues(policy))
    artifact = str(policy.resolve_path(policy.router.model)) if check_files and policy.router is not None else None
    issues.extend(Issue(path, message, "error" if is_error else "warning") for path, message, is_error in router_issues(
        policy.router, {n: t.kind for n, t in policy.tiers.items()},
        {r.name: r.tier for r in policy.rules if r.cascade is not None and r.tier is not None},
        [i for i, r in enumerate(policy.rules) if r.when.edge_success is not None], artifact))

    if catch_all_at is None and policy.default_tier is None:
        issues.append(Issue(("rules",), "no rule matches every request: end the rules with a catch-all rule "
                                        "(no `when`) or set default_tier"))
    if catch_all_at is not None and policy.default_tier is not None:
        issues.append(Issue(("default_tier",), f"default_tier is never used: rule "
                                               f"{policy.rules[catch_all_at].name!r} matches every request",
                            "warning"))

    public = {t.model for t in policy.tiers.values()} | {"auto"}
    for i, rule in enumerate(policy.rules):
        if rule.when.model is not None:
            for j, m in enumerate(rule.when.model.in_):
                if m not in public:
                    issues.append(Issue(("rules", i, "when", "model", "in", j),
                                        f"model {m!r} is not a tier's model or 'auto'; requests naming it are "
                                        f"rejected before routing (known: {', '.join(sorted(public))})", "warning"))

    if check_files:
        issues.extend(_file_issues(policy))
    models = [t.model for t in policy.tiers.values()]
    for name, tier in policy.tiers.items():
        if models.count(tier.model) > 1:
            issues.append(Issue(("tiers", name, "model"),
                                f"model name {tier.model!r} is used by more than one tier", "warning"))
            break
    return issues


def _file_issues(policy: Policy) -> list[Issue]:
    """Files the policy names must exist. A missing tokenizer that the gateway can replace by its built-in
    one (builtin:demo before `tiergate prepare`, an HF name not cached here) is a warning, not an error."""
    issues = []
    specs: list[tuple[tuple[str | int, ...], str]] = []
    if policy.defaults.tokenizer:
        specs.append((("defaults", "tokenizer"), policy.defaults.tokenizer))
    for name, tier in policy.tiers.items():
        if tier.tokenizer:
            specs.append((("tiers", name, "tokenizer"), tier.tokenizer))
    for path, spec in specs:
        try:
            found = resolve_tokenizer(spec, policy.base_dir)
            try:  # a file that exists but does not load (half-copied) must not reach the request path
                load_tokenizer(found)
            except Exception as exc:
                issues.append(Issue(path, f"tokenizer file {str(found)!r} does not load: {exc}"))
        except TokenizerNotFound as exc:
            if spec.startswith("builtin:") and spec not in ("builtin:demo",):
                issues.append(Issue(path, str(exc)))
            elif spec == "builtin:demo" or not _looks_like_path(spec):
                issues.append(Issue(path, f"{exc}; prompt tokens will be counted with {BUILTIN_TOKENIZER} "
                                          "until it is available", "warning"))
            else:
                issues.append(Issue(path, f"{exc}; give a tokenizer.json path (relative to the policy file), "
                                          f"a cached Hugging Face model name, or {BUILTIN_TOKENIZER}"))
    if policy.complexity_model is not None:
        p = policy.resolve_path(policy.complexity_model)
        try:
            exists = p.is_file()
        except OSError:
            exists = False
        if not exists:
            issues.append(Issue(("complexity_model",), f"complexity model {str(p)[:200]!r} does not exist "
                                                       "(train one with `tiergate classifier train`)"))
        else:
            try:
                ComplexityModel.load(p)
            except Exception as exc:
                issues.append(Issue(("complexity_model",), f"complexity model {str(p)!r} does not load: {exc}"))
    return issues


def _looks_like_path(spec: str) -> bool:
    """HF names look like 'org/name'; paths end in .json, start with . / ~, or have more than one slash."""
    return (
        spec.endswith(".json")
        or spec.startswith((".", "/", "~"))
        or spec.count("/") != 1
    )
