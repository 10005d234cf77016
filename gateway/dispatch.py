"""Dispatch: a Decision becomes an open upstream response, trying tiers and endpoints in order.

Within a tier, endpoints are tried best first; a failure that reached nobody yet (connection refused,
timeout before the first token, 5xx, a backend its pool declared lost while the request waited on it) moves
to the next endpoint, then to the next tier in the decision's fallbacks, within the request's total time. A backend saying it cannot serve the request (too long for its context, a feature
it lacks) moves straight to the next tier; its verdict on the request itself (a 400) is the answer. A saturated tier is waited on in priority order for at most the policy's queue
time, then overflowed. What comes back holds its admission slot until `finish()`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from tiergate.core import tracing
from tiergate.core.errors import OpenAIError, rate_limited, upstream_error
from tiergate.core.pool import Endpoint
from tiergate.core.types import Decision, Features, Timeouts
from tiergate.core.wire import ParsedRequest, decode_json
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.tiers import Tier
from tiergate.gateway.upstream import FailureKind, UpstreamClient, UpstreamFailure, UpstreamResponse

__all__ = ["Attempt", "Body", "Dispatcher", "shutting_down"]

MAX_ENDPOINTS_PER_TIER = 3
_error_body = msgspec.json.Decoder()


class Body(Protocol):
    """What dispatch posts (`context.UpstreamBody`): asked for per endpoint, and told when it was posted, so the
    caller knows afterwards whether a backend got the request without dispatch calling back into it."""

    def for_endpoint(self, ep: Endpoint) -> bytes: ...

    def mark_sent(self) -> None: ...


class Span(Protocol):
    """The part of an OpenTelemetry span an Attempt uses (or `tracing.NULL` when tracing is off)."""

    def end(self) -> None: ...


@dataclass(slots=True, eq=False)
class Attempt:
    """A backend that accepted the request; `finish()` must be called exactly once when the answer is over."""

    tier: str
    endpoint: Endpoint
    response: UpstreamResponse
    route: Tier
    metrics: GatewayMetrics
    upstream_started: float  # perf_counter when the request went to the backend
    fallback_from: str | None = None
    events: AsyncIterator[list[bytes]] | None = None  # streaming: the rest of the stream, after `first`
    first: list[bytes] | None = None  # streaming: the events up to the first token, read before the client got any
    first_at: float = 0.0  # perf_counter when the first token arrived (the TTFT metric)
    aborted: str | None = None  # why the gateway cut it short (it is shutting down), if it did
    live: set[Attempt] | None = None  # the dispatcher's answers in progress, which this one leaves when finished
    span: Span = tracing.NULL  # the "relay" span: from the answer's beginning to its end
    _done: bool = field(default=False)

    def abort(self, reason: str) -> None:
        """End the answer now: closing the upstream connection stops the generation, and the relay, reading
        `aborted`, ends the answer with an explicit error rather than a cut connection."""
        self.aborted = reason
        self.response.close()

    async def next_events(self) -> list[bytes] | None:
        """A stream's next batch of events after `first`; None once it has ended."""
        return None if self.events is None else await anext(self.events, None)

    def finish(self, ok: bool = True) -> None:
        if self._done:
            return
        self._done = True
        if self.live is not None:
            self.live.discard(self)
        self.span.end()
        self.endpoint.inflight -= 1
        _give_back(self.route, self.metrics)
        if not ok:
            self.route.pool.report(self.endpoint, False)


