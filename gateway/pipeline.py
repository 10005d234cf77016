"""The completion pipeline: one OpenAI request from its first byte to the start of its answer.

    authenticate → read the body → decode it once → check parameters → tenant limits → classify (Features)
    → the learned router's edge_success (`gateway.learned_router`) → policy (Decision) → cache lookup → dispatch
    to a tier (falling back as the decision allows; a sampled request the router sent to the cloud is also tried
    on the edge, unseen: `gateway.exploration`) → relay (a cache hit sampled for a shadow check: relay it, then send
    the request to a tier too: `gateway.shadow`)

Each step either moves on or raises an `OpenAIError`, which becomes the answer; nothing else escapes. The
request's state is the frozen `RequestContext` (from the decision on) plus its small `Outcome`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from tiergate.cache.types import CacheHit
from tiergate.core import tracing
from tiergate.core.errors import OpenAIError, bad_request, from_validation
from tiergate.core.http import read_body
from tiergate.core.types import Decision, Features
from tiergate.core.wire import ChatRequest, decode_request, raw_fields, refused_field, unknown_names
from tiergate.gateway.auth import Authenticator, Tenant
from tiergate.gateway.cascade import CascadeRunner, applies
from tiergate.gateway.context import Arrival, Held, Outcome, RequestContext, UpstreamBody
from tiergate.gateway.disconnect import DisconnectWatch
from tiergate.gateway.dispatch import Dispatcher
from tiergate.gateway.exploration import Explorations
from tiergate.gateway.learned_router import LearnedRouter
from tiergate.gateway.limits import Limiter
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.params import check_params
from tiergate.gateway.relay import Relay
from tiergate.gateway.settings import Settings
from tiergate.gateway.settlement import CacheProvider, Settlement, Settlements
from tiergate.gateway.tiers import Tiers
from tiergate.policies.classify import Classifier

__all__ = ["CompletionPipeline", "PipelineParts"]

_INLINE_CLASSIFY_CHARS = 4000  # longer prompts are tokenised in a worker thread, off the event loop
# Unmodelled request fields known not to change the answer; any other one (`functions`, `reasoning_effort`, ...)
# might, and the cache key cannot include what it does not understand, so such requests bypass the cache.
_COST_OFF = frozenset({"off", "false", "0", "no"})  # `x-tiergate-cost: off`: no `cost` in a stream's usage
_ANSWER_NEUTRAL = frozenset({"metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key"})


@dataclass(frozen=True, slots=True)
class PipelineParts:
    """What the pipeline uses, each built before the first request (the cache is read through `cache` since
    start-up builds it)."""

    settings: Settings
    keyring: Authenticator
    routing: Tiers  # the request's routing version (policy and tiers) comes from here, once
    classifier: Classifier
    limiter: Limiter
    metrics: GatewayMetrics
    cache: CacheProvider
    dispatcher: Dispatcher
    relay: Relay
    settlements: Settlements
    router: LearnedRouter | None = None  # the learned router: edge_success before the decision, outcome records
    explorations: Explorations | None = None


def _answer_budget(ctx: RequestContext) -> int:
    """The most tokens the answer may take: its max_tokens as backends are asked for it, else what is left of the
    decided tier's context (the backend stops there)."""
    asked = ctx.max_tokens()
    if asked is not None:
        return asked
    tier = ctx.policy.tiers.get(ctx.decision.tier or "")
    return max(0, tier.max_context - ctx.features.prompt_tokens) if tier is not None else 0


