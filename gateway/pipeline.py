"""The completion pipeline: one OpenAI request from its first byte to the start of its answer.

    authenticate → read the body → decode it once → check parameters → tenant limits → classify (Features)
    → policy (Decision) → cache lookup → dispatch to a tier (falling back as the decision allows) → relay
    (a cache hit sampled for a shadow check: relay it, then send the request to a tier too: `gateway.shadow`)

Each step either moves on or raises an `OpenAIError`, which becomes the answer; nothing else escapes. The
request's state is the frozen `RequestContext` (from the decision on) plus its small `Outcome`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from tiergate.cache.types import CacheHit
from tiergate.core import tracing
from tiergate.core.errors import OpenAIError, bad_request, from_validation
from tiergate.core.http import read_body
from tiergate.core.pool import Endpoint
from tiergate.core.types import Decision, Features
from tiergate.core.wire import (
    ChatRequest,
    StreamOptions,
    decode_request,
    raw_fields,
    refused_field,
    unknown_names,
    upstream_body,
)
from tiergate.gateway.auth import Tenant
from tiergate.gateway.cascade import CascadeRunner, applies
from tiergate.gateway.context import Arrival, Outcome, RequestContext
from tiergate.gateway.disconnect import DisconnectWatch
from tiergate.gateway.params import check_params
from tiergate.gateway.relay import Relay

if TYPE_CHECKING:
    from tiergate.gateway.lifecycle import Gateway

__all__ = ["Completions"]

_STREAM_OPTIONS = StreamOptions(include_usage=True)
_INLINE_CLASSIFY_CHARS = 4000  # longer prompts are tokenised in a worker thread, off the event loop
# Unmodelled request fields known not to change the answer; any other one (`functions`, `reasoning_effort`, ...)
# might, and the cache key cannot include what it does not understand, so such requests bypass the cache.
_ANSWER_NEUTRAL = frozenset({"metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key"})


class Completions:
    """`POST /v1/chat/completions` and `POST /v1/completions`, one pipeline for both."""

    def __init__(self, gateway: Gateway) -> None:
        self._gw = gateway
        self._relay = Relay(gateway)
        self._cascade = CascadeRunner(gateway, self._relay)

    async def handle(self, request: Request, kind: str) -> Response:
        gw = self._gw
        arrival = Arrival.now(request.headers.get("x-request-id"), kind)
        tenant: Tenant | None = None
        features: Features | None = None
        decision: Decision | None = None
        outcome = Outcome()
        slot = None
        try:
            tenant = gw.keyring.authenticate(request.headers.get("authorization"))
            active = gw.policy_store.current  # the request's one policy: checked, classified, decided, settled
            body = await read_body(request, gw.settings.max_body_bytes)
            try:
                req, plain = decode_request(body, kind)
                raw = raw_fields(body)  # an unknown key that is not UTF-8 fails only here
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                raise from_validation(exc) from None
            check_params(req, [t.model for t in active.policy.tiers.values()])
            extra = tuple(unknown_names(raw, kind))
            if extra and (refused := refused_field(raw, list(extra))):
                raise bad_request(f"`{refused[0]}` is not supported through this gateway: {refused[1]}.",
                                  code="unsupported_parameter", param=refused[0])
            slot = await gw.limiter.admit(tenant)  # one of the tenant's concurrent requests, or a 429
            text_len = len(req.prompt_text()) if kind == "text" else sum(len(m.text()) for m in req.messages)
            if text_len > gw.settings.max_prompt_chars:
                raise OpenAIError(413, f"Prompt has {text_len} characters; the limit is "
                                       f"{gw.settings.max_prompt_chars}.", code="prompt_too_large")
            if text_len > _INLINE_CLASSIFY_CHARS:
                features = await asyncio.to_thread(gw.classifier.features, req, tenant.id, tenant.priority,
                                                   request.headers, active.policy)
            else:
                features = gw.classifier.features(req, tenant.id, tenant.priority, request.headers, active.policy)
            decision = active.engine.decide(features)
            gw.metrics.child(gw.metrics.decisions, decision.rule, decision.tier or "reject").inc()
            if decision.reject is not None:
                r = decision.reject
                raise OpenAIError(r.status, r.message, code=r.code)
            if tenant.max_tokens is not None:  # the tenant's own cap on answers, under the policy's
                cap = tenant.max_tokens if decision.max_tokens_cap is None else min(tenant.max_tokens,
                                                                                    decision.max_tokens_cap)
                decision = dataclasses.replace(decision, max_tokens_cap=cap)
            ctx = RequestContext(arrival, tenant, req, raw, extra, plain, features, decision, slot, active.policy)
            hit = await self._lookup(ctx, outcome)
            if hit is not None:
                return self._relay.cached(ctx, outcome, hit)
            return await self._dispatch_while_connected(ctx, outcome, request)
        except OpenAIError as exc:
            return gw.accounting.refused(arrival, exc, tenant=tenant, decision=decision, features=features,
                                         cache=outcome.cache)
        except ClientDisconnect:  # gone while sending its body: nothing to answer, nothing to blame
            return gw.accounting.gone(arrival, tenant=tenant, decision=decision, features=features,
                                      cache=outcome.cache)
        finally:
            if slot is not None and not outcome.streaming:  # a relayed stream releases it when it ends
                slot.release()

    async def _lookup(self, ctx: RequestContext, outcome: Outcome) -> CacheHit | None:
        cache, rule, req = self._gw.cache, ctx.decision.cache, ctx.req
        if (cache is None or not rule.enabled or isinstance(req, ChatRequest) and req.tools or not ctx.plain
                or ctx.extra and not _ANSWER_NEUTRAL.issuperset(ctx.extra)):  # e.g. `functions`: not ours to key
            outcome.cache = "bypass"
            return None
        with tracing.span("cache") as span:
            result = await cache.check(req, ctx.tenant.id, rule)
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

    async def _dispatch_while_connected(self, ctx: RequestContext, outcome: Outcome, request: Request) -> Response:
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
            return await self._dispatch(ctx, outcome)
        except asyncio.CancelledError:
            if not watch.fired or task.uncancel() > 0:
                raise  # cancelled by someone else (shutdown): let it through
        finally:
            watch.close()
        return await self._abandoned(ctx, outcome)

    async def _dispatch(self, ctx: RequestContext, outcome: Outcome) -> Response:
        req = ctx.req
        path = "/v1/chat/completions" if req.kind == "chat" else "/v1/completions"
        if applies(ctx):
            return await self._cascade.run(ctx, outcome, path, lambda extra: self._upstream_body(ctx, outcome, extra))
        attempt = await self._gw.dispatcher.open(request=req, features=ctx.features, decision=ctx.decision,
                                                 path=path, body_for=self._upstream_body(ctx, outcome),
                                                 request_id=ctx.request_id, stream=bool(req.stream))
        if req.stream:
            return self._relay.stream(ctx, outcome, attempt)
        return await self._relay.json(ctx, outcome, attempt)

    def _upstream_body(self, ctx: RequestContext, outcome: Outcome,
                       extra: dict[str, object] | None = None) -> Callable[[Endpoint], bytes]:
        """The request as each backend should see it: its own model name, max_tokens capped, usage asked for
        (and `extra` fields: what a cascade asks its first tier for).

        Built from the client's own JSON (`raw`), so every field the structs do not model, at any depth, is
        forwarded byte for byte; only these fields are the gateway's.
        """
        req, max_tokens = ctx.req, ctx.max_tokens()
        changes: dict[str, object] = {"model": None, "max_tokens": max_tokens, "max_completion_tokens": None}
        if req.stream:
            changes["stream_options"] = _STREAM_OPTIONS
        if extra:
            changes.update(extra)
        outcome.sent_max_tokens = max_tokens
        by_model: dict[str, bytes] = {}

        def body_for(ep: Endpoint) -> bytes:
            outcome.sent = True  # dispatch asks for the body just before it posts it
            b = by_model.get(ep.model)
            if b is None:
                changes["model"] = ep.model
                b = by_model[ep.model] = upstream_body(ctx.raw, changes)
            return b

        return body_for

    async def _abandoned(self, ctx: RequestContext, outcome: Outcome) -> Response:
        """A client gone before its answer began, once a backend may have worked for it: charge the tenant.

        As for a stream whose client leaves (charged the prompt and what was relayed), the prompt was processed.
        A JSON answer shows nothing of its progress before it is whole, so it is charged the max_tokens the
        backend was asked for as well: the most it may have generated before the closed connection stopped it
        (what OpenAI counts against a tokens-per-minute limit up front). Never reaching a backend costs nothing.
        """
        prompt_tokens = spent = 0
        if outcome.sent:
            prompt_tokens = spent = ctx.features.prompt_tokens
            if not ctx.req.stream and outcome.sent_max_tokens:
                spent += outcome.sent_max_tokens
        response = self._gw.accounting.gone(ctx.arrival, tenant=ctx.tenant, decision=ctx.decision,
                                            features=ctx.features, cache=outcome.cache, prompt_tokens=prompt_tokens)
        await self._gw.limiter.charge_tokens(ctx.tenant, spent)
        return response

