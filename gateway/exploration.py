"""Exploration: a request the learned router sent to the cloud is sometimes also answered by the edge, unseen.

Without it, a router that believes the edge fails on some kind of request never sees the edge try one again, and
its labels collapse to its own belief. So a random share (`router.explore`) of the requests an `edge_success` rule
sends away from the edge is also sent to the edge tier as JSON, judged by the thresholds of the policy's judge
cascade (`router.judge_rule`, else the first cascade rule on the edge tier) as a cascade would judge it, and the
verdict is recorded as an outcome (source `explore`), and its answer is judged against the one the client got
(source `agreement`, `gateway.agreement`). The client gets the cloud's answer only, never waits for the
edge's, and is not charged for it: like a cache shadow check (`gateway.shadow`), it is the operator's cost, runs
detached, holds the routing version it was decided under, and is skipped (counted) when `explore_concurrency` are
already running or the gateway is draining.

Tested in `tests/gateway/test_learned_router.py` and `tests/integration/test_learned_router.py`.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from tiergate.core.types import Decision
from tiergate.core.wire import ChatRequest
from tiergate.gateway.agreement import AgreementPath, AnswerPair
from tiergate.gateway.cascade import judge_unseen
from tiergate.gateway.context import Outcome, RequestContext
from tiergate.gateway.detached import DetachedRequests
from tiergate.gateway.dispatch import Dispatcher
from tiergate.gateway.learned_router import LearnedRouter
from tiergate.gateway.outcomes import OutcomeSource
from tiergate.gateway.tiers import Routing, RoutingHold
from tiergate.policies.model import Policy

__all__ = ["Explorations", "judge_decision"]

log = structlog.get_logger("tiergate.router")


def judge_decision(policy: Policy, decide: Callable[[str], Decision | None], edge_tier: str | None) -> Decision | None:
    """The cascade decision that judges explored edge answers: the router's `judge_rule`, else the first cascade
    rule on the edge tier."""
    cfg = policy.router
    if cfg is None:
        return None
    name = cfg.judge_rule or next((r.name for r in policy.rules if r.cascade is not None and r.tier == edge_tier),
                                  None)
    decision = decide(name) if name is not None else None
    return decision if decision is not None and decision.cascade is not None else None


class Explorations:
    """The gateway's running explorations: started as a routed request is dispatched, stopped with the gateway."""

    def __init__(self, *, dispatcher: Dispatcher, router: LearnedRouter, draining: Callable[[], bool],
                 hold: Callable[[Routing], RoutingHold | None]) -> None:
        self._dispatcher = dispatcher
        self._router = router
        self._explorations = DetachedRequests("explore", draining=draining, hold=hold)

    @property
    def running(self) -> int:
        return self._explorations.running

    def maybe_start(self, ctx: RequestContext, outcome: Outcome | None = None) -> None:
        """Explore `ctx` if its rule is a routed one and the draw says so (returns at once); the edge's answer is
        also judged against the one the client gets (on `outcome`: `gateway.agreement`)."""
        policy = ctx.policy
        if not self._router.explore(policy, ctx.decision.rule):
            return
        metrics = self._router.metrics
        cfg = policy.router
        assert cfg is not None
        decision = judge_decision(policy, ctx.routing.active.engine.decision_of,
                                  self._router.facts(policy).edge_tier)
        tools = isinstance(ctx.req, ChatRequest) and bool(ctx.req.tools)  # a tool call is not judged (no logprobs)
        if decision is None or tools:
            metrics.explorations.labels("skipped").inc()
            return
        agreements = self._router.agreements
        pair = (agreements.pair(ctx, AgreementPath.EXPLORATION, decision.tier or "")
                if agreements is not None and outcome is not None else None)
        if not self._explorations.start(ctx, cfg.explore_concurrency,
                                        lambda held: self._explore(ctx, decision, held, pair)):
            metrics.explorations.labels("skipped").inc()
            return
        if outcome is not None and pair is not None:
            outcome.pair = pair

    async def _explore(self, ctx: RequestContext, decision: Decision, held: RoutingHold,
                       pair: AnswerPair | None) -> None:
        try:
            judged, version, answer = await judge_unseen(self._dispatcher, ctx, held.routing.tiers, decision)
            if pair is not None:
                pair.edge(answer, version)
            self._router.metrics.explorations.labels("judged").inc()
            log.info("router_explored", request_id=ctx.request_id, rule=ctx.decision.rule, stood=judged.keep,
                     reason=judged.reason, edge_version=version)
            self._router.outcomes.record(policy=ctx.policy, features=ctx.features, tenant=ctx.tenant.id,
                                         rule=ctx.decision.rule, edge_version=version, stood=judged.keep,
                                         reason=judged.reason, source=OutcomeSource.EXPLORE)
        except Exception:  # a bug of ours: logged; the client has its answer from the cloud anyway
            self._router.metrics.explorations.labels("failed").inc()
            log.exception("router_exploration_error", request_id=ctx.request_id)
        finally:
            held.release()

    async def stop(self) -> None:
        """Cancel what is still running (shutdown): an unfinished exploration is a label not recorded."""
        await self._explorations.stop()
