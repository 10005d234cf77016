"""Everything a request owes once its answer is over, in one place: usage, the tenant's token charge, its cost,
the cache store, accounting (metrics, log line, status-page sample), the distillation offer.

Each request gets one `Settlement` when it arrives (`Settlements.open`), and whichever way it ends settles it
exactly once: a backend's answer (JSON, or a stream however it ended), a cache hit, a refusal, a client gone
before its answer, or, on its own settlement, a shadow check. The relay, the cascade and the pipeline only say
how the request ended; what that costs and what is recorded is decided here, so no path can charge twice or
forget the cache. A second settlement is a bug: it is logged and ignored (raised under `strict`, as in tests).

Cost: priced with the `costs` of the request's own policy version (`ctx.policy`, never the current one), once, on
settling: `tiergate_spend_total` (what the work cost, by tenant, tier, rule and kind) and
`tiergate_spend_reference_total` (what the same answer would have cost on the reference tier; the saving is the
difference). A JSON answer's `x-tiergate-cost` header is the same figure, quoted by the relay before the answer
goes out (`quote`) and recorded as quoted. A policy without `costs` counts no spend.

Spend and budgets (`gateway.budgets`): a request under a budget reserves its worst case at admission
(`reserve_budget`), and whichever way it settles, the same figure (the answer plus any thrown-away work; a shadow
check is the operator's, never the tenant's) corrects that reservation and goes into the day's spend record by
tenant, key, tier, rule and kind, in the same ledger write.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, ClassVar

import structlog
from starlette.responses import Response

from tiergate.cache import SemanticCache
from tiergate.cache.types import CachedAnswer, CacheHit, CacheStatus
from tiergate.core import tracing
from tiergate.core.errors import OpenAIError
from tiergate.core.types import Decision, Features
from tiergate.gateway.accounting import Accounting
from tiergate.gateway.auth import Tenant
from tiergate.gateway.budgets import Budgets, Hold, worst_case
from tiergate.gateway.context import Arrival, Finished, Outcome, RequestContext
from tiergate.gateway.distill import Distiller
from tiergate.gateway.ledger import LocalLedger
from tiergate.gateway.limits import Limiter, Reservation, TenantSlot
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.savings import record_saving
from tiergate.policies.costs import CostsConfig

__all__ = ["AlreadySettled", "CacheProvider", "Settlement", "Settlements", "SharedCache"]

log = structlog.get_logger("tiergate.gateway")
_JSON = "application/json"
CacheProvider = Callable[[], SemanticCache | None]  # the cache once start-up built it (None when disabled)


class SharedCache:
    """The process's one cache slot, a `CacheProvider`: collaborators built before start-up are handed this, not
    the gateway, and read the cache once start-up has put it here (`current`; None while disabled or not yet)."""

    __slots__ = ("current",)

    def __init__(self) -> None:
        self.current: SemanticCache | None = None

    def __call__(self) -> SemanticCache | None:
        return self.current


class AlreadySettled(RuntimeError):
    """A request settled a second time (raised only under `Settlement.strict`)."""


class Settlements:
    """What settling needs, shared by every request; `open` gives one request its `Settlement`."""

    def __init__(self, accounting: Accounting, limiter: Limiter, metrics: GatewayMetrics, cache: CacheProvider,
                 distill: Distiller, budgets: Budgets | None = None) -> None:
        self.accounting, self.limiter, self.metrics, self.cache, self.distill = (accounting, limiter, metrics, cache,
                                                                                 distill)
        self.budgets = budgets if budgets is not None else Budgets(metrics, LocalLedger())

    def open(self, arrival: Arrival) -> Settlement:
        return Settlement(self, arrival)


class Settlement:
    """One request's settlement; exactly one of its settling methods runs (`settled` names which)."""

    strict: ClassVar[bool] = False  # tests turn a second settlement into an exception

    __slots__ = ("_deps", "_extra_tokens", "_hold", "_hold_ctx", "_quote", "_reservation", "_thrown", "_thrown_ctx",
                 "arrival", "key", "settled")

    def __init__(self, deps: Settlements, arrival: Arrival) -> None:
        self._deps = deps
        self.arrival = arrival
        self._extra_tokens = 0
        self._thrown: list[tuple[str, int, int]] = []  # work that is not the answer's: (tier, prompt, completion)
        self._thrown_ctx: RequestContext | None = None  # the request it was done for (its policy prices it)
        self._quote: tuple[tuple[str, int, int, int], float] | None = None  # the answer's cost, once priced
        self._reservation: Reservation | None = None
        self._hold: Hold | None = None  # the request's budget reservation
        self._hold_ctx: RequestContext | None = None
        self.key: str | None = None  # the SHA-256 of the key the request came with: its spend is also the key's
        self.settled: str | None = None

    async def reserve(self, slot: TenantSlot, tokens: int) -> Reservation | None:
        """Reserve the request's token budget from its tenant's window (or raise its 429, and give back the request
        its admission counted: a refused request counts nothing); settling corrects the reservation to what the
        request used, whichever way it ends."""
        limiter = self._deps.limiter
        try:
            self._reservation = await limiter.reserve(slot.tenant, tokens)
        except OpenAIError:
            await limiter.refund_request(slot)
            raise
        return self._reservation

    async def reserve_budget(self, ctx: RequestContext, answer_tokens: int | None) -> RequestContext:
        """Reserve the request's worst-case cost from its budgets (`answer_tokens`: the most its answer may use; None:
        each tier's context), or raise their 429 (and give back the request its admission counted, as `reserve`
        does). Over a hard limit with `on_exceed: downgrade`, the request goes to the policy's cheaper tier: the
        context returned is then decided for that tier alone."""
        policy = ctx.policy
        budgets = policy.budgets
        tenant = budgets.tenants.get(ctx.tenant.id) if budgets is not None else None
        if tenant is None or policy.costs is None:
            return ctx
        target = tenant.downgrade_to
        down = dataclasses.replace(ctx.decision, tier=target, fallbacks=(), cascade=None) if target else None
        prompt = ctx.features.prompt_tokens
        try:
            self._hold, downgraded = await self._deps.budgets.reserve(
                policy, ctx.tenant.id, self.key, worst_case(policy, ctx.decision, prompt, answer_tokens),
                (lambda: worst_case(policy, down, prompt, answer_tokens)) if down is not None else None)
        except OpenAIError:
            if ctx.held.slot is not None:
                await self._deps.limiter.refund_request(ctx.held.slot)
            raise
        if downgraded and down is not None:
            ctx = dataclasses.replace(ctx, decision=down)
        self._hold_ctx = ctx
        return ctx

    def add_spent(self, tokens: int, *, ctx: RequestContext | None = None, tier: str | None = None,
                  prompt_tokens: int = 0) -> None:
        """Work a backend did that is not the answer's (a cascade's thrown-away first attempt): charged on settling
        whichever way the request then ends, and, given the request and the `tier` that did it (`prompt_tokens`
        of `tokens` were prompt), priced then as spend of kind `escalated`."""
        self._extra_tokens += tokens
        if ctx is not None and tier is not None:
            prompt = min(max(prompt_tokens, 0), tokens)
            self._thrown.append((tier, prompt, tokens - prompt))
            self._thrown_ctx = ctx

    def quote(self, ctx: RequestContext, tier: str, prompt_tokens: int, completion_tokens: int,
              cached_tokens: int = 0) -> float | None:
        """The request's cost, for its answer's `x-tiergate-cost` header: the answer's tokens on `tier` plus any
        thrown-away work, under the request's own policy; None when that policy has no `costs`. Settling the same
        answer records exactly this figure."""
        costs = ctx.policy.costs
        if costs is None:
            return None
        return self._answer_cost(costs, tier, prompt_tokens, completion_tokens, cached_tokens) + sum(
            costs.cost(t, p, c) for t, p, c in self._thrown)

    def _answer_cost(self, costs: CostsConfig, tier: str, prompt: int, completion: int, cached: int) -> float:
        key = (tier, prompt, completion, cached)
        if self._quote is None or self._quote[0] != key:
            self._quote = (key, costs.cost(tier, prompt, completion, cached))
        return self._quote[1]

    async def _spend(self, ctx: RequestContext | None, tier: str, prompt: int, completion: int, cached: int = 0, *,
                     kind: str = "answer", reference: bool = True) -> None:
        """Record what this request cost under its own policy (and what the same answer would have cost on the
        reference tier), plus the thrown-away work it carries, in the metrics and the ledger, and settle its budget
        reservation to it: called once, by whichever way it was settled."""
        ctx = ctx if ctx is not None else self._thrown_ctx if self._thrown_ctx is not None else self._hold_ctx
        costs = ctx.policy.costs if ctx is not None else None
        if ctx is None or costs is None:
            return
        m, tenant, rule, currency = self._deps.metrics, ctx.tenant.id, ctx.decision.rule, costs.currency
        fields: dict[str, float] = {}
        charged = 0.0
        ref = costs.reference(prompt, completion, cached) if reference else None
        if kind:
            cost = self._answer_cost(costs, tier, prompt, completion, cached)
            m.child(m.spend, tenant, tier, rule, kind, currency).inc(cost)
            record_saving(m, ctx, tier, kind, cost, ref, currency)  # the split of the saving (gateway.savings)
            fields[f"cost|{tier}|{rule}|{kind}"] = cost
            if kind != "shadow":  # the operator's check, not the tenant's spend
                charged += cost
        if ref is not None:
            m.child(m.spend_reference, tenant, tier, rule, currency).inc(ref)
            fields[f"ref|{tier}|{rule}"] = ref
            fields |= {"requests": 1, "prompt": prompt, "completion": completion}
        for t, p, c in self._thrown:
            cost = costs.cost(t, p, c)
            m.child(m.spend, tenant, t, rule, "escalated", currency).inc(cost)
            record_saving(m, ctx, t, "escalated", cost, None, currency)
            name = f"cost|{t}|{rule}|escalated"
            fields[name] = fields.get(name, 0.0) + cost
            charged += cost
        if kind != "shadow" and (kind or charged):
            fields["cost"] = charged
        await self._deps.budgets.settle(self._hold, ctx.policy, tenant, self.key if kind != "shadow" else None,
                                        charged, fields)

    def _elapsed(self) -> float:
        return time.perf_counter() - self.arrival.started

    def _once(self, path: str) -> bool:
        if self.settled is not None:
            log.error("settled_twice", request_id=self.arrival.request_id, first=self.settled, again=path)
            if Settlement.strict:
                raise AlreadySettled(f"request {self.arrival.request_id} settled as {self.settled}, then as {path}")
            return False
        self.settled = path
        return True

    async def _charge(self, tokens: int) -> None:
        """Correct the reservation to what was used (nothing was reserved: no token limit, or not admitted yet)."""
        if self._reservation is not None:
            await self._deps.limiter.settle(self._reservation, tokens + self._extra_tokens)

    async def answered(self, ctx: RequestContext, outcome: Outcome, tier: str, status: int, overhead: float,
                       prompt_tokens: int, completion_tokens: int, *, elapsed: float | None = None,
                       store: CachedAnswer | None = None, distill: tuple[str, str] | None = None,
                       cached_tokens: int = 0) -> None:
        """A backend's answer, however it ended (`status`: 200, or 499/502/503 for a stream cut short): count it,
        charge and price its tokens (`cached_tokens` of the prompt came from the backend's prefix cache), store
        `store` in the cache, offer `distill` (text, model) for distillation."""
        if not self._once("answered"):
            return
        d = self._deps
        if elapsed is None:
            elapsed = time.perf_counter() - ctx.arrival.started
        with _settle_span("answered"):
            d.accounting.record(Finished(ctx.arrival, tier, status, overhead, elapsed, ctx.tenant, ctx.decision,
                                         ctx.features, outcome.cache, prompt_tokens, completion_tokens))
            await self._charge(prompt_tokens + completion_tokens)
            await self._spend(ctx, tier, prompt_tokens, completion_tokens, cached_tokens)
            cache = d.cache()
            if store is not None and cache is not None:
                await cache.store(ctx.req, ctx.tenant.id, ctx.decision.cache, store, outcome.cache_key,
                                  route=ctx.cache_route())
            if distill is not None:
                await d.distill.offer(ctx, outcome, tier, *distill)

    async def hit(self, ctx: RequestContext, outcome: Outcome, hit: CacheHit, overhead: float) -> None:
        """A cached answer: counted (tier `cache`, nothing charged: its reservation given back; costing nothing, and
        saving what its prompt and the cached completion would have cost on the reference tier) and recorded as
        served, for feedback."""
        if not self._once("hit"):
            return
        with _settle_span("hit"):
            self._deps.accounting.record(Finished(ctx.arrival, "cache", 200, overhead, overhead, ctx.tenant,
                                                  ctx.decision, ctx.features, outcome.cache))
            await self._charge(0)
            if ctx.policy.costs is not None:  # a hold exists only under a policy with costs
                await self._spend(ctx, "cache", ctx.features.prompt_tokens, hit.answer.completion_tokens)
            cache = self._deps.cache()
            if cache is not None:
                await cache.served(ctx.request_id, ctx.tenant.id, hit)

    async def refused(self, exc: OpenAIError, *, tenant: Tenant | None, decision: Decision | None,
                      features: Features | None, cache: CacheStatus) -> Response:
        """The OpenAI error answer (charging only a cascade's thrown-away attempt, if one ran)."""
        elapsed = self._elapsed()
        done = Finished(self.arrival, "none", exc.status, overhead=elapsed, elapsed=elapsed, tenant=tenant,
                        decision=decision, features=features, cache=cache)
        if self._once("refused"):
            with _settle_span("refused"):
                self._deps.accounting.refused(done, exc)
                await self._charge(0)
                await self._spend(None, "none", 0, 0, kind="", reference=False)  # a cascade's thrown-away attempt
        headers = {"x-request-id": self.arrival.request_id, **exc.headers}
        if decision is not None:
            headers["x-tiergate-rule"] = decision.rule
        return Response(exc.to_json(), status_code=exc.status, media_type=_JSON, headers=headers)

    async def gone(self, *, tenant: Tenant | None, decision: Decision | None, features: Features | None,
                   outcome: Outcome, stream: bool = False, ctx: RequestContext | None = None) -> Response:
        """A client gone before its answer began: charged only once a backend may have worked for it.

        Priced (given its `ctx`, for the policy) as spend of kind `gone`: the prompt on the decided tier, the part
        known to be done (not the max_tokens charged against the tenant's limit), with no reference: no answer.

        As for a stream whose client leaves (charged the prompt and what was relayed), the prompt was processed.
        A JSON answer shows nothing of its progress before it is whole, so it is charged the max_tokens the
        backend was asked for as well: the most it may have generated before the closed connection stopped it
        (what OpenAI counts against a tokens-per-minute limit up front). Never reaching a backend costs nothing.
        """
        body = outcome.body
        prompt_tokens = spent = 0
        if body is not None and body.sent and features is not None:
            prompt_tokens = spent = features.prompt_tokens
            if not stream and body.max_tokens:
                spent += body.max_tokens
        elapsed = self._elapsed()
        tier = decision.tier if decision is not None and decision.tier else "none"
        done = Finished(self.arrival, tier, 499, overhead=elapsed, elapsed=elapsed, tenant=tenant, decision=decision,
                        features=features, cache=outcome.cache, prompt_tokens=prompt_tokens)
        if self._once("gone"):
            with _settle_span("gone"):
                self._deps.accounting.gone(done)
                await self._charge(spent)
                await self._spend(ctx, tier, prompt_tokens, 0, kind="gone" if prompt_tokens else "", reference=False)
        return Response(status_code=499, headers={"x-request-id": self.arrival.request_id})  # seen by nobody

    async def shadow(self, ctx: RequestContext, outcome: Outcome, answer: CachedAnswer | None) -> None:
        """A shadow check's result (the operator's cost: nothing charged, nothing accounted, priced as spend of kind
        `shadow` on the tier that answered): the tier's answer goes to the cache, which compares it with the one it
        served; no answer to compare counts as failed (and unpriced: its tokens are unknown)."""
        if not self._once("shadow"):
            return
        d, cache = self._deps, self._deps.cache()
        with _settle_span("shadow"):
            if answer is not None and ctx.policy.costs is not None:
                await self._spend(ctx, answer.tier, answer.prompt_tokens, answer.completion_tokens, kind="shadow",
                                  reference=False)
            if answer is None or cache is None:
                d.metrics.shadow_checks.labels("failed").inc()
                return
            await cache.store(ctx.req, ctx.tenant.id, ctx.decision.cache, answer, outcome.cache_key,
                              route=ctx.cache_route())
            d.metrics.shadow_checks.labels("checked").inc()


def _settle_span(path: str) -> Any:
    """The request's last span, a child of its root: what its ending cost (charge, cache store, distillation offer)
    and which way it ended. The attempt's "relay" span stays the Attempt's own: a cascade has two attempts, and a
    stream's ends when the backend is done, before the client has read it all."""
    return tracing.span("settle", **{"tiergate.settled": path})
