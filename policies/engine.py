"""Evaluating a policy: Features → Decision, the first matching rule wins.

Rules are compiled once per policy version: each condition becomes a small predicate (keyword lists become
one precompiled regex), and each rule's Decision is built ahead of time, so `decide` only runs predicates
and returns a shared immutable object. `explain` runs the same predicates and says, for every rule, which
conditions held and with what observed values.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from tiergate.core import tracing
from tiergate.core.types import CacheRule, Cascade, Decision, Features, Reject, Timeouts
from tiergate.policies.conditions import HeaderCondition, When
from tiergate.policies.model import Policy
from tiergate.policies.overrides import CacheOverride, TimeoutsOverride
from tiergate.policies.rules import Rule

__all__ = ["Check", "Explanation", "PolicyEngine", "RuleTrace"]

Predicate = Callable[[Features], bool]
Observe = Callable[[Features], str]


@dataclass(frozen=True, slots=True)
class Check:
    """One condition of a rule as evaluated for one request."""

    condition: str  # as the operator wrote it, e.g. "complexity >= 0.6"
    held: bool
    observed: str  # what the request had, e.g. "complexity = 0.71"


@dataclass(frozen=True, slots=True)
class RuleTrace:
    rule: str
    outcome: Literal["matched", "no match", "not reached"]
    checks: tuple[Check, ...]

    @property
    def matched(self) -> bool:
        return self.outcome == "matched"


@dataclass(frozen=True, slots=True)
class Explanation:
    features: Features
    tried: tuple[RuleTrace, ...]
    decision: Decision

    def to_dict(self) -> dict[str, Any]:
        f = self.features
        d = self.decision
        return {
            "features": {"prompt_tokens": f.prompt_tokens, "complexity": round(f.complexity, 4),
                         "priority": f.priority.name.lower(), "model": f.requested_model, "tenant": f.tenant,
                         "stream": f.stream, "max_tokens": f.max_tokens, "temperature": f.temperature,
                         "edge_success": None if f.edge_success is None else round(f.edge_success, 4)},
            "rules": [{"rule": t.rule, "outcome": t.outcome,
                       "checks": [{"condition": c.condition, "held": c.held, "observed": c.observed}
                                  for c in t.checks]} for t in self.tried],
            "decision": decision_dict(d),
        }


def decision_dict(d: Decision) -> dict[str, Any]:
    """A Decision as plain JSON-able data (for CLIs and logs)."""
    out: dict[str, Any] = {"rule": d.rule, "tier": d.tier, "fallbacks": list(d.fallbacks)}
    if d.reject is not None:
        out["reject"] = {"status": d.reject.status, "message": d.reject.message, "code": d.reject.code,
                         "retry_after_s": d.reject.retry_after_s}
    out["cache"] = {f.name: getattr(d.cache, f.name) for f in fields(d.cache)}
    out["max_tokens_cap"] = d.max_tokens_cap
    out["timeouts"] = {f.name: getattr(d.timeouts, f.name) for f in fields(d.timeouts)}
    if d.cascade is not None:
        out["cascade"] = {f.name: getattr(d.cascade, f.name) for f in fields(d.cascade)}
    return out


# ----------------------------------------------------------------------------------------- compiling


def _merge(base: Any, override: CacheOverride | TimeoutsOverride | None) -> Any:
    if override is None:
        return base
    vals = {k: v for k, v in override.model_dump().items() if v is not None}
    return type(base)(**{**{f.name: getattr(base, f.name) for f in fields(base)}, **vals})


def _keyword_regex(words: list[str]) -> re.Pattern[str]:
    """Whole words or phrases, case-insensitive: 'sql' matches 'SQL query' but not 'PostgreSQL'."""
    parts = []
    for w in sorted(set(words), key=len, reverse=True):
        head = r"(?<!\w)" if re.match(r"\w", w) else ""
        tail = r"(?!\w)" if re.search(r"\w$", w) else ""
        parts.append(head + re.escape(w) + tail)
    return re.compile("|".join(parts), re.IGNORECASE)


def _bounds(name: str, lo: Any, hi: Any) -> str:
    if lo is not None and hi is not None:
        return f"{lo} <= {name} <= {hi}"
    return f"{name} >= {lo}" if lo is not None else f"{name} <= {hi}"


@dataclass(slots=True)
class _Compiled:
    rule: str
    conditions: list[tuple[str, Predicate, Observe]] = field(default_factory=list)
    decision: Decision | None = None


def _conditions(w: When) -> list[tuple[str, Predicate, Observe]]:
    out: list[tuple[str, Predicate, Observe]] = []
    if w.prompt_tokens is not None:
        lo, hi = w.prompt_tokens.min, w.prompt_tokens.max
        out.append((_bounds("prompt_tokens", lo, hi),
                    lambda f: (lo is None or f.prompt_tokens >= lo) and (hi is None or f.prompt_tokens <= hi),
                    lambda f: f"prompt_tokens = {f.prompt_tokens}"))
    if w.complexity is not None:
        clo, chi = w.complexity.min, w.complexity.max
        out.append((_bounds("complexity", clo, chi),
                    lambda f: (clo is None or f.complexity >= clo) and (chi is None or f.complexity <= chi),
                    lambda f: f"complexity = {f.complexity:.3f}"))
    if w.edge_success is not None:
        elo, ehi = w.edge_success.min, w.edge_success.max
        out.append((_bounds("edge_success", elo, ehi),
                    lambda f: f.edge_success is not None and (elo is None or f.edge_success >= elo)
                    and (ehi is None or f.edge_success <= ehi),
                    lambda f: "edge_success = " + ("none (no router model)" if f.edge_success is None
                                                   else f"{f.edge_success:.3f}")))
    if w.priority is not None:
        allowed = w.priority.allowed()
        label = "priority in [" + ", ".join(p.name.lower() for p in sorted(allowed)) + "]"
        out.append((label, lambda f: f.priority in allowed, lambda f: f"priority = {f.priority.name.lower()}"))
    if w.model is not None:
        models = frozenset(w.model.in_)
        out.append((f"model in {sorted(models)}", lambda f: f.requested_model in models,
                    lambda f: f"model = {f.requested_model!r}"))
    if w.tenant is not None:
        tenants = frozenset(w.tenant.in_)
        out.append((f"tenant in {sorted(tenants)}", lambda f: f.tenant in tenants,
                    lambda f: f"tenant = {f.tenant!r}"))
    for name, cond in (w.headers or {}).items():
        out.append(_header_condition(name, cond))
    if w.keywords is not None:
        if w.keywords.any:
            out.append((f"any keyword of {w.keywords.any}", *_keyword_checks(_keyword_regex(w.keywords.any))))
        for word in w.keywords.all or ():
            out.append((f"keyword {word!r}", *_keyword_checks(_keyword_regex([word]))))
    if w.stream is not None:
        stream = w.stream
        out.append((f"stream is {str(stream).lower()}", lambda f: f.stream is stream,
                    lambda f: f"stream = {str(f.stream).lower()}"))
    return out


def _header_condition(name: str, cond: HeaderCondition) -> tuple[str, Predicate, Observe]:
    def observe(f: Features) -> str:
        return f"{name}: {f.headers.get(name)!r}"

    if cond.present is not None:
        want = cond.present
        return (f"header {name} {'present' if want else 'absent'}", lambda f: (name in f.headers) == want, observe)
    values = cond.values() or frozenset()
    label = f"header {name} == {cond.equals!r}" if cond.equals is not None else f"header {name} in {sorted(values)}"
    return label, lambda f: (f.headers.get(name) or "").strip() in values and name in f.headers, observe


def _keyword_checks(rx: re.Pattern[str]) -> tuple[Predicate, Observe]:
    return (lambda f: rx.search(f.text) is not None), (lambda f: _found(rx, f.text))


def _found(rx: re.Pattern[str], text: str) -> str:
    m = rx.search(text)
    return f"found {m.group(0)!r}" if m else "not found"


class PolicyEngine:
    """Decides for one validated policy; build a new engine per policy version (the store does)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        base_cache = _merge(CacheRule(), policy.defaults.cache)
        base_timeouts = _merge(Timeouts(), policy.defaults.timeouts)
        self._rules: list[_Compiled] = []
        for rule in policy.effective_rules():
            c = _Compiled(rule.name, _conditions(rule.when))
            c.decision = self._decision(rule, base_cache, base_timeouts)
            self._rules.append(c)
        if not self._rules or self._rules[-1].conditions:
            raise ValueError("policy has no final catch-all rule; load it with policies.loader.load_policy")
        self._fast = [(tuple(p for _, p, _ in c.conditions), c.decision) for c in self._rules]

    def _decision(self, rule: Rule, base_cache: CacheRule, base_timeouts: Timeouts) -> Decision:
        p = self.policy
        cache = _merge(base_cache, rule.cache)
        cap = rule.max_tokens if rule.max_tokens is not None else p.defaults.max_tokens
        if rule.reject is not None:
            return Decision(rule=rule.name, tier=None, cache=cache, max_tokens_cap=cap,
                            timeouts=_merge(base_timeouts, rule.timeouts),
                            reject=Reject(rule.reject.status, rule.reject.message, rule.reject.code,
                                          rule.reject.retry_after_s))
        assert rule.tier is not None
        tier = p.tiers[rule.tier]
        timeouts = _merge(base_timeouts, tier.timeouts)
        if tier.queue.max_wait_s is not None:
            timeouts = _merge(timeouts, TimeoutsOverride(queue_s=tier.queue.max_wait_s))
        timeouts = _merge(timeouts, rule.timeouts)
        cascade = None
        if rule.cascade is not None:
            c, target = rule.cascade, p.cascade_target(rule)
            assert target is not None  # policies.checks refuses a cascade with nowhere to escalate
            cascade = Cascade(target, c.min_mean_logprob, c.min_token_logprob, c.min_margin, c.first_tokens,
                              c.escalate_on_length, c.escalate_on_empty, c.budget_s)
        return Decision(rule=rule.name, tier=rule.tier, fallbacks=p.fallback_chain(rule), cache=cache,
                        max_tokens_cap=cap, timeouts=timeouts, cascade=cascade)

    @property
    def rule_names(self) -> list[str]:
        return [c.rule for c in self._rules]

    def decision_of(self, rule: str) -> Decision | None:
        """The decision a rule makes (a cascade's thresholds, e.g. to judge an edge answer the same way)."""
        return next((c.decision for c in self._rules if c.rule == rule), None)

    def decide(self, features: Features) -> Decision:
        """The decision of the first rule whose conditions all hold (the last rule always holds)."""
        with tracing.span("policy") as span:
            decision = self._decide(features)
            if span is not tracing.NULL:
                span.set_attributes({"tiergate.rule": decision.rule, "tiergate.tier": decision.tier or "reject"})
            return decision

    def _decide(self, features: Features) -> Decision:
        for preds, decision in self._fast:
            for pred in preds:
                if not pred(features):
                    break
            else:
                return decision  # type: ignore[return-value]
        return self._fast[-1][1]  # type: ignore[return-value]  # unreachable: the last rule has no conditions

    def explain(self, features: Features) -> Explanation:
        """Every rule with each condition's outcome; rules after the deciding one are 'not reached'."""
        tried: list[RuleTrace] = []
        decision: Decision | None = None
        for c in self._rules:
            checks = tuple(Check(label, pred(features), observe(features)) for label, pred, observe in c.conditions)
            if decision is not None:
                tried.append(RuleTrace(c.rule, "not reached", checks))
                continue
            if all(ch.held for ch in checks):
                decision = c.decision
                tried.append(RuleTrace(c.rule, "matched", checks))
            else:
                tried.append(RuleTrace(c.rule, "no match", checks))
        assert decision is not None
        return Explanation(features, tuple(tried), decision)