class Dispatcher:
    def __init__(self, upstream: UpstreamClient, tiers: Mapping[str, Tier], metrics: GatewayMetrics) -> None:
        self._upstream = upstream
        self._tiers = tiers  # a live view: pools change when the policy is reloaded
        self._metrics = metrics
        self._live: set[Attempt] = set()  # answers in progress (a stream being relayed, a JSON body being read)
        self._waiting: set[_LostWatch] = set()  # requests waiting for a backend's answer to begin
        self.closing: str | None = None  # set by `abort_all`: the gateway is shutting down

    def abort_all(self, reason: str) -> int:
        """The gateway is shutting down and its graceful time is almost over: every request still waiting on a
        backend, and every answer still in progress, ends now with an explicit error (a 503, or an SSE error event
        then `[DONE]` for a stream that has begun) rather than a connection cut when the server gives up on it.
        Returns how many were ended."""
        self.closing = reason
        waiting, live = list(self._waiting), list(self._live)
        for watch in waiting:
            watch(reason, shutdown=True)
        for attempt in live:
            attempt.abort(reason)
        return len(waiting) + len(live)

    async def open(self, *, request: ParsedRequest, features: Features, decision: Decision, path: str,
                   body: Body, request_id: str, stream: bool) -> Attempt:
        """`_open` in the request's trace: a "dispatch" span, then a "relay" span the Attempt ends."""
        if not tracing.enabled():
            return await self._open(request=request, features=features, decision=decision, path=path,
                                    body=body, request_id=request_id, stream=stream)
        with tracing.span("dispatch", **{"tiergate.tiers": list(decision.tiers)}):
            attempt = await self._open(request=request, features=features, decision=decision, path=path,
                                       body=body, request_id=request_id, stream=stream)
        attempt.span = tracing.start("relay", **{"tiergate.tier": attempt.tier,
                                                 "tiergate.endpoint": attempt.endpoint.id})
        return attempt

    async def _open(self, *, request: ParsedRequest, features: Features, decision: Decision, path: str,
                    body: Body, request_id: str, stream: bool) -> Attempt:
        """Return the first backend that accepts the request, or raise the most telling OpenAIError.

        For a stream, the first token is read here (with the role-only frames before it, held:
        `UpstreamResponse.events`), so that a backend failing before its first token is still retried
        elsewhere: nothing has reached the client yet.
        """
        routes, metrics = self._tiers, self._metrics
        failures: list[OpenAIError] = []  # one per tier tried, so the final error can say what happened where
        budget = _Budget(decision.timeouts)
        previous: str | None = None
        tiers = decision.tiers
        for i, tier in enumerate(tiers):
            route = routes.get(tier)
            if route is None:
                continue
            if previous is not None:
                metrics.fallbacks.labels(previous, tier, failures[-1].code if failures else "unavailable").inc()
            previous = tier
            candidates = route.pool.candidates(request, features)[:MAX_ENDPOINTS_PER_TIER]
            if not candidates:
                failures.append(upstream_error(503, f"No healthy backend in tier `{tier}`.", code="tier_unavailable",
                                               retry_after_s=1))
                continue
            metrics.child(metrics.queued, tier).inc()
            try:
                admitted = await route.admission.acquire(features.priority, decision.timeouts.queue_s)
            finally:
                metrics.child(metrics.queued, tier).dec()
            if not admitted:
                metrics.shed.labels(tier, features.priority.name.lower()).inc()
                failures.append(rate_limited(f"Tier `{tier}` is saturated; retry shortly.", decision.timeouts.queue_s,
                                             code="tier_saturated"))
                continue
            metrics.child(metrics.inflight, tier).inc()
            last: OpenAIError | None = None
            for ep in candidates:
                try:
                    if self.closing is not None:
                        raise UpstreamFailure(self.closing, kind=FailureKind.SHUTDOWN, status=503, retryable=False)
                    timeouts = budget.left()
                except UpstreamFailure as f:  # retries ate the request's total time, or the gateway is closing
                    _give_back(route, metrics)
                    raise _failure_error(tier, f) from None
                ep.inflight += 1
                started = time.perf_counter()
                try:
                    data = body.for_endpoint(ep)
                    body.mark_sent()  # from here on a backend may be working on it
                    resp, events, first, first_at = await self._attempt(ep, path, data, timeouts, request_id, stream)
                except UpstreamFailure as f:
                    ep.inflight -= 1
                    if f.kind is FailureKind.SHUTDOWN:  # no backend's fault: nothing to report, nothing to retry
                        _give_back(route, metrics)
                        raise _failure_error(tier, f) from None
                    metrics.upstream_errors.labels(tier, f.kind).inc()
                    if f.kind is FailureKind.CAPABILITY and any(t in routes for t in tiers[i + 1:]):
                        # This tier cannot serve it (context too short, a feature missing): a later one may.
                        # The endpoint is fine and the same tier's others are alike, so on to the next tier.
                        last = _client_error_from(f, f"Tier `{tier}` cannot serve this request: ")
                        break
                    # the backend judged the request: pass its verdict on
                    if f.kind in (FailureKind.HTTP_4XX, FailureKind.CAPABILITY):
                        _give_back(route, metrics)
                        raise _client_error_from(f) from None
                    route.pool.report(ep, False)
                    last = upstream_error(f.status, f"Tier `{tier}`: {f}", code=f"upstream_{f.kind}")
                    if not f.retryable:  # the request's time is spent: nothing else gets to try
                        _give_back(route, metrics)
                        raise last from None
                    continue
                except BaseException:  # cancelled (client gone) or a bug: give everything back, blame no one
                    ep.inflight -= 1
                    _give_back(route, metrics)
                    raise
                route.pool.report(ep, True)
                attempt = Attempt(tier, ep, resp, route, metrics, started,
                                  fallback_from=decision.tier if tier != decision.tier else None,
                                  events=events, first=first, first_at=first_at, live=self._live)
                self._live.add(attempt)
                return attempt
            _give_back(route, metrics)
            if last is not None:
                failures.append(last)
        if not failures:
            raise upstream_error(503, "No tier is available for this request.", code="no_tier_available",
                                 retry_after_s=1)
        final = failures[-1]
        if len(failures) > 1:  # say what happened in every tier, keep the last one's status and code
            final = OpenAIError(final.status, " ".join(e.message for e in failures), type=final.type,
                                code=final.code, headers=final.headers)
        raise final

    async def _attempt(self, ep: Endpoint, path: str, body: bytes, timeouts: Timeouts, request_id: str,
                       stream: bool) -> tuple[UpstreamResponse, AsyncIterator[list[bytes]] | None, list[bytes] | None,
                                          float]:
        """Post to one backend and wait for its answer to begin: a JSON answer's headers (sent once it is
        generated), a stream's first token. While waiting, the request is on the endpoint's `waiting` list: when
        the pool's health check finds the backend unreachable or hung (`Endpoint.declare_lost`), the wait ends
        in a retryable `lost` failure, and the request is tried elsewhere while its time lasts."""
        task = asyncio.current_task()
        assert task is not None
        watch = _LostWatch(task)
        ep.waiting.add(watch)
        self._waiting.add(watch)
        resp: UpstreamResponse | None = None
        span = (tracing.span("upstream", **{"tiergate.tier": ep.tier, "tiergate.endpoint": ep.id})
                if tracing.enabled() else tracing.NULL)
        try:
            with span as s:  # the span current while posting: the backend continues the trace from it
                try:
                    resp = await self._upstream.post(ep, path, body, timeouts, request_id, stream=stream)
                    if not stream:
                        return resp, None, None, 0.0
                    events = resp.events()
                    first = await anext(events, None)
                    return resp, events, first, time.perf_counter()
                except UpstreamFailure as f:
                    s.set_attribute("tiergate.failure", f.kind)
                    raise
        except asyncio.CancelledError:
            _discard(resp)
            if watch.reason is None or task.uncancel() > 0:
                raise  # the client left, or the server gave up on the request
            if watch.shutdown:
                raise UpstreamFailure(watch.reason, kind=FailureKind.SHUTDOWN, status=503, retryable=False) from None
            raise UpstreamFailure(f"{ep.id} stopped answering its health checks before the answer began "
                                  f"({watch.reason})", kind=FailureKind.LOST, status=504) from None
        except BaseException:
            _discard(resp)
            raise
        finally:
            ep.waiting.discard(watch)
            self._waiting.discard(watch)


