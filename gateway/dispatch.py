"""Dispatch: a Decision becomes an open upstream response, trying tiers and endpoints in order.

Within a tier, endpoints are tried best first; a failure that reached nobody yet (connection refused,
timeout before the first token, 5xx, a backend its pool declared lost while the request waited on it) moves
to the next endpoint, then to the next tier in the decision's fallbacks, within the request's total time. A
backend saying it cannot serve the request (too long for its context, a feature it lacks) moves straight to the
next tier; its verdict on the request itself (a 400) is the answer. A saturated tier is waited on in priority
order for at most the policy's queue time, then overflowed. What comes back holds its admission slot until
`finish()`.

A request a backend broke on (the connection dropped or garbage came back before the answer began, or the node was
lost while it waited) may be a poison that kills whatever serves it: it is tried on one other backend only, and if
that one breaks too, the client gets an explicit error and the request is quarantined (`gateway.quarantine`).
Failures are reported to the pools with the tenant whose request it was: one tenant's requests alone never take
an endpoint out of rotation for everyone (`gateway.pools.breaker`).
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
from tiergate.gateway.quarantine import Quarantine, quarantined
from tiergate.gateway.tiers import Tier
from tiergate.gateway.upstream import FailureKind, UpstreamClient, UpstreamFailure, UpstreamResponse

__all__ = ["Attempt", "Body", "Dispatcher", "shutting_down"]

MAX_ENDPOINTS_PER_TIER = 3
# Failures a backend may have died of, or been wedged by, with the request: the connection dropped or garbage came
# back before the answer began, or the node stopped answering its health checks while the request waited.
_BREAKS = frozenset({FailureKind.PROTOCOL, FailureKind.STREAM, FailureKind.LOST})
_error_body = msgspec.json.Decoder()


class Body(Protocol):
    """What dispatch posts (`context.UpstreamBody`): asked for per endpoint, and told when it was posted, so the
    caller knows afterwards whether a backend got the request without dispatch calling back into it."""

    def for_endpoint(self, ep: Endpoint) -> bytes: ...

    def mark_sent(self) -> None: ...

    def fingerprint(self) -> str: ...


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
    lease: _Lease  # the tier's slot and the endpoint's in-flight count, given back by `finish()`
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
        self.lease.release()
        if not ok:
            self.route.pool.report(self.endpoint, False)


class Dispatcher:
    def __init__(self, upstream: UpstreamClient, metrics: GatewayMetrics, quarantine: Quarantine | None = None) -> None:
        self._upstream = upstream
        self._metrics = metrics
        self._quarantine = quarantine if quarantine is not None else Quarantine()
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

    async def open(self, *, tiers: Mapping[str, Tier], request: ParsedRequest, features: Features,
                   decision: Decision, path: str, body: Body, request_id: str, stream: bool) -> Attempt:
        """`_open` in the request's trace: a "dispatch" span, then a "relay" span the Attempt ends.

        `tiers` are those of the request's own routing version (`gateway.tiers.Routing`), the one it was decided
        under: a reload since then does not move it to pools its decision never named."""
        q = self._quarantine
        if q.active() and q.holds(body.fingerprint()):
            self._metrics.poison.labels("refused").inc()
            raise quarantined(q.ttl_s)
        call = _Call(tiers, request, features, decision, path, body, request_id, stream, _Budget(decision.timeouts))
        if not tracing.enabled():
            return await self._open(call)
        with tracing.span("dispatch", **{"tiergate.tiers": list(decision.tiers)}):
            attempt = await self._open(call)
        attempt.span = tracing.start("relay", **{"tiergate.tier": attempt.tier,
                                                 "tiergate.endpoint": attempt.endpoint.id})
        return attempt

    async def _open(self, call: _Call) -> Attempt:
        """Return the first backend that accepts the request, or raise the most telling OpenAIError.

        For a stream, the first token is read here (with the role-only frames before it, held:
        `UpstreamResponse.events`), so that a backend failing before its first token is still retried
        elsewhere: nothing has reached the client yet.
        """
        metrics, tiers = self._metrics, call.decision.tiers
        failures: list[OpenAIError] = []  # one per tier tried, so the final error can say what happened where
        previous: str | None = None
        for i, tier in enumerate(tiers):
            route = call.tiers.get(tier)
            if route is None:
                continue
            if previous is not None:
                metrics.fallbacks.labels(previous, tier, failures[-1].code if failures else "unavailable").inc()
            previous = tier
            got = await self._try_tier(tier, route, call, later=tuple(t for t in tiers[i + 1:] if t in call.tiers))
            if isinstance(got, Attempt):
                return got
            if got is not None:
                failures.append(got)
        raise _most_telling(failures)

    async def _try_tier(self, tier: str, route: Tier, call: _Call, later: tuple[str, ...]) -> Attempt | OpenAIError | None:
        """One tier: its best endpoints in turn, under one admission slot. Returns the Attempt, or why this tier
        could not serve the request (the next tier is tried); raises what ends the request here and now.

        The slot and the endpoint's in-flight count live in a `_Lease` that the `with` gives back on every way
        out (a failure, a cancellation, a bug) unless an Attempt took it over."""
        candidates = route.pool.candidates(call.request, call.features)[:MAX_ENDPOINTS_PER_TIER]
        if not candidates:
            return upstream_error(503, f"No healthy backend in tier `{tier}`.", code="tier_unavailable",
                                  retry_after_s=1)
        lease = await self._admit(tier, route, call)
        if lease is None:
            return rate_limited(f"Tier `{tier}` is saturated; retry shortly.", call.decision.timeouts.queue_s,
                                code="tier_saturated")
        with lease:
            last: OpenAIError | None = None
            for ep in candidates:
                got = await self._try_endpoint(tier, route, ep, lease, call, later)
                if isinstance(got, Attempt):
                    return got
                last = got.error
                if got.next_tier:
                    break
            return last

    async def _admit(self, tier: str, route: Tier, call: _Call) -> _Lease | None:
        """Wait for one of the tier's slots, in priority order, for at most the policy's queue time; None: shed."""
        metrics = self._metrics
        metrics.child(metrics.queued, tier).inc()
        try:
            admitted = await route.admission.acquire(call.features.priority, call.decision.timeouts.queue_s,
                                                     call.features.tenant)
        finally:
            metrics.child(metrics.queued, tier).dec()
        if not admitted:
            metrics.shed.labels(tier, call.features.priority.name.lower()).inc()
            return None
        return _Lease(route, tier, metrics)  # no await before the caller's `with`: nothing can come in between

    async def _try_endpoint(self, tier: str, route: Tier, ep: Endpoint, lease: _Lease, call: _Call,
                            later: tuple[str, ...]) -> Attempt | _Failed:
        """One endpoint: the Attempt when it accepts, else what its failure means (`_judge`)."""
        if self.closing is not None:
            raise shutting_down(self.closing)
        try:
            timeouts = call.budget.left()
        except UpstreamFailure as f:  # retries ate the request's total time
            raise _failure_error(tier, f) from None
        lease.use(ep)
        started = time.perf_counter()
        try:
            data = call.body.for_endpoint(ep)
            call.body.mark_sent()  # from here on a backend may be working on it
            resp, events, first, first_at = await self._attempt(ep, call.path, data, timeouts, call.request_id,
                                                                call.stream)
        except UpstreamFailure as f:
            return await self._judge(tier, route, ep, f, later, call)
        route.pool.report(ep, True, call.features.tenant)
        decision = call.decision
        attempt = Attempt(tier, ep, resp, route, lease.hand_over(), started,
                          fallback_from=decision.tier if tier != decision.tier else None,
                          events=events, first=first, first_at=first_at, live=self._live)
        self._live.add(attempt)
        return attempt

    async def _judge(self, tier: str, route: Tier, ep: Endpoint, f: UpstreamFailure, later: tuple[str, ...],
                     call: _Call) -> _Failed:
        """What one endpoint's failure means: the next endpoint, the next tier, or (raised) the request's answer."""
        if f.kind is FailureKind.SHUTDOWN:  # no backend's fault: nothing to report, nothing to retry
            raise _failure_error(tier, f) from None
        self._metrics.upstream_errors.labels(tier, f.kind).inc()
        if f.kind is FailureKind.CAPABILITY and later:
            # This tier cannot serve it (context too short, a feature missing): a later one may.
            # The endpoint is fine and the same tier's others are alike, so on to the next tier.
            return _Failed(_client_error_from(f, f"Tier `{tier}` cannot serve this request: "), next_tier=True)
        if f.kind in (FailureKind.HTTP_4XX, FailureKind.CAPABILITY):  # the backend judged the request: its verdict
            raise _client_error_from(f) from None
        route.pool.report(ep, False, call.features.tenant)
        error = upstream_error(f.status, f"Tier `{tier}`: {f}", code=f"upstream_{f.kind}")
        if not f.retryable:  # the request's time is spent: nothing else gets to try
            raise error from None
        if call.broke_one:  # this was the one other backend a request that broke one gets
            if f.kind in _BREAKS:
                await self._quarantine.add(call.body.fingerprint())
                self._metrics.poison.labels("quarantined").inc()
                raise quarantined(self._quarantine.ttl_s) from None
            if f.kind is not FailureKind.CONNECT:  # refused the connection: it never saw the request
                raise error from None
        elif f.kind in _BREAKS:
            call.broke_one = True
            self._metrics.poison.labels("retried").inc()
        return _Failed(error)

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


def _most_telling(failures: list[OpenAIError]) -> OpenAIError:
    """The error for a request no tier could serve: the last tier's status and code, every tier's story."""
    if not failures:
        return upstream_error(503, "No tier is available for this request.", code="no_tier_available",
                              retry_after_s=1)
    final = failures[-1]
    if len(failures) > 1:  # say what happened in every tier, keep the last one's status and code
        final = OpenAIError(final.status, " ".join(e.message for e in failures), type=final.type,
                            code=final.code, headers=final.headers)
    return final


class _Lease:
    """One admission slot of a tier (with its in-flight gauge), and the in-flight count of the endpoint it is
    being used on: whoever holds the lease gives both back, once, by `release()` or leaving its `with`.

    `use` moves the endpoint count from the endpoint tried before (a failed one) to the next; `hand_over` passes
    everything to a new lease (an Attempt's, released by `Attempt.finish`), leaving this one empty."""

    __slots__ = ("_metrics", "_route", "_tier", "endpoint", "held")

    def __init__(self, route: Tier, tier: str, metrics: GatewayMetrics) -> None:
        self._route, self._tier, self._metrics = route, tier, metrics
        self.endpoint: Endpoint | None = None
        self.held = True
        metrics.child(metrics.inflight, tier).inc()

    def use(self, ep: Endpoint | None) -> None:
        """Count the request on `ep` (None: on no endpoint) rather than on the one it was on."""
        if self.endpoint is not None:
            self.endpoint.inflight -= 1
        self.endpoint = ep
        if ep is not None:
            ep.inflight += 1

    def hand_over(self) -> _Lease:
        """The same slot and endpoint count, now the new lease's to give back: this one's `release` does nothing."""
        other = _Lease.__new__(_Lease)
        other._route, other._tier, other._metrics = self._route, self._tier, self._metrics
        other.endpoint, other.held = self.endpoint, self.held
        self.endpoint, self.held = None, False
        return other

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        self.use(None)
        self._route.admission.release()
        self._metrics.child(self._metrics.inflight, self._tier).dec()

    def __enter__(self) -> _Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(frozen=True, slots=True)
class _Failed:
    """An endpoint that failed the request in a way another may not: the error it leaves, and where to go next."""

    error: OpenAIError
    next_tier: bool = False  # this tier cannot serve it (a capability): skip its other endpoints


@dataclass(slots=True)
class _Call:
    """One request as dispatch tries it: what to post, where, and within what total time; whether a backend broke
    on it already."""

    tiers: Mapping[str, Tier]  # the request's routing version's
    request: ParsedRequest
    features: Features
    decision: Decision
    path: str
    body: Body
    request_id: str
    stream: bool
    budget: _Budget
    broke_one: bool = False


def _discard(resp: UpstreamResponse | None) -> None:
    """Drop a response that will not be used; closing its connection stops the generation upstream."""
    if resp is not None:
        resp.close()


def _client_error_from(f: UpstreamFailure, prefix: str = "") -> OpenAIError:
    """Relay a backend's own 4xx (e.g. prompt longer than its context) in the OpenAI format."""
    message, code, param = str(f), "upstream_rejected", None
    if f.body:
        try:
            err = decode_json(_error_body, f.body).get("error", {})
            if isinstance(err, dict):
                message = str(err.get("message") or message)
                code = str(err.get("code") or code)
                if isinstance(err.get("param"), str):  # which field it was: what SDKs show the developer
                    param = err["param"][:200]
            elif isinstance(err, str):
                message = err
        except (msgspec.DecodeError, AttributeError):
            pass
    return OpenAIError(f.status, prefix + message[:2000], code=code[:100], param=param)
