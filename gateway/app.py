"""The gateway application: one `Gateway` object owns all state; `create_app` wraps it in Starlette.

A completion request goes: authenticate → read and decode the body once → classify (Features) →
policy (Decision) → cache lookup → dispatch to a tier, falling back as the decision allows →
relay the answer (JSON or SSE) → store it in the cache, count it, log it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route as HttpRoute

from cache.types import CachedAnswer, CacheHit
from gateway import metrics
from gateway.admission import Admission
from gateway.auth import KeyRing, Tenant
from gateway.dashboard import Dashboard
from gateway.dispatch import Attempt, Dispatcher, Route
from gateway.errors import OpenAIError, bad_request, from_validation, not_found, unauthorized
from gateway.limits import Limiter
from gateway.logs import configure_logging, get_logger
from gateway.pool import Endpoint, Pool
from gateway.render import DONE, StreamAccumulator, cacheable, render_json, render_sse, sse, summarize
from gateway.schemas import (
    ChatRequest,
    ParsedRequest,
    StreamOptions,
    decode_request,
    raw_fields,
    refused_field,
    unknown_names,
    upstream_body,
)
from gateway.settings import Settings
from gateway.upstream import UpstreamClient, UpstreamFailure
from policies.types import Decision, Features

if TYPE_CHECKING:
    from cache.keys import RequestKey

__all__ = ["Gateway", "create_app"]

log = get_logger("tiergate.gateway")
_encode = msgspec.json.Encoder().encode
_JSON = "application/json"
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
_STREAM_OPTIONS = StreamOptions(include_usage=True)
_INLINE_CLASSIFY_CHARS = 4000  # longer prompts are tokenised in a worker thread, off the event loop
# Unmodelled request fields known not to change the answer; any other one (`functions`, `reasoning_effort`, ...)
# might, and the cache key cannot include what it does not understand, so such requests bypass the cache.
_ANSWER_NEUTRAL = frozenset({"metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key"})


@dataclass(slots=True)
class _Ctx:
    """What one request carries through the handler."""

    request_id: str
    started: float
    endpoint: str
    tenant: Tenant | None = None
    req: ParsedRequest | None = None
    features: Features | None = None
    decision: Decision | None = None
    cache: str = "bypass"
    cache_key: RequestKey | None = None  # from the lookup, reused by the store
    similarity: float | None = None
    holds_tenant_slot: bool = False  # counted in the tenant's concurrency; whoever ends the answer releases it
    raw: dict[str, msgspec.Raw] | None = None  # the body's top-level fields as sent: what the backend gets, amended
    extra: list[str] | None = None  # names of the top-level fields the structs do not model
    plain: bool = True  # no field the structs do not model below the top level (see `decode_request`)
    sent: bool = False  # a backend was given the request (it may be working on it)
    sent_max_tokens: int | None = None  # the max_tokens the backend was asked for

    def headers(self, tier: str, overhead_s: float | None = None) -> dict[str, str]:
        h = {"x-request-id": self.request_id, "x-tiergate-tier": tier, "x-tiergate-cache": self.cache}
        if self.decision is not None:
            h["x-tiergate-rule"] = self.decision.rule
        if self.similarity is not None:
            h["x-tiergate-similarity"] = f"{self.similarity:.4f}"
        if overhead_s is not None:
            h["x-tiergate-overhead-ms"] = f"{overhead_s * 1000:.3f}"
        return h


class Gateway:
    """All of a gateway process's state: settings, keys, policy, classifier, cache, pools, upstream client."""

    def __init__(self, settings: Settings, *, keyring: KeyRing | None = None) -> None:
        from gateway.classify import Classifier
        from policies.store import PolicyStore

        self.settings = settings
        self.keyring = keyring or _keyring_from(settings)
        self.policy_store = PolicyStore(settings.policy)
        self.classifier = Classifier(self.policy_store)
        self.upstream = UpstreamClient()
        self.cache = None  # cache.SemanticCache, built at start-up
        self.redis = None
        self._routes: dict[str, Route] = {}
        self._tier_configs: dict[str, object] = {}
        self.dispatcher = Dispatcher(self.upstream, lambda: self._routes)
        self.limiter = Limiter()
        self.draining = False
        self.started_at = time.time()
        self.dashboard = Dashboard(self)  # the status page; its Stats see every answered request

    # ---- lifecycle -------------------------------------------------------------------------------------------

    async def startup(self) -> None:
        await self.upstream.start()
        if self.settings.redis_url:
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff

            from cache.redis_conn import open_redis

            # No retries: a heartbeat or a rate-limit check must not take seconds while a node hangs
            # (the limiter fails open; an edge node sends its next heartbeat anyway).
            self.redis = open_redis(self.settings.redis_url, socket_timeout=0.5, socket_connect_timeout=0.5,
                                    health_check_interval=10, retry=Retry(NoBackoff(), 0))
            self.limiter = Limiter(self.redis)
        await self.policy_store.start()
        self.policy_store.on_change(self._sync_pools)
        await self._sync_pools()
        if self.settings.cache:
            from cache import build_cache

            self.cache = build_cache(self.settings.redis_url, self.settings.embedder)
            await self.cache.start()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._on_sighup)
        log.info("gateway_started", policy=str(self.settings.policy), redis=bool(self.redis),
                 tiers={n: r.pool.__class__.__name__ for n, r in self._routes.items()},
                 stand_in=[n for n, t in self._tier_configs.items() if getattr(t, "stand_in", False)])
        _tune_gc()

    async def shutdown(self) -> None:
        self.draining = True
        await self.policy_store.stop()
        for route in self._routes.values():
            await route.pool.stop()
        if self.cache is not None:
            await self.cache.stop()
        await self.upstream.close()
        if self.redis is not None:
            await self.redis.aclose()

    def _on_sighup(self) -> None:
        asyncio.get_running_loop().create_task(self.policy_store.reload())

    async def _sync_pools(self, *_: object) -> None:
        """Build a pool per tier of the current policy; keep pools whose tier config did not change."""
        policy = self.policy_store.current.policy
        new_routes: dict[str, Route] = {}
        for name, tier in policy.tiers.items():
            old = self._routes.get(name)
            if old is not None and self._tier_configs.get(name) == tier:
                new_routes[name] = old
                continue
            pool = self._make_pool(name, tier)
            await pool.start()
            new_routes[name] = Route(name, pool, Admission(_capacity_of(tier, pool), max_waiting=tier.queue.max_waiting))
            self._tier_configs[name] = tier
        stale = [r for n, r in self._routes.items() if new_routes.get(n) is not r]
        self._routes = new_routes
        for route in stale:
            await route.pool.stop()

    def _make_pool(self, name: str, tier) -> Pool:
        if tier.kind == "edge" or tier.stand_in:  # a stand-in cloud tier is a llama.cpp server, not vLLM
            from edge_node.pool import EdgePool

            return EdgePool(name, list(tier.endpoints), tier.served_model or tier.model, redis=self.redis)
        from cloud_pool.pool import CloudPool

        return CloudPool.from_tier(tier)

    def ready(self) -> tuple[bool, dict[str, object]]:
        tiers = {n: r.pool.healthy() for n, r in self._routes.items()}
        ok = not self.draining and any(tiers.values())
        return ok, {"ready": ok, "draining": self.draining, "policy": self.policy_store.current.version, "tiers": tiers}

    # ---- the request path ------------------------------------------------------------------------------------

    def public_models(self) -> dict[str, object]:
        """Model name → tier config, for every tier of the current policy (plus `auto`)."""
        return {t.model: t for t in self.policy_store.current.policy.tiers.values()}

    async def completion(self, request: Request, kind: str) -> Response:
        ctx = _Ctx(request.headers.get("x-request-id") or uuid.uuid4().hex, time.perf_counter(),
                   "chat" if kind == "chat" else "completions")
        try:
            ctx.tenant = self.keyring.authenticate(request.headers.get("authorization"))
            body = await self._read_body(request)
            try:
                req, ctx.plain = decode_request(body, kind)
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                raise from_validation(exc) from None
            self._validate(req, ctx.tenant)
            ctx.req = req
            ctx.raw = raw = raw_fields(body)
            ctx.extra = extra = unknown_names(raw, kind)
            if extra and (refused := refused_field(raw, extra)):
                raise bad_request(f"`{refused[0]}` is not supported through this gateway: {refused[1]}.",
                                  code="unsupported_parameter", param=refused[0])
            await self.limiter.admit(ctx.tenant)  # counts the request in the tenant's concurrency, or raises 429
            ctx.holds_tenant_slot = True
            text_len = len(req.prompt_text()) if kind == "text" else sum(len(m.text()) for m in req.messages)
            if text_len > self.settings.max_prompt_chars:
                raise OpenAIError(413, f"Prompt has {text_len} characters; the limit is "
                                       f"{self.settings.max_prompt_chars}.", code="prompt_too_large")
            if text_len > _INLINE_CLASSIFY_CHARS:
                ctx.features = await asyncio.to_thread(self.classifier.features, req, ctx.tenant.id,
                                                       ctx.tenant.priority, request.headers)
            else:
                ctx.features = self.classifier.features(req, ctx.tenant.id, ctx.tenant.priority, request.headers)
            ctx.decision = decision = self.policy_store.current.engine.decide(ctx.features)
            metrics.child(metrics.DECISIONS, decision.rule, decision.tier or "reject").inc()
            if decision.reject is not None:
                r = decision.reject
                raise OpenAIError(r.status, r.message, code=r.code)
            hit = await self._lookup(ctx)
            if hit is not None:
                return self._answer_from_cache(ctx, hit)
            return await self._dispatch_while_connected(ctx, request)
        except OpenAIError as exc:
            return self._error(ctx, exc)
        except ClientDisconnect:  # gone while sending its body: nothing to answer, nothing to blame
            return self._client_gone(ctx)
        finally:
            self._leave(ctx)

    async def _dispatch_while_connected(self, ctx: _Ctx, request: Request) -> Response:
        """Dispatch, but give up as soon as the client disconnects before its answer has begun.

        Until the first byte goes out, a client that hangs up is noticed only by reading the ASGI channel;
        without a watcher the gateway would wait out the queue, the backend's whole generation and any
        retries for nobody, holding a tier slot and the tenant's concurrency the whole time. Once a stream
        has begun, the streaming response notices the disconnect itself.
        """
        task = asyncio.current_task()
        watch = _DisconnectWatch(request.receive, task)
        try:
            return await self._dispatch(ctx, request)
        except asyncio.CancelledError:
            if not watch.fired or task.uncancel() > 0:
                raise  # cancelled by someone else (shutdown): let it through
        finally:
            watch.close()
        return await self._abandoned(ctx)

    async def _abandoned(self, ctx: _Ctx) -> Response:
        """A client gone before its answer began, once a backend may have worked for it: charge the tenant.

        As for a stream whose client leaves (charged the prompt and what was relayed), the prompt was processed.
        A JSON answer shows nothing of its progress before it is whole, so it is charged the max_tokens the
        backend was asked for as well: the most it may have generated before the closed connection stopped it
        (what OpenAI counts against a tokens-per-minute limit up front). Never reaching a backend costs nothing.
        """
        prompt_tokens = spent = 0
        if ctx.sent:
            prompt_tokens = spent = ctx.features.prompt_tokens
            if not ctx.req.stream and ctx.sent_max_tokens:
                spent += ctx.sent_max_tokens
        response = self._client_gone(ctx, prompt_tokens)
        await self.limiter.charge_tokens(ctx.tenant, spent)
        return response

    def _client_gone(self, ctx: _Ctx, prompt_tokens: int = 0) -> Response:
        """Count and log a client that left before its answer began; the 499 is never seen by anyone."""
        tier = ctx.decision.tier if ctx.decision is not None and ctx.decision.tier else "none"
        metrics.DISCONNECTS.labels(tier).inc()
        self._account(ctx, tier, 499, time.perf_counter() - ctx.started, prompt_tokens)
        return Response(status_code=499, headers={"x-request-id": ctx.request_id})

    def _leave(self, ctx: _Ctx) -> None:
        if ctx.holds_tenant_slot:
            ctx.holds_tenant_slot = False
            self.limiter.leave(ctx.tenant)

    async def _read_body(self, request: Request) -> bytes:
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise OpenAIError(413, f"Request body is {declared} bytes; the limit is {limit}.", code="body_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise OpenAIError(413, f"Request body exceeds the limit of {limit} bytes.", code="body_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    def _validate(self, req: ParsedRequest, tenant: Tenant) -> None:
        if req.model != "auto" and req.model not in self.public_models():
            known = ", ".join(["auto", *self.public_models()])
            raise not_found(f"The model `{req.model}` does not exist. Available models: {known}.",
                            code="model_not_found", param="model")
        if isinstance(req, ChatRequest):
            if not req.messages:
                raise bad_request("`messages` must contain at least one message.", param="messages")
        else:
            if isinstance(req.prompt, list) and len(req.prompt) != 1:
                raise bad_request("`prompt` must be a string or a list of exactly one string.", param="prompt")
            if req.best_of is not None and req.best_of != 1:
                raise bad_request("Only `best_of: 1` is supported: one sequence per request.", param="best_of")
        mt = req.effective_max_tokens()
        if mt is not None and mt < 1:
            field = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) is not None else "max_tokens"
            raise bad_request(f"`{field}` must be at least 1.", param=field)
        if req.n is not None and req.n != 1:
            raise bad_request("Only `n: 1` is supported.", param="n")
        if req.temperature is not None and not 0 <= req.temperature <= 2:
            raise bad_request("`temperature` must be between 0 and 2.", param="temperature")
        if req.top_p is not None and not 0 < req.top_p <= 1:
            raise bad_request("`top_p` must be in (0, 1].", param="top_p")

    async def _lookup(self, ctx: _Ctx) -> CacheHit | None:
        rule = ctx.decision.cache
        if (self.cache is None or not rule.enabled or ctx.req.kind == "chat" and ctx.req.tools or not ctx.plain
                or ctx.extra and not _ANSWER_NEUTRAL.issuperset(ctx.extra)):  # e.g. `functions`: not ours to key
            ctx.cache = "bypass"
            return None
        result = await self.cache.check(ctx.req, ctx.tenant.id, rule)
        ctx.cache_key = result.key
        hit = result.hit
        if hit is None:
            ctx.cache = result.status  # "miss", or "bypass" when uncacheable or the store is unreachable
            return None
        ctx.cache, ctx.similarity = hit.kind, (hit.similarity if hit.kind == "hit-semantic" else None)
        return hit

    def _answer_from_cache(self, ctx: _Ctx, hit: CacheHit) -> Response:
        overhead = time.perf_counter() - ctx.started
        headers = ctx.headers("cache", overhead)
        # Accounting runs after the answer has gone out (a background task), so the client does not wait for it.
        task = BackgroundTask(self._account, ctx, "cache", 200, overhead, elapsed=overhead)
        metrics.TOKENS.labels("cache", "completion").inc(hit.answer.completion_tokens)
        if ctx.req.stream:
            include_usage = bool(ctx.req.stream_options and ctx.req.stream_options.include_usage)
            events = render_sse(hit.answer, include_usage)
            return StreamingResponse(_iterate(events), media_type="text/event-stream", headers=headers | _SSE_HEADERS,
                                     background=task)
        return Response(render_json(hit.answer), media_type=_JSON, headers=headers, background=task)

    def _upstream_body(self, ctx: _Ctx, decision: Decision) -> Callable[[Endpoint], bytes]:
        """The request as each backend should see it: its own model name, max_tokens capped, usage asked for.

        Built from the client's own JSON (`raw`), so every field the structs do not model, at any depth, is
        forwarded byte for byte; only these fields are the gateway's.
        """
        req, raw = ctx.req, ctx.raw
        max_tokens = req.effective_max_tokens()
        if decision.max_tokens_cap is not None:
            max_tokens = decision.max_tokens_cap if max_tokens is None else min(max_tokens, decision.max_tokens_cap)
        changes: dict[str, object] = {"model": None, "max_tokens": max_tokens, "max_completion_tokens": None}
        if req.stream:
            changes["stream_options"] = _STREAM_OPTIONS
        ctx.sent_max_tokens = max_tokens
        by_model: dict[str, bytes] = {}

        def body_for(ep: Endpoint) -> bytes:
            ctx.sent = True  # dispatch asks for the body just before it posts it
            b = by_model.get(ep.model)
            if b is None:
                changes["model"] = ep.model
                b = by_model[ep.model] = upstream_body(raw, changes)
            return b

        return body_for

    async def _dispatch(self, ctx: _Ctx, request: Request) -> Response:
        req, decision = ctx.req, ctx.decision
        if ctx.tenant.max_tokens is not None:
            cap = ctx.tenant.max_tokens if decision.max_tokens_cap is None else min(ctx.tenant.max_tokens,
                                                                                     decision.max_tokens_cap)
            decision = ctx.decision = _with_cap(decision, cap)
        path = "/v1/chat/completions" if req.kind == "chat" else "/v1/completions"
        attempt = await self.dispatcher.open(request=req, features=ctx.features, decision=decision, path=path,
                                             body_for=self._upstream_body(ctx, decision),
                                             request_id=ctx.request_id, stream=req.stream)
        if req.stream:
            return self._relay_stream(ctx, attempt)
        try:
            body = await attempt.response.read()
            attempt.response.release()
        except UpstreamFailure as f:
            attempt.response.close()
            attempt.finish(ok=False)
            metrics.UPSTREAM_ERRORS.labels(attempt.tier, f.kind).inc()
            raise OpenAIError(f.status, f"Tier `{attempt.tier}`: {f}", type="upstream_error",
                              code=f"upstream_{f.kind}") from None
        except BaseException:  # cancelled: the client left (or shutdown); closing stops the generation
            attempt.response.close()
            attempt.finish()
            raise
        upstream_s = time.perf_counter() - attempt.upstream_started
        attempt.finish()
        try:
            summary = summarize(body)
        except (msgspec.ValidationError, msgspec.DecodeError):
            raise OpenAIError(502, f"Tier `{attempt.tier}` returned a malformed answer.", type="upstream_error",
                              code="upstream_protocol") from None
        overhead = time.perf_counter() - ctx.started - upstream_s
        headers = ctx.headers(attempt.tier, overhead)
        if attempt.fallback_from:
            headers["x-tiergate-fallback-from"] = attempt.fallback_from
        answer = cacheable(summary, req.kind, attempt.tier) if ctx.cache == "miss" else None
        task = BackgroundTask(self._after_answer, ctx, attempt.tier, overhead, time.perf_counter() - ctx.started,
                              summary.prompt_tokens, summary.completion_tokens, answer)
        return Response(body, media_type=_JSON, headers=headers, background=task)

    async def _after_answer(self, ctx: _Ctx, tier: str, overhead: float, elapsed: float, prompt_tokens: int,
                            completion_tokens: int, answer: CachedAnswer | None) -> None:
        """What a complete JSON answer still owes once the client has it: accounting, token budget, cache store.

        Run as the response's background task: none of it changes the answer, so the client should not wait.
        """
        self._account(ctx, tier, 200, overhead, prompt_tokens, completion_tokens, elapsed=elapsed)
        await self.limiter.charge_tokens(ctx.tenant, prompt_tokens + completion_tokens)
        if answer is not None:
            await self._store(ctx, answer)

    def _relay_stream(self, ctx: _Ctx, attempt: Attempt) -> Response:
        req = ctx.req
        client_wants_usage = bool(req.stream_options and req.stream_options.include_usage)
        overhead = (attempt.upstream_started - ctx.started)
        headers = ctx.headers(attempt.tier, overhead) | _SSE_HEADERS
        if attempt.fallback_from:
            headers["x-tiergate-fallback-from"] = attempt.fallback_from
        metrics.TTFT.labels(attempt.tier).observe(attempt.first_at - ctx.started)
        holds = ctx.holds_tenant_slot
        ctx.holds_tenant_slot = False  # the stream owns it now
        relay = _Relay(StreamAccumulator())

        async def on_close() -> None:
            """Runs however the stream ended (done, broken, the client gone), after its last byte went out."""
            attempt.response.close()
            attempt.finish(ok=relay.status != 502)  # no-op when the relay finished it; a client leaving is no fault
            if holds:
                self.limiter.leave(ctx.tenant)
            if relay.status == 499:  # the client went away; closing the response stopped the generation upstream
                metrics.DISCONNECTS.labels(attempt.tier).inc()
            acc = relay.acc
            prompt_tokens, completion_tokens = acc.prompt_tokens, acc.completion_tokens
            if not (prompt_tokens or completion_tokens):
                # No usage chunk (the stream broke or the client left first), yet the backend did the work:
                # charge our own prompt count and one token per content chunk, which is how backends stream.
                prompt_tokens, completion_tokens = ctx.features.prompt_tokens, len(acc.parts)
            self._account(ctx, attempt.tier, relay.status, overhead, prompt_tokens, completion_tokens)
            if relay.status == 200 and ctx.cache == "miss" and (answer := cacheable(acc, ctx.req.kind, attempt.tier)):
                await self._store(ctx, answer)
            await self.limiter.charge_tokens(ctx.tenant, prompt_tokens + completion_tokens)

        return _Stream(self._stream_body(ctx, attempt, relay, client_wants_usage), on_close,
                       media_type="text/event-stream", headers=headers)

    async def _stream_body(self, ctx: _Ctx, attempt: Attempt, relay: _Relay,
                           client_wants_usage: bool) -> AsyncIterator[bytes]:
        """Relay the backend's chunks, then `[DONE]`; a backend failing mid-stream ends in an SSE error event."""
        acc = relay.acc
        try:
            batch = attempt.first
            events = attempt.events
            while batch is not None:
                out = []
                for payload in batch:
                    if payload == b"[DONE]":
                        relay.status = 200
                        attempt.finish()  # free the tier's slot now; accounting waits until the client has it all
                        out.append(DONE)
                        yield b"".join(out)
                        return
                    try:
                        usage_only = acc.feed(payload)
                    except (msgspec.ValidationError, msgspec.DecodeError):
                        usage_only = False  # relay what we cannot read; it is the backend's own chunk
                    if not usage_only or client_wants_usage:
                        out.append(sse(payload))
                if out:
                    yield b"".join(out)
                batch = await anext(events, None)
            raise UpstreamFailure(f"{attempt.endpoint.id} ended the stream without [DONE]", kind="stream")
        except UpstreamFailure as f:
            relay.status = 502
            attempt.finish(ok=False)
            metrics.STREAM_ERRORS.labels(attempt.tier).inc()
            metrics.UPSTREAM_ERRORS.labels(attempt.tier, f.kind).inc()
            log.warning("stream_broken", request_id=ctx.request_id, tier=attempt.tier, endpoint=attempt.endpoint.id,
                        error=str(f))
            err = OpenAIError(502, f"Tier `{attempt.tier}` failed mid-stream: {f}", type="upstream_error",
                              code=f"upstream_{f.kind}")
            yield sse(err.to_json()) + DONE

    async def _store(self, ctx: _Ctx, answer: CachedAnswer) -> None:
        if self.cache is not None:
            await self.cache.store(ctx.req, ctx.tenant.id, ctx.decision.cache, answer, ctx.cache_key)

    def _account(self, ctx: _Ctx, tier: str, status: int, overhead: float, prompt_tokens: int = 0,
                 completion_tokens: int = 0, *, elapsed: float | None = None) -> None:
        if elapsed is None:
            elapsed = time.perf_counter() - ctx.started
        rule = ctx.decision.rule if ctx.decision else "-"
        metrics.child(metrics.REQUESTS, ctx.endpoint, tier, rule, ctx.cache, str(status)).inc()
        metrics.child(metrics.DURATION, tier).observe(elapsed)
        metrics.OVERHEAD.observe(overhead)
        self.dashboard.stats.record(tier, ctx.cache, status, elapsed)
        if prompt_tokens:
            metrics.child(metrics.TOKENS, tier, "prompt").inc(prompt_tokens)
        if completion_tokens:
            metrics.child(metrics.TOKENS, tier, "completion").inc(completion_tokens)
        f = ctx.features
        log.info("request", request_id=ctx.request_id, tenant=ctx.tenant.id if ctx.tenant else None,
                 endpoint=ctx.endpoint, tier=tier, rule=rule, cache=ctx.cache, status=status,
                 prompt_tokens=f.prompt_tokens if f else None, complexity=round(f.complexity, 3) if f else None,
                 completion_tokens=completion_tokens, ms=round(elapsed * 1000, 2), overhead_ms=round(overhead * 1000, 3))

    def _error(self, ctx: _Ctx, exc: OpenAIError) -> Response:
        metrics.CLIENT_ERRORS.labels(exc.code or str(exc.status)).inc()
        if exc.status >= 500 or exc.status == 429:
            self._account(ctx, "none", exc.status, time.perf_counter() - ctx.started)
        else:
            log.info("request_refused", request_id=ctx.request_id, status=exc.status, code=exc.code,
                     tenant=ctx.tenant.id if ctx.tenant else None)
        headers = {"x-request-id": ctx.request_id, **exc.headers}
        if ctx.decision is not None:
            headers["x-tiergate-rule"] = ctx.decision.rule
        return Response(exc.to_json(), status_code=exc.status, media_type=_JSON, headers=headers)

    # ---- the rest of the HTTP surface ------------------------------------------------------------------------

    async def list_models(self, request: Request) -> Response:
        self.keyring.authenticate(request.headers.get("authorization"))
        now = int(self.started_at)
        data = [{"id": "auto", "object": "model", "created": now, "owned_by": "tiergate",
                 "description": "Let the routing policy choose the tier."}]
        for name, route in self._routes.items():
            t = self._tier_configs[name]
            backends = sorted({ep.model for ep in route.pool.endpoints()})
            desc = f"{t.kind} tier `{name}`"
            if getattr(t, "stand_in", False):
                desc += " — LOCAL STAND-IN (llama.cpp on this machine), not vLLM"
            data.append({"id": t.model, "object": "model", "created": now, "owned_by": "tiergate",
                         "tier": name, "kind": t.kind, "stand_in": bool(getattr(t, "stand_in", False)),
                         "backend_models": backends, "description": desc})
        return JSONResponse({"object": "list", "data": data})

    async def edge_heartbeat(self, request: Request) -> Response:
        from edge_node.pool import HeartbeatError, parse_heartbeat

        self._check_edge_token(request)
        try:
            info = parse_heartbeat(await self._read_body(request))
            pool = self._edge_pool(info.tier)
            await pool.heartbeat(info)
        except HeartbeatError as exc:
            raise bad_request(str(exc), code="invalid_heartbeat") from None
        return JSONResponse({"ok": True, "tier": pool.tier})

    async def edge_deregister(self, request: Request) -> Response:
        self._check_edge_token(request)
        try:
            info = msgspec.json.decode(await self._read_body(request), type=dict[str, str | None])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise bad_request(f"deregister body must be {{\"node_id\": ...}}: {exc}", code="invalid_heartbeat") from None
        if not info.get("node_id"):
            raise bad_request("deregister body needs `node_id`.", code="invalid_heartbeat")
        known = await self._edge_pool(info.get("tier")).deregister(str(info["node_id"]))
        return JSONResponse({"ok": True, "known": known})

    def _edge_pool(self, tier: str | None):
        edge = [r for r in self._routes.values() if self._tier_configs[r.name].kind == "edge"]
        if tier:
            edge = [r for r in edge if r.name == tier]
        if not edge:
            raise not_found(f"No edge tier {tier or ''} in the active policy.", code="no_edge_tier")
        return edge[0].pool

    def _check_edge_token(self, request: Request) -> None:
        token = self.settings.edge_token
        if token is None:
            host = request.client.host if request.client else ""
            if host not in ("127.0.0.1", "::1", "localhost", "testclient"):
                raise unauthorized("Edge registration from other hosts needs TIERGATE_EDGE_TOKEN set on the gateway.")
            return
        if request.headers.get("authorization") != f"Bearer {token}":
            raise unauthorized("Invalid edge token.")

    def check_admin(self, request: Request) -> None:
        key = self.settings.admin_key
        if not key:
            raise OpenAIError(403, "Admin endpoints are disabled: set TIERGATE_ADMIN_KEY.", type="permission_error",
                              code="admin_disabled")
        import hmac

        got = request.headers.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {key}".encode()):
            raise unauthorized("Invalid admin key.")

    async def admin_reload(self, request: Request) -> Response:
        self.check_admin(request)
        result = await self.policy_store.reload()
        version = self.policy_store.current.version
        if bool(getattr(result, "ok", result)):
            return JSONResponse({"ok": True, "version": version, "error": None})
        # Rejected: the OpenAI error shape (what every client of this API parses) plus the version still serving.
        err = OpenAIError(422, str(getattr(result, "error", None) or "The policy file was rejected."),
                          code="policy_invalid")
        return Response(_encode({**err.body(), "ok": False, "version": version}),
                        status_code=422, media_type=_JSON)

    async def admin_cache_invalidate(self, request: Request) -> Response:
        self.check_admin(request)
        if self.cache is None:
            raise OpenAIError(409, "The cache is disabled.", code="cache_disabled")
        q = request.query_params
        for name in ("tenant", "entry"):
            if name in q and not q[name]:
                raise bad_request(f"`{name}` must not be empty.", param=name)
        if not (q.get("tenant") or q.get("entry") or q.get("all") == "true"):
            raise bad_request("Say what to invalidate: ?tenant=ID, ?entry=ID or ?all=true.")
        from cache.store import StoreUnavailable

        try:
            n = await self.cache.invalidate(tenant=q.get("tenant"), entry_id=q.get("entry"))
        except StoreUnavailable as exc:
            raise OpenAIError(503, f"The cache store is unreachable: {exc}", type="server_error",
                              code="cache_unavailable") from None
        return JSONResponse({"ok": True, "removed": n})