def _failure_error(tier: str, f: UpstreamFailure) -> OpenAIError:
    if f.kind is FailureKind.SHUTDOWN:
        return shutting_down(str(f))
    return upstream_error(504, f"Tier `{tier}`: {f}", code="upstream_timeout")


def shutting_down(reason: str) -> OpenAIError:
    """The answer to a request the gateway cannot finish because it is shutting down: retry elsewhere."""
    return OpenAIError(503, f"The gateway is shutting down ({reason}); retry the request.", type="server_error",
                       code="shutting_down", headers={"retry-after": "1"})


class _LostWatch:
    """Cancels the request's task when its backend is declared lost (or the gateway is shutting down);
    `reason` says it did (see `_attempt`)."""

    __slots__ = ("_task", "reason", "shutdown")

    def __init__(self, task: asyncio.Task[object]) -> None:
        self._task = task
        self.reason: str | None = None
        self.shutdown = False

    def __call__(self, reason: str, shutdown: bool = False) -> None:
        if self.reason is None and not self._task.done():
            self.reason, self.shutdown = reason, shutdown
            self._task.cancel()


class _Budget:
    """The request's total time, across every attempt: a retry gets what is left of it, not a fresh total."""

    __slots__ = ("_deadline", "_timeouts")

    def __init__(self, timeouts: Timeouts) -> None:
        self._timeouts = timeouts
        self._deadline = time.monotonic() + timeouts.total_s

    def left(self) -> Timeouts:
        left = self._deadline - time.monotonic()
        if left >= self._timeouts.total_s - 0.001:
            return self._timeouts  # the first attempt: nothing to change
        if left <= 0:
            raise UpstreamFailure(f"the request's total time ({self._timeouts.total_s:g}s) is spent",
                                  kind=FailureKind.TIMEOUT, status=504, retryable=False)
        return dataclasses.replace(self._timeouts, total_s=left)


def _give_back(route: Tier, metrics: GatewayMetrics) -> None:
    """Free the tier slot an attempt held (admission and the in-flight gauge move together)."""
    route.admission.release()
    metrics.child(metrics.inflight, route.name).dec()


def _discard(resp: UpstreamResponse | None) -> None:
    """Drop a response that will not be used; closing its connection stops the generation upstream."""
    if resp is not None:
        resp.close()


def _client_error_from(f: UpstreamFailure, prefix: str = "") -> OpenAIError:
    """Relay a backend's own 4xx (e.g. prompt longer than its context) in the OpenAI format."""
    message, code = str(f), "upstream_rejected"
    if f.body:
        try:
            err = decode_json(_error_body, f.body).get("error", {})
            if isinstance(err, dict):
                message = str(err.get("message") or message)
                code = str(err.get("code") or code)
            elif isinstance(err, str):
                message = err
        except (msgspec.DecodeError, AttributeError):
            pass
    return OpenAIError(f.status, prefix + message, code=code)
