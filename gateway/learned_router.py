"""The learned pre-generation router on the request path: P(the edge's answer stands) for each request, before the
policy decides, so that a rule's `edge_success` condition can send predicted failures straight to the cloud.

The model (`complexity.edge_router`) is the policy's `router.model` artifact, reloaded when the file changes (its
stat is looked at once a second at most, so a `tiergate classifier train --from-outcomes` that rewrites it is
in force within a second, without a restart) and chosen by the edge model version the edge tier serves now: a model
belongs to one edge model version, and a version without one is a cold start. Without a model, or for a policy with
no `edge_success` condition, the Features are left as they are (`edge_success` None), so the decision is exactly
what it is without a router.

It also decides exploration: of the requests an `edge_success` rule sends away from the edge, a random
`router.explore` share is also answered by the edge, unseen (`gateway.exploration`), so that the router keeps
getting labels where it already believes the edge fails. Both the requests it routed and those it explored are
counted (`tiergate_router_routed_total{explored}`); the configured share is `tiergate_router_explore_share`.

Tested in `tests/gateway/test_learned_router.py` and `tests/integration/test_learned_router.py`.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
import time
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from tiergate.complexity.edge_router import RouterArtifact, RouterModel, features_of
from tiergate.core.types import Features
from tiergate.gateway.agreement import AgreementPath, Agreements
from tiergate.gateway.context import Outcome, RequestContext
from tiergate.gateway.outcomes import OutcomeRecorder, OutcomeSource
from tiergate.gateway.tiers import Routing
from tiergate.policies.confidence import CascadeVerdict
from tiergate.policies.model import Policy
from tiergate.policies.router_config import edge_tier_of

__all__ = ["LearnedRouter", "RouterMetrics"]

log = structlog.get_logger("tiergate.router")
_STAT_EVERY_S = 1.0


class RouterMetrics:
    """The learned router's series (prefix `tiergate_router_`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        p = "tiergate_router_"
        self.predictions = Counter(p + "predictions", "Requests the router predicted for, by whether a model "
                                   "answered (false: cold start for this edge version)", ["model"], registry=registry)
        self.routed = Counter(p + "routed", "Requests an edge_success rule sent away from the edge, by rule and "
                              "whether the edge also answered them unseen (exploration)", ["rule", "explored"],
                              registry=registry)
        self.explore_share = Gauge(p + "explore_share", "The configured share of routed requests explored",
                                   registry=registry)
        self.explorations = Counter(p + "explorations", "Explorations by result: judged, skipped (none free), "
                                    "failed", ["result"], registry=registry)
        self.reloads = Counter(p + "model_reloads", "Router model (re)loads by result: ok, invalid, missing",
                               ["result"], registry=registry)


@dataclasses.dataclass(slots=True)
class _Loaded:
    signature: tuple[int, int] | None  # (mtime_ns, size) of the file read; None: no file
    artifact: RouterArtifact | None
    checked: float


@dataclasses.dataclass(frozen=True, slots=True)
class _PolicyFacts:
    """What the router needs of one policy version, worked out once."""

    predicts: bool  # some rule has an edge_success condition
    edge_tier: str | None
    routed_rules: frozenset[str]  # edge_success rules that send elsewhere than the edge tier
    model_path: Path | None = None  # the artifact, resolved once per policy version, not per request


def _facts(policy: Policy) -> _PolicyFacts:
    if policy.router is None:
        return _PolicyFacts(False, None, frozenset())
    edge = edge_tier_of(policy.router, {n: t.kind for n, t in policy.tiers.items()})
    rules = [r for r in policy.rules if r.when.edge_success is not None]
    return _PolicyFacts(bool(rules), edge, frozenset(r.name for r in rules if r.tier != edge),
                        policy.resolve_path(policy.router.model))