def _capacity_of(tier, pool: Pool):
    fixed = getattr(tier, "max_concurrency", None)
    if fixed:
        return lambda: fixed
    # No explicit cap: the tier is saturated when every slot of every healthy backend is busy, plus a queue
    # of the same size at the backends themselves (they batch; a little queueing there keeps them full).
    return lambda: max(1, 2 * sum(ep.slots for ep in pool.endpoints()))


def _with_cap(decision: Decision, cap: int) -> Decision:
    import dataclasses

    return dataclasses.replace(decision, max_tokens_cap=cap)


@dataclass(slots=True)
class _Relay:
    """How a relayed stream ended: 200 done, 502 the backend broke, 499 (until it ends) the client left first."""

    acc: StreamAccumulator
    status: int = 499


class _Stream(StreamingResponse):
    """A streaming response whose clean-up runs however the stream ends (done, broken, or the client gone).

    The clean-up runs after the terminating chunk has been sent, so a client does not wait for accounting.
    """

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]], **kw: object) -> None:
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with contextlib.suppress(Exception):
                await self.body_iterator.aclose()
            await self._on_close()


class _DisconnectWatch:
    """Cancels a request's handler task if its client disconnects; `fired` says it did.

    The watching task starts only once the request has taken `after_s`: most answers that come that fast
    are over before a disconnect could matter, and a timer costs a fraction of a task (the gateway's whole
    budget is under a millisecond per request). It reads the ASGI channel, whose next message after the
    body is the disconnect (or the end of the response, by which time the watch is closed).
    """

    __slots__ = ("_receive", "_task", "_timer", "_watcher", "fired")

    def __init__(self, receive: Callable[[], Awaitable[dict]], task: asyncio.Task, after_s: float = 0.05) -> None:
        self._receive, self._task = receive, task
        self._watcher: asyncio.Task | None = None
        self.fired = False
        self._timer = asyncio.get_running_loop().call_later(after_s, self._start)

    def _start(self) -> None:
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        for _ in range(8):  # a server that sends more (empty) body messages is not waited on for ever
            if (await self._receive())["type"] == "http.disconnect":
                self.fired = True
                self._task.cancel()
                return

    def close(self) -> None:
        self._timer.cancel()
        if self._watcher is not None:
            self._watcher.cancel()


