"""The confidence cascade: answer from the first tier, keep the answer only if the model was sure of it.

The first tier (an edge node) is asked for token log-probabilities on the gateway's own account; the answer is
judged by the rule's thresholds (`policies.confidence.verdict`); a confident answer goes to the client as it is
(minus the log-probabilities the client did not ask for), any other outcome escalates to the cascade's target:
low confidence, an answer cut at max_tokens, an empty one, the first tier failing, or its time running out
(`budget_s`). The client gets exactly one answer, whose usage is that answer's; the first tier's tokens on an
escalated request are counted in metrics and charged to the tenant when the request settles.

Streams: the first tier's stream is held back until the decision, which comes after `first_tokens` tokens (or at
its end without it), then either relayed from its start or dropped for the target's stream. The client sees
nothing before the decision, so an escalation is invisible apart from its latency (measured in bench/cascade).

Each judgment is also told to `judged` (the learned router records it as an outcome, and on an escalation waits for
the target's answer to judge the thrown-away draft against it: `gateway.agreement`), and `judge_unseen` judges an
answer the client is not shown the same way (the router's exploration).

Tested in `tests/gateway/test_settlement.py`, `tests/gateway/test_pipeline.py`, `tests/integration/test_cascade.py`
and `tests/integration/test_learned_router.py`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import msgspec
import structlog
from starlette.responses import Response

from tiergate.core.errors import OpenAIError
from tiergate.core.types import Cascade, Decision
from tiergate.core.wire import ChatRequest
from tiergate.gateway.context import Outcome, RequestContext, UpstreamBody
from tiergate.gateway.dispatch import Attempt, Dispatcher
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.relay import Relay
from tiergate.gateway.settlement import Settlement
from tiergate.gateway.upstream import FailureKind, UpstreamFailure
from tiergate.policies.confidence import (
    CascadeVerdict,
    Confidence,
    TokenScore,
    scores_from_openai,
    scores_from_text_logprobs,
    verdict,
)

__all__ = ["CascadeRunner", "Judged", "applies", "judge_unseen"]

# Told of every judged first-tier answer: (request, its outcome, verdict, the edge model version that answered, the
# first tier's whole answer or None: a stream decided on its first tokens, a failure); the learned router's outcome
# records (`gateway.learned_router`), which may hang an `AnswerWaiter` on the outcome for the answer that follows.
Judged = Callable[[RequestContext, Outcome, CascadeVerdict, str, str | None], None]

log = structlog.get_logger("tiergate.gateway")
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
_RUNNER_UP = 2  # top_logprobs the margin needs: the chosen token and the best other


def applies(ctx: RequestContext) -> bool:
    """A cascade judges text answers; a tool call has no log-probabilities to judge it by."""
    req = ctx.req
    return ctx.decision.cascade is not None and not (isinstance(req, ChatRequest) and req.tools)


@dataclasses.dataclass(slots=True)
class _Read:
    """What the first tier said, as far as the cascade read it."""

    scores: list[TokenScore] = dataclasses.field(default_factory=list)
    text: list[str] = dataclasses.field(default_factory=list)
    finish: str | None = None
    done: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def whole(self) -> str | None:
        """The answer, if all of it was read and it ended on its own (not cut at max_tokens, not failed)."""
        return "".join(self.text) if self.finish == "stop" else None


class CascadeRunner:
    def __init__(self, dispatcher: Dispatcher, metrics: GatewayMetrics, relay: Relay,
                 judged: Judged | None = None) -> None:
        self._dispatcher = dispatcher
        self._metrics = metrics
        self._relay = relay
        self._judged = judged

    async def run(self, ctx: RequestContext, outcome: Outcome, path: str, body: UpstreamBody,
                  settle: Settlement) -> Response:
        """The first tier is sent `body` amended to ask for log-probabilities; an escalation, `body` itself.
        The escalated first attempt's tokens go on the request's `settle`, charged however it ends."""
        cascade = ctx.decision.cascade
        assert cascade is not None
        asked = _asked_logprobs(ctx)
        first = _first_decision(ctx.decision, cascade)
        started = time.perf_counter()
        attempt: Attempt | None = None
        read = _Read()
        try:
            async with asyncio.timeout(cascade.budget_s):
                attempt = await self._dispatcher.open(
                    tiers=ctx.routing.tiers, request=ctx.req, features=ctx.features, decision=first, path=path,
                    body=body.amended(_logprob_changes(ctx, asked, cascade)), request_id=ctx.request_id,
                    stream=bool(ctx.req.stream))
                await self._read(ctx, attempt, read, cascade)
            judged = verdict(cascade, read.scores, read.finish, "".join(read.text))
        except TimeoutError:
            judged = CascadeVerdict(False, "timeout", _NO_CONFIDENCE)
        except (OpenAIError, UpstreamFailure) as exc:  # the first tier's own timeouts are bounded by the budget
            timed_out = (exc.kind is FailureKind.TIMEOUT if isinstance(exc, UpstreamFailure)
                         else exc.code == f"upstream_{FailureKind.TIMEOUT}")
            log.info("cascade_first_tier_failed", request_id=ctx.request_id, tier=first.tier, error=str(exc))
            reason = ("timeout" if timed_out else "malformed_answer" if isinstance(exc, _Malformed)
                      else "first_tier_failed")
            judged = CascadeVerdict(False, reason, _NO_CONFIDENCE)
        except BaseException:  # cancelled: the client left (or shutdown)
            _drop(attempt)
            raise
        spent = time.perf_counter() - started
        outcome.cascade = judged
        if self._judged is not None:
            self._judged(ctx, outcome, judged, _version(ctx, first.tier, attempt), read.whole())
        m, rule = self._metrics, ctx.decision.rule
        outcome_label = "kept" if judged.keep else "escalated"
        m.cascade.labels(rule, outcome_label, judged.reason).inc()
        m.cascade_decision.labels(rule, outcome_label).observe(spent)
        if judged.keep:
            assert attempt is not None
            transform = _transform(ctx, asked)
            if ctx.req.stream:
                attempt.first_at = time.perf_counter()  # what the client waited for its first token
                return self._relay.stream(ctx, outcome, attempt, settle, transform=transform)
            upstream_s = time.perf_counter() - attempt.upstream_started
            answer = attempt.first[0] if attempt.first else b"{}"
            return self._relay.answer(ctx, outcome, first.tier or "", transform(answer) if transform else answer,
                                      upstream_s, settle)
        _drop(attempt)
        edge_prompt = (read.prompt_tokens if read.prompt_tokens + read.completion_tokens
                       else ctx.features.prompt_tokens if attempt is not None else 0)
        edge_tokens = read.prompt_tokens + read.completion_tokens or (
            ctx.features.prompt_tokens + len(read.scores) if attempt is not None else 0)
        m.cascade_edge_tokens.labels(rule).inc(edge_tokens)
        m.cascade_edge_seconds.labels(rule).inc(spent)
        settle.add_spent(edge_tokens, ctx=ctx, tier=first.tier or "", prompt_tokens=edge_prompt)
        log.info("cascade_escalated", request_id=ctx.request_id, rule=rule, reason=judged.reason,
                 confidence=judged.confidence.as_dict(), edge_s=round(spent, 3), edge_tokens=edge_tokens)
        second = dataclasses.replace(ctx.decision, tier=cascade.escalate_to, cascade=None,
                                     fallbacks=tuple(t for t in ctx.decision.fallbacks
                                                     if t not in (cascade.escalate_to, ctx.decision.tier)))
        attempt = await self._dispatcher.open(tiers=ctx.routing.tiers, request=ctx.req, features=ctx.features,
                                              decision=second,
                                              path=path, body=body, request_id=ctx.request_id,
                                              stream=bool(ctx.req.stream))
        if ctx.req.stream:
            return self._relay.stream(ctx, outcome, attempt, settle)
        return await self._relay.json(ctx, outcome, attempt, settle)

    async def _read(self, ctx: RequestContext, attempt: Attempt, read: _Read, cascade: Cascade) -> None:
        """Read the first tier's answer until the decision can be made: all of a JSON answer; a stream until
        `first_tokens` tokens or its end. A stream's batches read so far stay in `attempt.first` for the relay."""
        chat = ctx.req.kind == "chat"
        if not ctx.req.stream:
            body = await attempt.response.read()
            attempt.response.release()
            attempt.finish()
            attempt.first = [body]
            _feed(_parse(body, attempt.tier), read, chat)
            read.done = True
            return
        held: list[bytes] = []
        batch = attempt.first
        while batch is not None:
            held.extend(batch)
            for payload in batch:
                if payload == b"[DONE]":
                    read.done = True
                    continue
                _feed(_parse(payload, attempt.tier), read, chat)
            if read.done or read.finish is not None or (
                    cascade.first_tokens is not None and len(read.scores) >= cascade.first_tokens):
                break
            batch = await attempt.next_events()
        attempt.first = held


