"""After an answer, or instead of one: metrics, the request's log line, the status page's sample.

Every request the gateway read is counted here exactly once, by its `gateway.settlement.Settlement`: answered
(`answered`), refused with an OpenAI error (`refused`) or abandoned by its client (`gone`). The token bill is
the settlement's. The work runs after the last byte has gone out wherever it can (a background task, a
stream's close hook), so clients never wait for it.

Tested in `tests/gateway/test_settlement.py` and `tests/gateway/test_app.py`.
"""

from __future__ import annotations

import time

import structlog
from starlette.responses import Response

from tiergate.core.errors import OpenAIError
from tiergate.core.types import Decision, Features
from tiergate.gateway.auth import Tenant
from tiergate.gateway.context import Arrival, Outcome, RequestContext
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.stats import Stats

__all__ = ["Accounting"]

log = structlog.get_logger("tiergate.gateway")
_JSON = "application/json"


class Accounting:
    def __init__(self, metrics: GatewayMetrics, stats: Stats) -> None:
        self._metrics = metrics
        self._stats = stats

    def record(self, arrival: Arrival, *, tier: str, status: int, overhead: float, tenant: Tenant | None,
               decision: Decision | None, features: Features | None, cache: str, prompt_tokens: int = 0,
               completion_tokens: int = 0, elapsed: float | None = None) -> None:
        """Count one finished request in the metrics and the status page, and write its log line."""
        if elapsed is None:
            elapsed = time.perf_counter() - arrival.started
        m = self._metrics
        rule = decision.rule if decision is not None else "-"
        m.child(m.requests, arrival.endpoint, tier, rule, cache, str(status)).inc()
        m.child(m.duration, tier).observe(elapsed)
        m.overhead.observe(overhead)
        self._stats.record(tier, cache, status, elapsed)
        if prompt_tokens:
            m.child(m.tokens, tier, "prompt").inc(prompt_tokens)
        if completion_tokens:
            m.child(m.tokens, tier, "completion").inc(completion_tokens)
        f = features
        log.info("request", request_id=arrival.request_id, tenant=tenant.id if tenant else None,
                 endpoint=arrival.endpoint, tier=tier, rule=rule, cache=cache, status=status,
                 prompt_tokens=f.prompt_tokens if f else None, complexity=round(f.complexity, 3) if f else None,
                 completion_tokens=completion_tokens, ms=round(elapsed * 1000, 2),
                 overhead_ms=round(overhead * 1000, 3))

    def answered(self, ctx: RequestContext, outcome: Outcome, tier: str, status: int, overhead: float,
                 prompt_tokens: int = 0, completion_tokens: int = 0, *, elapsed: float | None = None) -> None:
        self.record(ctx.arrival, tier=tier, status=status, overhead=overhead, tenant=ctx.tenant,
                    decision=ctx.decision, features=ctx.features, cache=outcome.cache, prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens, elapsed=elapsed)

    def refused(self, arrival: Arrival, exc: OpenAIError, *, tenant: Tenant | None = None,
                decision: Decision | None = None, features: Features | None = None, cache: str = "bypass") -> Response:
        """The OpenAI error answer; a 5xx or 429 also counts as a request of tier `none`, a 4xx is logged."""
        self._metrics.client_errors.labels(exc.code or str(exc.status)).inc()
        if exc.status >= 500 or exc.status == 429:
            elapsed = time.perf_counter() - arrival.started
            self.record(arrival, tier="none", status=exc.status, overhead=elapsed, tenant=tenant, decision=decision,
                        features=features, cache=cache, elapsed=elapsed)
        else:
            log.info("request_refused", request_id=arrival.request_id, status=exc.status, code=exc.code,
                     tenant=tenant.id if tenant else None)
        headers = {"x-request-id": arrival.request_id, **exc.headers}
        if decision is not None:
            headers["x-tiergate-rule"] = decision.rule
        return Response(exc.to_json(), status_code=exc.status, media_type=_JSON, headers=headers)

    def gone(self, arrival: Arrival, *, tenant: Tenant | None = None, decision: Decision | None = None,
             features: Features | None = None, cache: str = "bypass", prompt_tokens: int = 0) -> Response:
        """Count and log a client that left before its answer began; the 499 is never seen by anyone."""
        tier = decision.tier if decision is not None and decision.tier else "none"
        self._metrics.disconnects.labels(tier).inc()
        elapsed = time.perf_counter() - arrival.started
        self.record(arrival, tier=tier, status=499, overhead=elapsed, tenant=tenant, decision=decision,
                    features=features, cache=cache, prompt_tokens=prompt_tokens, elapsed=elapsed)
        return Response(status_code=499, headers={"x-request-id": arrival.request_id})
