"""After an answer, or instead of one: metrics, the request's log line, the status page's sample.

Every request the gateway read is counted here exactly once, by its `gateway.settlement.Settlement`: answered
(`record`), refused with an OpenAI error (`refused`) or abandoned by its client (`gone`), from the `Finished`
record its settlement builds. The token bill is the settlement's. The work runs after the last byte has gone
out wherever it can (a background task, a stream's close hook), so clients never wait for it.

Tested in `tests/gateway/test_settlement.py` and `tests/gateway/test_app.py`.
"""

from __future__ import annotations

import structlog

from tiergate.core.errors import OpenAIError
from tiergate.gateway.context import Finished
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.stats import Stats

__all__ = ["Accounting"]

log = structlog.get_logger("tiergate.gateway")


class Accounting:
    def __init__(self, metrics: GatewayMetrics, stats: Stats) -> None:
        self._metrics = metrics
        self._stats = stats

    def record(self, done: Finished) -> None:
        """Count one finished request in the metrics and the status page, and write its log line."""
        m, tier, cache, status, elapsed = self._metrics, done.tier, done.cache, done.status, done.elapsed
        arrival, tenant, f = done.arrival, done.tenant, done.features
        rule = done.decision.rule if done.decision is not None else "-"
        m.child(m.requests, arrival.endpoint, tier, rule, cache, str(status)).inc()
        m.child(m.duration, tier).observe(elapsed)
        m.overhead.observe(done.overhead)
        self._stats.record(tier, cache, status, elapsed)
        if done.prompt_tokens:
            m.child(m.tokens, tier, "prompt").inc(done.prompt_tokens)
        if done.completion_tokens:
            m.child(m.tokens, tier, "completion").inc(done.completion_tokens)
        log.info("request", request_id=arrival.request_id, tenant=tenant.id if tenant else None,
                 endpoint=arrival.endpoint, tier=tier, rule=rule, cache=cache, status=status,
                 prompt_tokens=f.prompt_tokens if f else None, complexity=round(f.complexity, 3) if f else None,
                 completion_tokens=done.completion_tokens, ms=round(elapsed * 1000, 2),
                 overhead_ms=round(done.overhead * 1000, 3))

    def refused(self, done: Finished, exc: OpenAIError) -> None:
        """Count an error answer: a 5xx or 429 also counts as a request (of tier `none`), a 4xx is logged."""
        self._metrics.client_errors.labels(exc.code or str(exc.status)).inc()
        if exc.status >= 500 or exc.status == 429:
            self.record(done)
        else:
            log.info("request_refused", request_id=done.arrival.request_id, status=exc.status, code=exc.code,
                     tenant=done.tenant.id if done.tenant else None)

    def gone(self, done: Finished) -> None:
        """Count and log a client that left before its answer began."""
        self._metrics.disconnects.labels(done.tier).inc()
        self.record(done)