_NO_CONFIDENCE = Confidence(0, float("-inf"), float("-inf"), None)


class _Malformed(UpstreamFailure):
    """The first tier's answer cannot be read, or is a backend's error: escalated (reason `malformed_answer`)."""


def _parse(payload: bytes, tier: str) -> dict[str, Any]:
    """One answer or stream chunk of the first tier, or a failure that escalates: the client has seen nothing yet,
    and an answer the gateway cannot read (or a backend's error in it) is not one to keep."""
    try:
        obj = _decode(payload)
    except msgspec.DecodeError:
        obj = None
    if not isinstance(obj, dict):
        raise _Malformed(f"tier `{tier}` sent a malformed answer", kind=FailureKind.PROTOCOL)
    if obj.get("error") is not None:
        raise _Malformed(f"tier `{tier}` answered with an error", kind=FailureKind.STREAM)
    return obj


def _feed(obj: dict[str, Any], read: _Read, chat: bool) -> None:
    """Add one answer object or stream chunk to what was read; a malformed one fails (`_parse`)."""
    try:
        _feed_checked(obj, read, chat)
    except (TypeError, KeyError, ValueError, AttributeError):
        raise _Malformed("the first tier's answer is malformed", kind=FailureKind.PROTOCOL) from None


def _feed_checked(obj: dict[str, Any], read: _Read, chat: bool) -> None:
    usage = obj.get("usage")
    if usage:
        read.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        read.completion_tokens = int(usage.get("completion_tokens") or 0)
    for choice in obj.get("choices") or ():
        if choice.get("index", 0) != 0:
            continue
        lp = choice.get("logprobs") or {}
        if chat:
            read.scores.extend(scores_from_openai(lp.get("content") or ()))
            part = (choice.get("message") or choice.get("delta") or {}).get("content")
        else:
            read.scores.extend(scores_from_text_logprobs(lp))
            part = choice.get("text")
        if part:
            read.text.append(part)
        if choice.get("finish_reason"):
            read.finish = choice["finish_reason"]