class CompletionPipeline:
    """`POST /v1/chat/completions` and `POST /v1/completions`, one pipeline for both."""

    def __init__(self, parts: PipelineParts) -> None:
        self._parts = parts
        self._relay = parts.relay
        self._cascade = CascadeRunner(parts.dispatcher, parts.metrics, parts.relay,
                                      parts.router.judged if parts.router is not None else None)

    async def handle(self, request: Request, kind: str, endpoint: str | None = None, *, cache: bool = True) -> Response:
        """Answer one request of `kind` ("chat" or "text"); `endpoint` names the route in metrics and logs when it
        is not the kind's own (a surface translated into chat: `gateway.surface`); `cache: False` keeps it out of the
        cache (one of several choices: `gateway.fanout`)."""
        gw = self._parts
        arrival = Arrival.now(request.headers.get("x-request-id"), kind, endpoint)
        settle = gw.settlements.open(arrival)  # the one place this request's ending is settled, whichever it is
        tenant: Tenant | None = None
        features: Features | None = None
        decision: Decision | None = None
        outcome = Outcome(stream_cost=request.headers.get("x-tiergate-cost", "").lower() not in _COST_OFF)
        # The request's one routing version: checked, classified, decided, dispatched and settled under it.
        held = Held(gw.routing.hold())
        active = held.routing.routing.active
        try:
            tenant, settle.key = gw.keyring.identify(request.headers.get("authorization"))
            body = await read_body(request, gw.settings.max_body_bytes, gw.settings.body_timeout_s)
            try:
                req, plain = decode_request(body, kind)
                raw = raw_fields(body)  # an unknown key that is not UTF-8 fails only here
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                raise from_validation(exc) from None
            if (served := active.policy.resolve_model(req.model)) != req.model:  # a client's own name, aliased
                req = msgspec.structs.replace(req, model=served)
            check_params(req, [t.model for t in active.policy.tiers.values()])
            extra = tuple(unknown_names(raw, kind))
            if extra and (refused := refused_field(raw, list(extra))):
                raise bad_request(f"`{refused[0]}` is not supported through this gateway: {refused[1]}.",
                                  code="unsupported_parameter", param=refused[0])
            held.slot = await gw.limiter.admit(tenant)  # one of the tenant's concurrent requests, or a 429
            text_len = (sum(len(m.text()) for m in req.messages) if isinstance(req, ChatRequest)
                        else len(req.prompt_text()))
            if text_len > gw.settings.max_prompt_chars:
                raise OpenAIError(413, f"Prompt has {text_len} characters; the limit is "
                                       f"{gw.settings.max_prompt_chars}.", code="prompt_too_large")
            if text_len > _INLINE_CLASSIFY_CHARS:
                features = await asyncio.to_thread(gw.classifier.features, req, tenant.id, tenant.priority,
                                                   request.headers, active.policy)
            else:
                features = gw.classifier.features(req, tenant.id, tenant.priority, request.headers, active.policy)
            if gw.router is not None:
                features = gw.router.annotate(features, active.policy, held.routing.routing)
            decision = active.engine.decide(features)
            gw.metrics.child(gw.metrics.decisions, decision.rule, decision.tier or "reject").inc()
            if decision.reject is not None:
                raise decision.reject.error()
            if tenant.max_tokens is not None:  # the tenant's own cap on answers, under the policy's
                cap = tenant.max_tokens if decision.max_tokens_cap is None else min(tenant.max_tokens,
                                                                                    decision.max_tokens_cap)
                decision = dataclasses.replace(decision, max_tokens_cap=cap)
            ctx = RequestContext(arrival, tenant, req, raw, extra, plain, features, decision, held)
            held.tokens = await settle.reserve(held.slot, features.prompt_tokens + _answer_budget(ctx))  # or a 429
            ctx = await settle.reserve_budget(ctx, ctx.max_tokens())  # its worst-case cost, or a 429 (or downgraded)
            decision = ctx.decision
            hit = await self._lookup(ctx, outcome) if cache else None
            if hit is not None:
                return self._relay.cached(ctx, outcome, hit, settle)
            return await self._dispatch_while_connected(ctx, outcome, request, settle)
        except OpenAIError as exc:
            return await settle.refused(exc, tenant=tenant, decision=decision, features=features,
                                        cache=outcome.cache)
        except ClientDisconnect:  # gone while sending its body: nothing to answer, nothing to blame
            return await settle.gone(tenant=tenant, decision=decision, features=features, outcome=outcome)
        finally:
            if not outcome.streaming:  # a relayed stream releases it when it ends
                held.release()

    async def refuse(self, request: Request, kind: str, exc: OpenAIError | ClientDisconnect) -> Response:
        """End a request that failed before it got here (its body, read by `gateway.fanout`), settled as the
        pipeline settles its own: an OpenAI error, or a client gone while sending its body."""
        gw = self._parts
        settle = gw.settlements.open(Arrival.now(request.headers.get("x-request-id"), kind))
        try:
            tenant: Tenant | None = gw.keyring.authenticate(request.headers.get("authorization"))
        except OpenAIError:
            tenant = None
        if isinstance(exc, ClientDisconnect):
            return await settle.gone(tenant=tenant, decision=None, features=None, outcome=Outcome())
        return await settle.refused(exc, tenant=tenant, decision=None, features=None, cache="bypass")

    async def _lookup(self, ctx: RequestContext, outcome: Outcome) -> CacheHit | None:
        cache, rule, req = self._parts.cache(), ctx.decision.cache, ctx.req
        if (cache is None or not rule.enabled or isinstance(req, ChatRequest) and req.tools or not ctx.plain
                or ctx.extra and not _ANSWER_NEUTRAL.issuperset(ctx.extra)):  # e.g. `functions`: not ours to key
            outcome.cache = "bypass"
            return None
        with tracing.span("cache") as span:
            result = await cache.check(req, ctx.tenant.id, rule, route=ctx.cache_route())
            span.set_attribute("tiergate.cache", result.status)
        outcome.cache_key = result.key
        hit = result.hit
        if hit is None:
            outcome.cache = result.status  # "miss", or "bypass" when uncacheable or the store is unreachable
            return None
        outcome.cache = hit.kind
        outcome.shadow_check = result.reason == "verify"
        outcome.similarity = hit.similarity if hit.kind == "hit-semantic" else None
        return hit

    async def _dispatch_while_connected(self, ctx: RequestContext, outcome: Outcome, request: Request,
                                        settle: Settlement) -> Response:
        """Dispatch, but give up as soon as the client disconnects before its answer has begun.

        Until the first byte goes out, a client that hangs up is noticed only by reading the ASGI channel;
        without a watcher the gateway would wait out the queue, the backend's whole generation and any
        retries for nobody, holding a tier slot and the tenant's concurrency the whole time. Once a stream
        has begun, the streaming response notices the disconnect itself.
        """
        task = asyncio.current_task()
        assert task is not None
        watch = DisconnectWatch(request.receive, task)
        try:
            return await self._dispatch(ctx, outcome, settle)
        except asyncio.CancelledError:
            if not watch.fired or task.uncancel() > 0:
                raise  # cancelled by someone else (shutdown): let it through
        finally:
            watch.close()
        # Gone before its answer began: charged only if a backend may have worked for it (`Settlement.gone`).
        return await settle.gone(tenant=ctx.tenant, decision=ctx.decision, features=ctx.features, outcome=outcome,
                                 stream=bool(ctx.req.stream), ctx=ctx)

    async def _dispatch(self, ctx: RequestContext, outcome: Outcome, settle: Settlement) -> Response:
        req = ctx.req
        path = "/v1/chat/completions" if req.kind == "chat" else "/v1/completions"
        body = outcome.body = UpstreamBody.of(ctx)  # dispatch marks it sent when it posts it
        if self._parts.explorations is not None:
            self._parts.explorations.maybe_start(ctx, outcome)
        if applies(ctx):
            return await self._cascade.run(ctx, outcome, path, body, settle)
        attempt = await self._parts.dispatcher.open(tiers=ctx.routing.tiers, request=req, features=ctx.features,
                                                    decision=ctx.decision, path=path, body=body,
                                                    request_id=ctx.request_id, stream=bool(req.stream))
        if req.stream:
            return self._relay.stream(ctx, outcome, attempt, settle)
        return await self._relay.json(ctx, outcome, attempt, settle)
