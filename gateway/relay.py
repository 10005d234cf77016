"""Writing the answer back: a cached answer, a backend's JSON answer, or its SSE stream relayed as it comes.

Backend bytes go to the client untouched; they are only read on the side (`gateway.render`) for usage, the cache
and metrics. What an answer still owes once the client has it (accounting, the token charge, the cache store)
runs after its last byte: the response's background task, or the stream's close hook.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import structlog
from starlette.background import BackgroundTask, BackgroundTasks
from starlette.responses import Response, StreamingResponse

from tiergate.cache.types import CachedAnswer, CacheHit
from tiergate.core.errors import OpenAIError
from tiergate.core.http import DONE, sse
from tiergate.gateway.context import Outcome, RequestContext, answer_headers
from tiergate.gateway.dispatch import Attempt, shutting_down
from tiergate.gateway.render import (
    AnswerSummary,
    StreamAccumulator,
    cacheable,
    render_json,
    render_sse,
    summarize,
)
from tiergate.gateway.upstream import FailureKind, UpstreamFailure

if TYPE_CHECKING:
    from tiergate.gateway.lifecycle import Gateway

__all__ = ["Relay"]

log = structlog.get_logger("tiergate.gateway")
_JSON = "application/json"
_SSE = "text/event-stream"
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class Relay:
    """The three ways an answer reaches the client; each one ends the request's accounting."""

    def __init__(self, gateway: Gateway) -> None:
        self._gw = gateway

    # ---- from the cache ---------------------------------------------------------------------------------------

    def cached(self, ctx: RequestContext, outcome: Outcome, hit: CacheHit) -> Response:
        overhead = time.perf_counter() - ctx.arrival.started
        headers = answer_headers(ctx, outcome, "cache", overhead)
        # Accounting runs after the answer has gone out (a background task), so the client does not wait for it;
        # so does the record of which entry answered (for POST /v1/cache/feedback).
        task = BackgroundTasks()
        task.add_task(self._gw.accounting.answered, ctx, outcome, "cache", 200, overhead, elapsed=overhead)
        if self._gw.cache is not None:
            task.add_task(self._gw.cache.served, ctx.request_id, ctx.tenant.id, hit)
        if outcome.shadow_check:  # sampled for verification: the request goes to a tier too (gateway.shadow)
            task.add_task(self._gw.shadow.start, ctx, outcome)
        self._gw.metrics.tokens.labels("cache", "completion").inc(hit.answer.completion_tokens)
        if ctx.req.stream:
            include_usage = bool(ctx.req.stream_options and ctx.req.stream_options.include_usage)
            events = render_sse(hit.answer, include_usage)
            return StreamingResponse(_iterate(events), media_type=_SSE, headers=headers | _SSE_HEADERS,
                                     background=task)
        return Response(render_json(hit.answer), media_type=_JSON, headers=headers, background=task)

    # ---- a backend's JSON answer --------------------------------------------------------------------------------

    async def json(self, ctx: RequestContext, outcome: Outcome, attempt: Attempt) -> Response:
        body, upstream_s = await self.whole(attempt)
        return self.answer(ctx, outcome, attempt.tier, body, upstream_s, attempt.fallback_from)

    async def whole(self, attempt: Attempt) -> tuple[bytes, float]:
        """A backend's whole JSON body and the seconds it took, or the OpenAIError its failure is for a client;
        the attempt is finished either way."""
        metrics = self._gw.metrics
        try:
            body = await attempt.response.read()
            attempt.response.release()
            if attempt.aborted is not None:  # the gateway closed it: what was read may be cut short
                raise UpstreamFailure(attempt.aborted, kind=FailureKind.SHUTDOWN)
        except UpstreamFailure as f:
            attempt.response.close()
            if attempt.aborted is not None:
                attempt.finish()
                raise shutting_down(attempt.aborted) from None
            attempt.finish(ok=False)
            metrics.upstream_errors.labels(attempt.tier, f.kind).inc()
            raise OpenAIError(f.status, f"Tier `{attempt.tier}`: {f}", type="upstream_error",
                              code=f"upstream_{f.kind}") from None
        except BaseException:  # cancelled: the client left (or shutdown); closing stops the generation
            attempt.response.close()
            attempt.finish()
            raise
        upstream_s = time.perf_counter() - attempt.upstream_started
        attempt.finish()
        return body, upstream_s

    def answer(self, ctx: RequestContext, outcome: Outcome, tier: str, body: bytes, upstream_s: float,
               fallback_from: str | None = None) -> Response:
        """A backend's whole JSON answer, already read: relayed as it is, settled after it went out."""
        try:
            summary = summarize(body)
        except (msgspec.ValidationError, msgspec.DecodeError):
            raise OpenAIError(502, f"Tier `{tier}` returned a malformed answer.", type="upstream_error",
                              code="upstream_protocol") from None
        overhead = time.perf_counter() - ctx.arrival.started - upstream_s
        headers = answer_headers(ctx, outcome, tier, overhead)
        if fallback_from:
            headers["x-tiergate-fallback-from"] = fallback_from
        answer = cacheable(summary, ctx.req.kind, tier) if outcome.cache == "miss" else None
        task = BackgroundTask(self._after_json, ctx, outcome, tier, overhead,
                              time.perf_counter() - ctx.arrival.started, summary, answer)
        return Response(body, media_type=_JSON, headers=headers, background=task)

    async def _after_json(self, ctx: RequestContext, outcome: Outcome, tier: str, overhead: float, elapsed: float,
                          summary: AnswerSummary, answer: CachedAnswer | None) -> None:
        """What a complete JSON answer still owes once the client has it: accounting, token budget, cache store,
        distillation record."""
        await self._gw.accounting.settle(ctx, outcome, tier, overhead, elapsed, summary.prompt_tokens,
                                         summary.completion_tokens)
        if answer is not None:
            await self._store(ctx, outcome, answer)
        if summary.finish_reason in ("stop", "length") and not summary.multi_choice:
            await self._gw.distill.offer(ctx, outcome, tier, summary.text, summary.model)

    # ---- a backend's stream -------------------------------------------------------------------------------------

    def stream(self, ctx: RequestContext, outcome: Outcome, attempt: Attempt, *,
               transform: Callable[[bytes], bytes] | None = None) -> Response:
        """The stream as a response that owns the tenant's slot from here on and settles however it ends.

        A cascade hands over a stream it has already read into (`attempt.first` then holds every batch it
        read, concatenated) and a `transform` that takes out the log-probabilities it asked for on its own."""
        gw, req = self._gw, ctx.req
        client_wants_usage = bool(req.stream_options and req.stream_options.include_usage)
        overhead = attempt.upstream_started - ctx.arrival.started
        headers = answer_headers(ctx, outcome, attempt.tier, overhead) | _SSE_HEADERS
        if attempt.fallback_from:
            headers["x-tiergate-fallback-from"] = attempt.fallback_from
        gw.metrics.ttft.labels(attempt.tier).observe(max(attempt.first_at, attempt.upstream_started)
                                                     - ctx.arrival.started)
        relay = _Relayed(StreamAccumulator())
        outcome.streaming = True

        async def on_close() -> None:
            """Runs however the stream ended (done, broken, the client gone), after its last byte went out."""
            attempt.response.close()
            attempt.finish(ok=relay.status != 502)  # no-op when the relay finished it; a client leaving is no fault
            ctx.slot.release()
            if relay.status == 499:  # the client went away; closing the response stopped the generation upstream
                gw.metrics.disconnects.labels(attempt.tier).inc()
            acc = relay.acc
            prompt_tokens, completion_tokens = acc.prompt_tokens, acc.completion_tokens
            if not (prompt_tokens or completion_tokens):
                # No usage chunk (the stream broke or the client left first), yet the backend did the work:
                # charge our own prompt count and one token per content chunk, which is how backends stream.
                prompt_tokens, completion_tokens = ctx.features.prompt_tokens, len(acc.parts)
            gw.accounting.answered(ctx, outcome, attempt.tier, relay.status, overhead, prompt_tokens,
                                   completion_tokens)
            if relay.status == 200 and outcome.cache == "miss" and (answer := cacheable(acc, req.kind, attempt.tier)):
                await self._store(ctx, outcome, answer)
            await gw.limiter.charge_tokens(ctx.tenant, prompt_tokens + completion_tokens)
            if relay.status == 200 and acc.finish_reason in ("stop", "length") and not acc.multi_choice:
                await gw.distill.offer(ctx, outcome, attempt.tier, acc.text, acc.model)

        return _Stream(self._events(ctx, attempt, relay, client_wants_usage, transform), on_close, media_type=_SSE,
                       headers=headers)

    async def _events(self, ctx: RequestContext, attempt: Attempt, relay: _Relayed, client_wants_usage: bool,
                      transform: Callable[[bytes], bytes] | None) -> AsyncIterator[bytes]:
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
                    if transform is not None:
                        payload = transform(payload)
                    try:
                        usage_only = acc.feed(payload)
                    except (msgspec.ValidationError, msgspec.DecodeError):
                        usage_only = False  # relay what we cannot read; it is the backend's own chunk
                    if not usage_only or client_wants_usage:
                        out.append(sse(payload))
                if out:
                    yield b"".join(out)
                batch = await anext(events, None)
            raise UpstreamFailure(f"{attempt.endpoint.id} ended the stream without [DONE]", kind=FailureKind.STREAM)
        except UpstreamFailure as f:
            if attempt.aborted is not None:  # the gateway is shutting down: no backend's fault
                relay.status = 503
                attempt.finish()
                yield sse(shutting_down(attempt.aborted).to_json()) + DONE
                return
            relay.status = 502
            attempt.finish(ok=False)
            metrics = self._gw.metrics
            metrics.stream_errors.labels(attempt.tier).inc()
            metrics.upstream_errors.labels(attempt.tier, f.kind).inc()
            log.warning("stream_broken", request_id=ctx.request_id, tier=attempt.tier, endpoint=attempt.endpoint.id,
                        error=str(f))
            err = OpenAIError(502, f"Tier `{attempt.tier}` failed mid-stream: {f}", type="upstream_error",
                              code=f"upstream_{f.kind}")
            yield sse(err.to_json()) + DONE

    async def _store(self, ctx: RequestContext, outcome: Outcome, answer: CachedAnswer) -> None:
        cache = self._gw.cache
        if cache is not None:
            await cache.store(ctx.req, ctx.tenant.id, ctx.decision.cache, answer, outcome.cache_key)


@dataclass(slots=True)
class _Relayed:
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


async def _iterate(items: list[bytes]) -> AsyncIterator[bytes]:
    for item in items:
        yield item
