"""Shadow checks: a cache hit sampled for verification is served at once, and its request also goes to a tier.

An error-bounded rule (`max_false_hit_rate`, docs/cache.md) learns whether its hits are right from a sample of
would-be hits whose cached answer is compared with a tier's. With `verify_mode: tier` the sampled request is a
miss and the client waits for the tier; with `verify_mode: shadow` the cache serves it as a hit and says so
(`LookupResult.reason == "verify"`), and once the client has its answer this sends the same request to the rule's
tiers (as JSON, with the max_tokens the client would have been given) and offers the tier's answer to the cache,
which compares the two (`cache.verify.Verifier.settle`) and counts the label for the bound.

The check runs detached from the request (a task, not the response's background: a keep-alive connection must not
wait for a generation its client never asked for). It is the operator's cost, not the tenant's: nothing is charged
and no tenant slot is held. At most `Settings.cache_shadow_concurrency` checks run at once per gateway; one that
finds no room is dropped (counted): the checks are a random sample, so dropping some biases nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import structlog

from tiergate.core import tracing
from tiergate.core.errors import OpenAIError
from tiergate.gateway.context import Arrival, Outcome, RequestContext, UpstreamBody
from tiergate.gateway.detached import DetachedRequests
from tiergate.gateway.dispatch import Dispatcher
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.relay import read_whole
from tiergate.gateway.render import cacheable, summarize
from tiergate.gateway.settlement import CacheProvider, Settlements
from tiergate.gateway.tiers import Routing, RoutingHold

__all__ = ["ShadowChecks"]

log = structlog.get_logger("tiergate.gateway")


class ShadowChecks:
    """The gateway's running shadow checks: started after a sampled hit's response, stopped with the gateway."""

    def __init__(self, *, dispatcher: Dispatcher, metrics: GatewayMetrics, settlements: Settlements,
                 cache: CacheProvider, draining: Callable[[], bool], concurrency: int,
                 hold: Callable[[Routing], RoutingHold | None]) -> None:
        self._dispatcher = dispatcher
        self._metrics = metrics
        self._settlements = settlements
        self._cache = cache
        self._concurrency = concurrency
        self._checks = DetachedRequests("shadow", draining=draining, hold=hold)

    @property
    def running(self) -> int:
        """Checks under way now."""
        return self._checks.running

    async def start(self, ctx: RequestContext, outcome: Outcome) -> None:
        """Start one check (a response's background task: async, so that it runs on the event loop)."""
        # the version the hit was decided under is held while the check runs, if anything still holds it
        if self._cache() is None or not self._checks.start(ctx, self._concurrency,
                                                           lambda held: self._check(ctx, outcome, held)):
            self._metrics.shadow_checks.labels("dropped").inc()

    async def stop(self) -> None:
        """Cancel what is still running (shutdown): an unfinished check is a label not counted, nothing more."""
        await self._checks.stop()

    async def _check(self, ctx: RequestContext, outcome: Outcome, held: RoutingHold) -> None:
        """Ask the tier, then settle the check: its answer goes to the cache (`Settlement.shadow`)."""
        settle = self._settlements.open(Arrival.now(ctx.request_id, ctx.req.kind))
        answer = None
        try:
            with tracing.span("cache.shadow", **{"tiergate.request_id": ctx.request_id}):
                req = ctx.req
                attempt = await self._dispatcher.open(
                    tiers=held.routing.tiers, request=req, features=ctx.features, decision=ctx.decision,
                    path="/v1/chat/completions" if req.kind == "chat" else "/v1/completions",
                    body=UpstreamBody.of(ctx, as_json=True), request_id=ctx.request_id, stream=False)
                body, _ = await read_whole(attempt, self._metrics)
                answer = cacheable(summarize(body), req.kind, attempt.tier)  # None: cut short or several choices
        except (OpenAIError, msgspec.ValidationError, msgspec.DecodeError) as exc:
            log.info("cache_shadow_check_failed", request_id=ctx.request_id,
                     error=exc.message if isinstance(exc, OpenAIError) else "malformed answer")
        except Exception:  # a bug of ours: seen in the log, and the client was answered long ago
            log.exception("cache_shadow_check_error", request_id=ctx.request_id)
        finally:
            held.release()
        await settle.shadow(ctx, outcome, answer)
