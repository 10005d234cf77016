"""Writing the answer back: a cached answer, a backend's JSON answer, or its SSE stream relayed as it comes.

Backend bytes go to the client untouched; they are only read on the side (`gateway.render`) for usage, the cache
and metrics. What an answer still owes once the client has it is the request's `Settlement`, called after its
last byte: the response's background task, or the stream's close hook.

Tested in `tests/gateway/test_settlement.py`, `tests/gateway/test_app.py` and `tests/gateway/test_first_token.py`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import msgspec
import structlog
from starlette.background import BackgroundTask, BackgroundTasks
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from tiergate.cache.types import CacheHit
from tiergate.core.errors import OpenAIError
from tiergate.core.http import DONE, sse
from tiergate.gateway.context import Outcome, RequestContext, answer_headers
from tiergate.gateway.dispatch import Attempt, shutting_down
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.render import (
    StreamAccumulator,
    cacheable,
    render_json,
    render_sse,
    summarize,
)
from tiergate.gateway.settlement import Settlement
from tiergate.gateway.upstream import FailureKind, UpstreamFailure
from tiergate.policies.costs import format_cost

__all__ = ["Relay", "ShadowStarter", "read_whole"]

log = structlog.get_logger("tiergate.gateway")
_JSON = "application/json"
_SSE = "text/event-stream"
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class ShadowStarter(Protocol):
    """Where a cache hit sampled for verification goes once it was served (`gateway.shadow.ShadowChecks`)."""

    async def start(self, ctx: RequestContext, outcome: Outcome) -> None: ...


class Relay:
    """The three ways an answer reaches the client; each one ends in the request's settlement."""

    def __init__(self, metrics: GatewayMetrics, shadow: ShadowStarter) -> None:
        self._metrics = metrics
        self._shadow = shadow

    # ---- from the cache ---------------------------------------------------------------------------------------

    def cached(self, ctx: RequestContext, outcome: Outcome, hit: CacheHit, settle: Settlement) -> Response:
        overhead = time.perf_counter() - ctx.arrival.started
        headers = answer_headers(ctx, outcome, "cache", overhead)
        # Settled after the answer has gone out (a background task), so the client does not wait for it.
        task = BackgroundTasks()
        task.add_task(settle.hit, ctx, outcome, hit, overhead)
        if outcome.shadow_check:  # sampled for verification: the request goes to a tier too (gateway.shadow)
            task.add_task(self._shadow.start, ctx, outcome)
        self._metrics.tokens.labels("cache", "completion").inc(hit.answer.completion_tokens)
        if not ctx.req.stream and (cost := settle.quote(ctx, "cache", 0, 0)) is not None:
            headers["x-tiergate-cost"] = format_cost(cost)
        if ctx.req.stream:
            include_usage = bool(ctx.req.stream_options and ctx.req.stream_options.include_usage)
            cost = settle.quote(ctx, "cache", 0, 0) if include_usage and _stream_cost(ctx, outcome) else None
            events = render_sse(hit.answer, include_usage, cost=cost)
            return StreamingResponse(_iterate(events), media_type=_SSE, headers=headers | _SSE_HEADERS,
                                     background=task)
        return Response(render_json(hit.answer), media_type=_JSON, headers=headers, background=task)

    # ---- a backend's JSON answer --------------------------------------------------------------------------------

    async def json(self, ctx: RequestContext, outcome: Outcome, attempt: Attempt, settle: Settlement) -> Response:
        body, upstream_s = await read_whole(attempt, self._metrics)
        return self.answer(ctx, outcome, attempt.tier, body, upstream_s, settle, attempt.fallback_from)

    def answer(self, ctx: RequestContext, outcome: Outcome, tier: str, body: bytes, upstream_s: float,
               settle: Settlement, fallback_from: str | None = None) -> Response:
        """A backend's whole JSON answer, already read: relayed as it is, settled after it went out."""
        try:
            summary = summarize(body)
        except (msgspec.ValidationError, msgspec.DecodeError):
            raise OpenAIError(502, f"Tier `{tier}` returned a malformed answer.", type="upstream_error",
                              code="upstream_protocol") from None
        if summary.error is not None:  # a 200 that is an error: the client gets an error, the cache nothing
            raise OpenAIError(502, f"Tier `{tier}` answered with an error: {summary.error}", type="upstream_error",
                              code="upstream_error")
        overhead = time.perf_counter() - ctx.arrival.started - upstream_s
        headers = answer_headers(ctx, outcome, tier, overhead)
        if fallback_from:
            headers["x-tiergate-fallback-from"] = fallback_from
        cost = settle.quote(ctx, tier, summary.prompt_tokens, summary.completion_tokens, summary.cached_tokens)
        if cost is not None:  # the request's cost under its policy: the answer plus a cascade's thrown-away attempt
            headers["x-tiergate-cost"] = format_cost(cost)
        store = cacheable(summary, ctx.req.kind, tier) if outcome.cache == "miss" else None
        whole = summary.finish_reason in ("stop", "length") and not summary.multi_choice
        if outcome.pair is not None:  # the edge answered too, unseen: compared off the request path
            outcome.pair.cloud(summary.text if whole else None, tier)
        task = BackgroundTask(settle.answered, ctx, outcome, tier, 200, overhead, summary.prompt_tokens,
                              summary.completion_tokens, elapsed=time.perf_counter() - ctx.arrival.started,
                              store=store, distill=(summary.text, summary.model) if whole else None,
                              cached_tokens=summary.cached_tokens)
        return Response(body, media_type=_JSON, headers=headers, background=task)

    # ---- a backend's stream -------------------------------------------------------------------------------------

    def stream(self, ctx: RequestContext, outcome: Outcome, attempt: Attempt, settle: Settlement, *,
               transform: Callable[[bytes], bytes] | None = None) -> Response:
        """The stream as a response that owns what the request holds from here on and settles however it ends.

        A cascade hands over a stream it has already read into (`attempt.first` then holds every batch it
        read, concatenated) and a `transform` that takes out the log-probabilities it asked for on its own."""
        req, metrics = ctx.req, self._metrics
        client_wants_usage = bool(req.stream_options and req.stream_options.include_usage)
        overhead = attempt.upstream_started - ctx.arrival.started
        headers = answer_headers(ctx, outcome, attempt.tier, overhead) | _SSE_HEADERS
        if attempt.fallback_from:
            headers["x-tiergate-fallback-from"] = attempt.fallback_from
        metrics.ttft.labels(attempt.tier).observe(max(attempt.first_at, attempt.upstream_started)
                                                  - ctx.arrival.started)
        relay = _Relayed(StreamAccumulator())
        outcome.streaming = True

        async def on_close() -> None:
            """Runs however the stream ended (done, broken, the client gone), after its last byte went out."""
            attempt.response.close()
            attempt.finish(ok=relay.status != 502)  # no-op when the relay finished it; a client leaving is no fault
            ctx.held.release()
            if relay.status == 499:  # the client went away; closing the response stopped the generation upstream
                metrics.disconnects.labels(attempt.tier).inc()
            acc, done = relay.acc, relay.status == 200
            prompt_tokens, completion_tokens = acc.prompt_tokens, acc.completion_tokens
            if not (prompt_tokens or completion_tokens):
                # No usage chunk (the stream broke or the client left first), yet the backend did the work:
                # charge our own prompt count and one token per content chunk, which is how backends stream.
                prompt_tokens, completion_tokens = ctx.features.prompt_tokens, len(acc.parts)
            store = cacheable(acc, req.kind, attempt.tier) if done and outcome.cache == "miss" else None
            whole = done and acc.finish_reason in ("stop", "length") and not acc.multi_choice
            if outcome.pair is not None:
                outcome.pair.cloud(acc.text if whole else None, attempt.tier)
            await settle.answered(ctx, outcome, attempt.tier, relay.status, overhead, prompt_tokens,
                                  completion_tokens, store=store, distill=(acc.text, acc.model) if whole else None,
                                  cached_tokens=acc.cached_tokens)

        def cost() -> float | None:  # the stream's cost, once its usage chunk has come
            acc = relay.acc
            return settle.quote(ctx, attempt.tier, acc.prompt_tokens, acc.completion_tokens, acc.cached_tokens)

        priced = cost if client_wants_usage and _stream_cost(ctx, outcome) else None
        return _Stream(self._events(ctx, attempt, relay, client_wants_usage, transform, priced), on_close,
                       media_type=_SSE, headers=headers)

    async def _events(self, ctx: RequestContext, attempt: Attempt, relay: _Relayed, client_wants_usage: bool,
                      transform: Callable[[bytes], bytes] | None,
                      cost: Callable[[], float | None] | None = None) -> AsyncGenerator[bytes, None]:
        """Relay the backend's chunks, then `[DONE]`; a backend failing mid-stream ends in an SSE error event.
        Given `cost`, the usage chunk carries the request's cost (`usage.cost`)."""
        acc = relay.acc
        try:
            batch = attempt.first
            while batch is not None:
                out = []
                for payload in batch:
                    if payload == b"[DONE]":
                        relay.status = 200 if acc.error is None else 502  # an error frame: not a whole answer
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
                    if client_wants_usage:
                        if usage_only and cost is not None:
                            payload = _with_cost(payload, cost())
                        out.append(sse(payload))
                    elif not usage_only:
                        out.append(sse(_without_null_usage(payload)))
                if out:
                    yield b"".join(out)
                batch = await attempt.next_events()
            raise UpstreamFailure(f"{attempt.endpoint.id} ended the stream without [DONE]", kind=FailureKind.STREAM)
        except UpstreamFailure as f:
            if attempt.aborted is not None:  # the gateway is shutting down: no backend's fault
                relay.status = 503
                attempt.finish()
                yield sse(shutting_down(attempt.aborted).to_json()) + DONE
                return
            relay.status = 502
            attempt.finish(ok=False)
            metrics = self._metrics
            metrics.stream_errors.labels(attempt.tier).inc()
            metrics.upstream_errors.labels(attempt.tier, f.kind).inc()
            log.warning("stream_broken", request_id=ctx.request_id, tier=attempt.tier, endpoint=attempt.endpoint.id,
                        error=str(f))
            err = OpenAIError(502, f"Tier `{attempt.tier}` failed mid-stream: {f}", type="upstream_error",
                              code=f"upstream_{f.kind}")
            yield sse(err.to_json()) + DONE