def _asked_logprobs(ctx: RequestContext) -> int | None:
    """How many alternatives the client itself asked for (None: it asked for no log-probabilities)."""
    req = ctx.req
    if isinstance(req, ChatRequest):
        return (req.top_logprobs or 0) if req.logprobs else None
    return None if req.logprobs is None or isinstance(req.logprobs, bool) else int(req.logprobs)


def _logprob_changes(ctx: RequestContext, asked: int | None, cascade: Cascade) -> dict[str, Any]:
    """The fields the first tier's request gets so the answer can be judged."""
    want = max(asked or 0, _RUNNER_UP if cascade.min_margin is not None else 0)
    if ctx.req.kind == "chat":
        return {"logprobs": True, "top_logprobs": want}
    return {"logprobs": want}


def _transform(ctx: RequestContext, asked: int | None) -> Callable[[bytes], bytes] | None:
    """Take out of the first tier's answer what the gateway asked for on its own: every log-probability, or the
    alternatives beyond what the client asked for."""
    cascade = ctx.decision.cascade
    assert cascade is not None
    if asked is not None and (cascade.min_margin is None or asked >= _RUNNER_UP):
        return None
    chat = ctx.req.kind == "chat"

    def strip(payload: bytes) -> bytes:
        if payload == b"[DONE]":
            return payload
        try:
            obj = _decode(payload)
            for choice in obj.get("choices") or ():
                lp = choice.get("logprobs")
                if asked is None or not lp:
                    choice["logprobs"] = None
                elif chat:
                    for entry in lp.get("content") or ():
                        entry["top_logprobs"] = entry.get("top_logprobs", [])[:asked]
                else:
                    lp["top_logprobs"] = [dict(sorted(t.items(), key=lambda kv: -kv[1])[:max(asked, 1)])
                                          for t in lp.get("top_logprobs") or ()]
            return _encode(obj)
        except (msgspec.DecodeError, AttributeError, TypeError):
            return payload

    return strip


