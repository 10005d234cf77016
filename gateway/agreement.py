"""Agreement labels: where the gateway holds both the edge's answer and the cloud's to one request, was the edge right?

A cascade's own verdict (kept or escalated) is what the edge's confidence said, not whether its answer was right:
a fluent wrong guess is kept, and a router trained on such labels learns that the edge stands where it is at chance.
The cloud's answer is the reference the cascade already trusts, so wherever the gateway has both, the edge's answer
is judged against it (`cache.answercheck.AnswerCheck`: exact rules for short answers, the cache's judge for long
ones; no verdict, no label) and recorded as an outcome of source `agreement` (label 1: the edge's answer agrees),
with the path it came from as its reason:

- `escalation`: a cascade threw the edge's draft away and the cloud answered the client;
- `exploration`: the edge answered a request the router sent to the cloud, unseen (`gateway.exploration`);
- `verify`: a sampled share (`router.verify`) of the answers a cascade kept is also asked of the cascade's target,
  detached, as the operator's cost (like a cache shadow check, `gateway.shadow`), so that kept answers get graded
  labels too and not only the ones confidence already doubted.

Only a whole edge answer is compared (a stream decided on its first tokens holds part of one). The judging runs
off the request path, after the client's answer is complete; at most `router.explore_concurrency` verifications
and `_MAX_JUDGING` comparisons run at once per gateway, and the rest are skipped (counted): labels are a sample.

Tested in `tests/gateway/test_agreement.py` and `tests/integration/test_learned_router.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import Callable
from enum import StrEnum

import msgspec
import structlog
from prometheus_client import CollectorRegistry, Counter

from tiergate.cache.answercheck import AnswerCheck
from tiergate.cache.judge import Judge
from tiergate.core.errors import OpenAIError
from tiergate.core.types import Decision
from tiergate.gateway.context import RequestContext, UpstreamBody
from tiergate.gateway.detached import DetachedRequests
from tiergate.gateway.dispatch import Dispatcher
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.outcomes import OutcomeRecorder, OutcomeSource
from tiergate.gateway.relay import read_whole
from tiergate.gateway.render import summarize
from tiergate.gateway.tiers import Routing, RoutingHold

__all__ = ["Agreements", "AgreementPath", "AnswerPair"]

log = structlog.get_logger("tiergate.router")
_MAX_JUDGING = 64  # comparisons under way at once (the fallback judge may be a model); beyond, skipped


class AgreementPath(StrEnum):
    """How the gateway came to hold both answers (the record's reason, a metric label)."""

    ESCALATION = "escalation"
    EXPLORATION = "exploration"
    VERIFY = "verify"


_UNSET = object()


class AnswerPair:
    """The edge's answer and the cloud's to one request, each given once as it comes; judged when both have."""

    __slots__ = ("_agreements", "_cloud", "_ctx", "_edge", "_edge_tier", "_path", "_version")

    def __init__(self, agreements: Agreements, ctx: RequestContext, path: AgreementPath, edge_tier: str) -> None:
        self._agreements = agreements
        self._ctx = ctx
        self._path = path
        self._edge_tier = edge_tier
        self._edge: object = _UNSET
        self._cloud: object = _UNSET
        self._version = ""

    def edge(self, text: str | None, version: str) -> None:
        """The edge's whole answer (None: it gave none that can be compared) and the model version that gave it."""
        if self._edge is _UNSET:
            self._edge, self._version = text, version
            self._both()

    def cloud(self, text: str | None, tier: str) -> None:
        """The answer the client got (None: not a whole one); an answer from the edge tier itself is no reference."""
        if self._cloud is _UNSET:
            self._cloud = text if tier != self._edge_tier else None
            self._both()

    def _both(self) -> None:
        if self._edge is _UNSET or self._cloud is _UNSET:
            return
        edge, cloud = self._edge, self._cloud
        if not isinstance(edge, str) or not isinstance(cloud, str):
            self._agreements.metrics.labels(self._path, "no_answer").inc()
            return
        self._agreements.judge(self._ctx, self._path, edge, cloud, self._version)


class Agreements:
    """Pairs the gateway's edge and cloud answers, judges them detached, records the labels, runs verifications."""

    def __init__(self, outcomes: OutcomeRecorder, registry: CollectorRegistry, *,
                 fallback: Callable[[], Judge | None] = lambda: None, rng: random.Random | None = None,
                 dispatcher: Dispatcher | None = None, gateway_metrics: GatewayMetrics | None = None,
                 hold: Callable[[Routing], RoutingHold | None] = lambda _r: None,
                 draining: Callable[[], bool] = lambda: False) -> None:
        """`fallback`: the judge for long answers (the cache's, when it has one); `dispatcher` and the rest: how
        verifications reach the cloud (without a dispatcher, none runs)."""
        self.outcomes = outcomes
        self.metrics = Counter("tiergate_router_agreements", "Edge answers compared with the cloud's for the "
                               "learned router, by path (escalation, exploration, verify) and result (agreed, "
                               "disagreed, no_verdict, no_answer, skipped, failed)", ["path", "result"],
                               registry=registry)
        self._fallback = fallback
        self._rng = rng or random.Random()
        self._judging: set[asyncio.Task[None]] = set()
        self._verifications = DetachedRequests("verify", draining=draining, hold=hold)
        self.dispatcher = dispatcher
        self.gateway_metrics = gateway_metrics

    @property
    def running(self) -> int:
        return len(self._judging) + self._verifications.running

    def pair(self, ctx: RequestContext, path: AgreementPath, edge_tier: str) -> AnswerPair | None:
        """A pair for `ctx`, or None when the policy records no outcomes."""
        cfg = ctx.policy.router
        if cfg is None or not cfg.record:
            return None
        return AnswerPair(self, ctx, path, edge_tier)

    def judge(self, ctx: RequestContext, path: AgreementPath, edge: str, cloud: str, version: str) -> None:
        """Compare `edge` with `cloud` and record the label, detached (returns at once)."""
        if len(self._judging) >= _MAX_JUDGING:
            self.metrics.labels(path, "skipped").inc()
            return
        task = asyncio.get_running_loop().create_task(self._judge(ctx, path, edge, cloud, version))
        self._judging.add(task)
        task.add_done_callback(self._judging.discard)

    async def _judge(self, ctx: RequestContext, path: AgreementPath, edge: str, cloud: str, version: str) -> None:
        try:
            same = await AnswerCheck(self._fallback()).same(ctx.features.text, edge, cloud)
        except Exception:  # a judge's bug: no label
            self.metrics.labels(path, "failed").inc()
            log.exception("router_agreement_error", request_id=ctx.request_id)
            return
        if same is None:
            self.metrics.labels(path, "no_verdict").inc()
            return
        self.metrics.labels(path, "agreed" if same else "disagreed").inc()
        log.info("router_agreement", request_id=ctx.request_id, path=str(path), agreed=same, edge_version=version)
        self.outcomes.record(policy=ctx.policy, features=ctx.features, tenant=ctx.tenant.id, rule=ctx.decision.rule,
                             edge_version=version, stood=same, reason=str(path), source=OutcomeSource.AGREEMENT)

    def maybe_verify(self, ctx: RequestContext, draft: str | None, version: str) -> None:
        """A cascade kept its first tier's answer `draft`: with probability `router.verify`, ask the cascade's
        target too, detached, and compare (returns at once)."""
        cfg, cascade = ctx.policy.router, ctx.decision.cascade
        if cfg is None or not cfg.record or cfg.verify <= 0 or cascade is None or self._rng.random() >= cfg.verify:
            return
        pair = AnswerPair(self, ctx, AgreementPath.VERIFY, ctx.decision.tier or "")
        target = dataclasses.replace(ctx.decision, tier=cascade.escalate_to, cascade=None,
                                     fallbacks=tuple(t for t in ctx.decision.fallbacks
                                                     if t not in (cascade.escalate_to, ctx.decision.tier)))
        if (draft is None or self.dispatcher is None or self.gateway_metrics is None
                or not self._verifications.start(ctx, cfg.explore_concurrency,
                                                 lambda held: self._verify(ctx, target, pair, held))):
            self.metrics.labels(AgreementPath.VERIFY, "skipped").inc()
            return
        pair.edge(draft, version)

    async def _verify(self, ctx: RequestContext, target: Decision, pair: AnswerPair, held: RoutingHold) -> None:
        assert self.dispatcher is not None and self.gateway_metrics is not None  # maybe_verify checked
        try:
            attempt = await self.dispatcher.open(
                tiers=held.routing.tiers, request=ctx.req, features=ctx.features, decision=target,
                path="/v1/chat/completions" if ctx.req.kind == "chat" else "/v1/completions",
                body=UpstreamBody.of(ctx, as_json=True), request_id=ctx.request_id, stream=False)
            body, _ = await read_whole(attempt, self.gateway_metrics)
            summary = summarize(body)
            whole = summary.finish_reason in ("stop", "length") and not summary.multi_choice and summary.error is None
            pair.cloud(summary.text if whole else None, attempt.tier)
        except (OpenAIError, msgspec.ValidationError, msgspec.DecodeError) as exc:
            self.metrics.labels(AgreementPath.VERIFY, "failed").inc()
            log.info("router_verify_failed", request_id=ctx.request_id,
                     error=exc.message if isinstance(exc, OpenAIError) else "malformed answer")
        except Exception:  # a bug of ours: logged; the client had its answer long ago
            self.metrics.labels(AgreementPath.VERIFY, "failed").inc()
            log.exception("router_verify_error", request_id=ctx.request_id)
        finally:
            held.release()

    async def stop(self) -> None:
        """Cancel what is still running (shutdown): an unfinished comparison is a label not recorded."""
        await self._verifications.stop()
        tasks = list(self._judging)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def flush(self) -> None:
        """Wait for what is under way (tests)."""
        while self._judging or self._verifications.running:
            await self._verifications.wait()
            await asyncio.gather(*list(self._judging), return_exceptions=True)