async def _iterate(items: list[bytes]) -> AsyncIterator[bytes]:
    for item in items:
        yield item


def _tune_gc() -> None:
    """Keep the cyclic garbage collector off the request path's back.

    What start-up loaded (tokenizer vocabularies, the compiled complexity trees, the policy: ~70k objects) lives
    as long as the process, so it is frozen out of every later collection (a full one took 22 ms), and the
    youngest generation is collected every 20k allocations rather than every 700, i.e. every few dozen
    requests instead of every other one. Measured with `bench.overhead.inprocess --gap-ms 5`: p90 1.24-1.34 ms
    against 1.58-1.59 ms with the defaults (docs/benchmarks.md).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def _keyring_from(settings: Settings) -> KeyRing:
    """The key file, else the inline keys, else the public demo key if allowed, else no key at all (all 401)."""
    if settings.api_keys_file:
        return KeyRing.from_file(settings.api_keys_file)
    if settings.api_keys:
        return KeyRing.from_inline(settings.api_keys)
    if settings.demo_key:
        return KeyRing.demo()
    log.warning("no_api_keys", message="no API keys configured and TIERGATE_DEMO_KEY is false: every request "
                                       "will be refused (set TIERGATE_API_KEYS_FILE or TIERGATE_API_KEYS)")
    return KeyRing({})


def create_app(settings: Settings | None = None, *, keyring: KeyRing | None = None) -> Starlette:
    """Build the Starlette app around one Gateway; `app.state.gateway` exposes it to tests and tools."""
    settings = settings or Settings()
    configure_logging(settings.log_format, settings.log_level)
    gw = Gateway(settings, keyring=keyring)

    async def chat(request: Request) -> Response:
        return await gw.completion(request, "chat")

    async def completions(request: Request) -> Response:
        return await gw.completion(request, "text")

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def readyz(request: Request) -> Response:
        ok, detail = gw.ready()
        return JSONResponse(detail, status_code=200 if ok else 503)

    async def metrics_endpoint(request: Request) -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    async def openapi(request: Request) -> Response:
        from gateway.openapi import openapi_document

        return Response(openapi_document(), media_type=_JSON)

    def guarded(handler):
        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except OpenAIError as exc:
                return Response(exc.to_json(), status_code=exc.status, media_type=_JSON, headers=exc.headers)
            except ClientDisconnect:  # gone while sending its body: nobody to answer
                return Response(status_code=499)

        return run

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        await gw.startup()
        try:
            yield
        finally:
            await gw.shutdown()

    routes = [
        HttpRoute("/v1/chat/completions", chat, methods=["POST"]),
        HttpRoute("/v1/completions", completions, methods=["POST"]),
        HttpRoute("/v1/models", guarded(gw.list_models), methods=["GET"]),
        HttpRoute("/healthz", healthz, methods=["GET"]),
        HttpRoute("/readyz", readyz, methods=["GET"]),
        HttpRoute("/metrics", metrics_endpoint, methods=["GET"]),
        HttpRoute("/openapi.json", openapi, methods=["GET"]),
        HttpRoute("/edge/v1/heartbeat", guarded(gw.edge_heartbeat), methods=["POST"]),
        HttpRoute("/edge/v1/deregister", guarded(gw.edge_deregister), methods=["POST"]),
        HttpRoute("/admin/policy/reload", guarded(gw.admin_reload), methods=["POST"]),
        HttpRoute("/admin/cache/invalidate", guarded(gw.admin_cache_invalidate), methods=["POST"]),
        *gw.dashboard.routes(),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        404: _not_found_handler, 405: _method_handler, 500: _internal_handler})
    app.state.gateway = gw
    return app


async def _not_found_handler(request: Request, exc: Exception) -> Response:
    err = not_found(f"No route {request.method} {request.url.path}. See /openapi.json.", code="unknown_url")
    return Response(err.to_json(), status_code=404, media_type=_JSON)


async def _method_handler(request: Request, exc: Exception) -> Response:
    err = OpenAIError(405, f"Method {request.method} is not allowed on {request.url.path}.", code="method_not_allowed")
    return Response(err.to_json(), status_code=405, media_type=_JSON)


async def _internal_handler(request: Request, exc: Exception) -> Response:
    log.error("internal_error", path=request.url.path, exc_info=exc)
    err = OpenAIError(500, "Internal error in the gateway; it has been logged.", type="server_error",
                      code="internal_error")
    return Response(err.to_json(), status_code=500, media_type=_JSON)