def _first_decision(decision: Decision, cascade: Cascade) -> Decision:
    """The first tier alone (its failure escalates instead of falling back), within the cascade's budget."""
    t = decision.timeouts
    timeouts = dataclasses.replace(t, first_byte_s=min(t.first_byte_s, cascade.budget_s),
                                   total_s=min(t.total_s, cascade.budget_s))
    return dataclasses.replace(decision, fallbacks=(), timeouts=timeouts, cascade=None)


def _version(ctx: RequestContext, tier: str | None, attempt: Attempt | None) -> str:
    """The model version that answered: what its backend serves, else the tier's configured model."""
    if attempt is not None:
        return attempt.endpoint.model
    cfg = ctx.policy.tiers.get(tier or "")
    return (cfg.served_model or cfg.model) if cfg is not None else ""


async def judge_unseen(dispatcher: Dispatcher, ctx: RequestContext, tiers: Any, decision: Decision
                       ) -> tuple[CascadeVerdict, str, str | None]:
    """Ask `decision`'s first tier for an answer nobody is shown and judge it by its cascade's thresholds, as a
    cascade would have (exploration, `gateway.exploration`): the verdict, the model version that answered, and its
    whole answer (None: it gave none)."""
    cascade = decision.cascade
    assert cascade is not None
    first = _first_decision(decision, cascade)
    body = UpstreamBody.of(ctx, as_json=True).amended(_logprob_changes(ctx, None, cascade))
    attempt: Attempt | None = None
    read = _Read()
    path = "/v1/chat/completions" if ctx.req.kind == "chat" else "/v1/completions"
    try:
        async with asyncio.timeout(cascade.budget_s):
            attempt = await dispatcher.open(tiers=tiers, request=ctx.req, features=ctx.features, decision=first,
                                            path=path, body=body, request_id=ctx.request_id, stream=False)
            body_bytes = await attempt.response.read()
            _feed(_parse(body_bytes, attempt.tier), read, ctx.req.kind == "chat")
        judged = verdict(cascade, read.scores, read.finish, "".join(read.text))
    except TimeoutError:
        judged = CascadeVerdict(False, "timeout", _NO_CONFIDENCE)
    except (OpenAIError, UpstreamFailure) as exc:
        judged = CascadeVerdict(False, "malformed_answer" if isinstance(exc, _Malformed) else "first_tier_failed",
                                _NO_CONFIDENCE)
    finally:
        _drop(attempt)
    return judged, _version(ctx, first.tier, attempt), read.whole()


def _drop(attempt: Attempt | None) -> None:
    """Stop the first tier's generation (closing the connection stops it) and free its slot."""
    if attempt is not None:
        attempt.response.close()
        attempt.finish()