class LearnedRouter:
    """Annotates Features with `edge_success`; says which routed requests are explored; records outcomes."""

    def __init__(self, registry: CollectorRegistry, outcomes: OutcomeRecorder,
                 rng: random.Random | None = None, agreements: Agreements | None = None) -> None:
        self.metrics = RouterMetrics(registry)
        self.outcomes = outcomes
        self.agreements = agreements  # graded labels: the edge's answers judged against the cloud's
        self._rng = rng or random.Random()
        self._files: dict[Path, _Loaded] = {}
        self._facts: tuple[Policy | None, _PolicyFacts] = (None, _PolicyFacts(False, None, frozenset()))
        self._counted: dict[bool, Any] = {}  # predictions' children by "a model answered", each looked up once

    def facts(self, policy: Policy) -> _PolicyFacts:
        memo, facts = self._facts
        if memo is not policy:
            facts = _facts(policy)
            self._facts = (policy, facts)
            self.metrics.explore_share.set(policy.router.explore if policy.router is not None else 0.0)
        return facts

    def annotate(self, features: Features, policy: Policy, routing: Routing) -> Features:
        """`features` with the router's prediction, or as they are (no edge_success rule, or no model)."""
        facts = self.facts(policy)
        if not facts.predicts or facts.edge_tier is None:
            return features
        assert facts.model_path is not None  # a router section, so a model path
        artifact = self._artifact(facts.model_path)
        model = artifact.get(self.edge_version(routing, facts.edge_tier)) if artifact is not None else None
        counter = self._counted.get(model is not None)
        if counter is None:
            counter = self._counted[model is not None] = self.metrics.predictions.labels(
                "true" if model is not None else "false")
        counter.inc()
        if model is None:
            return features
        return dataclasses.replace(features, edge_success=model.predict(features_of(features)))

    def explore(self, policy: Policy, rule: str) -> bool:
        """Whether a request `rule` decided goes to the edge too, unseen (counted as routed either way)."""
        facts = self.facts(policy)
        if rule not in facts.routed_rules or policy.router is None:
            return False
        explored = self._rng.random() < policy.router.explore
        self.metrics.routed.labels(rule, "true" if explored else "false").inc()
        return explored

    def judged(self, ctx: RequestContext, outcome: Outcome, verdict: CascadeVerdict, edge_version: str,
               draft: str | None) -> None:
        """A cascade judged its first tier's answer `draft`: one outcome (`gateway.cascade.Judged`); escalated, the
        draft waits on `outcome` for the target's answer, kept, it may be verified (`gateway.agreement`)."""
        self.outcomes.record(policy=ctx.policy, features=ctx.features, tenant=ctx.tenant.id, rule=ctx.decision.rule,
                             edge_version=edge_version, stood=verdict.keep, reason=verdict.reason,
                             source=OutcomeSource.CASCADE)
        if self.agreements is None:
            return
        if verdict.keep:
            self.agreements.maybe_verify(ctx, draft, edge_version)
        elif (pair := self.agreements.pair(ctx, AgreementPath.ESCALATION, ctx.decision.tier or "")) is not None:
            pair.edge(draft, edge_version)
            outcome.pair = pair

    @staticmethod
    def edge_version(routing: Routing, edge_tier: str) -> str:
        """The edge model version the tier serves now: what most of its backends serve (during a rolling
        promotion, the majority), else the tier's configured model."""
        tier = routing.tiers.get(edge_tier)
        if tier is None:
            return ""
        models = [ep.model for ep in tier.pool.endpoints()]
        if models and models.count(models[0]) == len(models):  # the usual case: one version everywhere
            return models[0]
        served = collections.Counter(models)
        if served:
            return max(sorted(served), key=lambda m: served[m])
        return tier.config.served_model or tier.config.model

    def model_for(self, policy: Policy, edge_version: str) -> RouterModel | None:
        cfg = policy.router
        if cfg is None:
            return None
        artifact = self._artifact(policy.resolve_path(cfg.model))
        return artifact.get(edge_version) if artifact is not None else None

    def _artifact(self, path: Path) -> RouterArtifact | None:
        now = time.monotonic()
        loaded = self._files.get(path)
        if loaded is not None and now - loaded.checked < _STAT_EVERY_S:
            return loaded.artifact
        try:
            st = os.stat(path)
            signature: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            signature = None
        if loaded is not None and loaded.signature == signature:
            loaded.checked = now
            return loaded.artifact
        artifact = loaded.artifact if loaded is not None else None
        if signature is None:
            artifact = None
            self.metrics.reloads.labels("missing").inc()
        else:
            try:
                artifact = RouterArtifact.load(path)
                self.metrics.reloads.labels("ok").inc()
                log.info("router_model_loaded", path=str(path), versions=sorted(artifact.models))
            except (ValueError, OSError) as exc:  # keep the last good one, as a bad policy file is kept out
                self.metrics.reloads.labels("invalid").inc()
                log.warning("router_model_invalid", path=str(path), error=str(exc))
        if len(self._files) > 16:  # paths come from policies: a few at most, but never without bound
            self._files.clear()
        self._files[path] = _Loaded(signature, artifact, now)
        return artifact