_NULL_USAGE_TAIL = b',"usage":null}'


def _stream_cost(ctx: RequestContext, outcome: Outcome) -> bool:
    """Whether a stream's usage chunk carries its cost: unless the request said `x-tiergate-cost: off` or the
    policy `budgets.stream_cost: false`."""
    budgets = ctx.policy.budgets
    return outcome.stream_cost and (budgets is None or budgets.stream_cost)


def _with_cost(payload: bytes, cost: float | None) -> bytes:
    """A usage chunk with `usage.cost` added (OpenRouter's spelling; OpenAI's SDKs keep unknown fields): a number
    in the policy's currency. Left as it is when unpriced or not an object with a usage object."""
    if cost is None:
        return payload
    try:
        obj = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        return payload
    if not isinstance(obj, dict) or not isinstance(obj.get("usage"), dict):
        return payload
    obj["usage"]["cost"] = cost
    return msgspec.json.encode(obj)


def _without_null_usage(payload: bytes) -> bytes:
    """A chunk without the `"usage": null` that a backend adds to every chunk because the gateway asked it for
    usage (`stream_options.include_usage`): a client that did not ask gets no `usage` field, as from OpenAI.
    The common spelling (msgspec, orjson: last key, no spaces) is cut from the bytes; another is re-encoded."""
    if payload.endswith(_NULL_USAGE_TAIL):
        return payload[:-len(_NULL_USAGE_TAIL)] + b"}"
    if b'"usage"' not in payload:
        return payload
    try:
        obj = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        return payload
    if not isinstance(obj, dict) or "usage" not in obj or obj["usage"] is not None:
        return payload
    del obj["usage"]
    return msgspec.json.encode(obj)


async def read_whole(attempt: Attempt, metrics: GatewayMetrics) -> tuple[bytes, float]:
    """A backend's whole JSON body and the seconds it took, or the OpenAIError its failure is for a client;
    the attempt is finished either way."""
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


@dataclass(slots=True)
class _Relayed:
    """How a relayed stream ended: 200 done, 502 the backend broke, 499 (until it ends) the client left first."""

    acc: StreamAccumulator
    status: int = 499


class _Stream(StreamingResponse):
    """A streaming response whose clean-up runs however the stream ends (done, broken, or the client gone).

    The clean-up runs after the terminating chunk has been sent, so a client does not wait for accounting.
    """

    def __init__(self, content: AsyncGenerator[bytes, None], on_close: Callable[[], Awaitable[None]], *,
                 media_type: str, headers: Mapping[str, str]) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self._content = content
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with contextlib.suppress(Exception):
                await self._content.aclose()
            await self._on_close()


async def _iterate(items: list[bytes]) -> AsyncIterator[bytes]:
    for item in items:
        yield item
