"""Agreement labels on each path that holds both answers: an escalated cascade's draft against the answer the client
got, an exploration's unseen answer against the routed one, a sampled kept answer against its target's (verify);
what gives no label (no whole draft, the reference from the edge itself, no verdict) and what is skipped (fakes at
the dispatcher boundary; tests/integration/test_learned_router.py escalates through a real gateway, edge node and
Redis)."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from tests.support.router_policy import router_policy
from tests.support.waiting import eventually
from tiergate.core.wire import decode_request
from tiergate.gateway.agreement import Agreements
from tiergate.gateway.context import Outcome
from tiergate.gateway.exploration import Explorations
from tiergate.gateway.learned_router import LearnedRouter
from tiergate.gateway.outcomes import MemoryOutcomes, OutcomeRecorder
from tiergate.policies.confidence import CascadeVerdict, Confidence
from tiergate.policies.store import PolicyStore

pytestmark = pytest.mark.anyio

POLICY = router_policy("{model: router.json, explore: 1.0, verify: VERIFY}")
QUESTION = "What is 7 + 8? Answer with one number."


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _answer(text: str, finish: str = "stop") -> bytes:
    return msgspec.json.encode({"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                             "finish_reason": finish, "logprobs": {"content": [
                                                 {"token": text, "logprob": -0.1, "top_logprobs": []}]}}],
                                "usage": {"prompt_tokens": 9, "completion_tokens": 1}})


class _Response:
    def __init__(self, body: bytes) -> None:
        self.body = body

    async def read(self) -> bytes:
        return self.body

    def release(self) -> None: ...

    def close(self) -> None: ...


class _Dispatcher:
    """Answers each tier with its canned text."""

    def __init__(self, answers: dict[str, bytes]) -> None:
        self.answers = answers
        self.opened: list[Any] = []

    async def open(self, **kw: Any) -> Any:
        self.opened.append(kw)
        tier = kw["decision"].tier
        return SimpleNamespace(tier=tier, response=_Response(self.answers[tier]), aborted=None,
                               upstream_started=time.perf_counter(), endpoint=SimpleNamespace(model=f"{tier}-v1"),
                               finish=lambda ok=True: None)


def _ctx(tmp_path: Path, rule: str, *, verify: float = 0.0, question: str = QUESTION) -> Any:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.replace("VERIFY", str(verify)))
    active = PolicyStore(path).current
    body = msgspec.json.encode({"model": "auto", "messages": [{"role": "user", "content": question}]})
    req, _ = decode_request(body, "chat")
    features = SimpleNamespace(prompt_tokens=9, complexity=0.2, max_tokens=None, temperature=None, stream=False,
                               text=question)
    decision = active.engine.decision_of(rule)
    return SimpleNamespace(policy=active.policy, decision=decision, routing=SimpleNamespace(active=active, tiers={}),
                           req=req, request_id="r1", features=features, tenant=SimpleNamespace(id="t"),
                           raw={k: msgspec.Raw(msgspec.json.encode(v)) for k, v in msgspec.json.decode(body).items()},
                           max_tokens=lambda: 16)


def _parts(dispatcher: _Dispatcher | None = None, draining: bool = False
           ) -> tuple[LearnedRouter, Agreements, OutcomeRecorder, CollectorRegistry]:
    registry = CollectorRegistry()
    recorder = OutcomeRecorder(None, registry)
    held = SimpleNamespace(routing=SimpleNamespace(tiers={}), release=lambda: None)
    agreements = Agreements(recorder, registry, rng=random.Random(0), dispatcher=dispatcher,  # type: ignore[arg-type]
                            gateway_metrics=SimpleNamespace(), hold=lambda _r: held,  # type: ignore[arg-type]
                            draining=lambda: draining)
    return LearnedRouter(registry, recorder, random.Random(0), agreements), agreements, recorder, registry


async def _records(recorder: OutcomeRecorder, agreements: Agreements) -> list[dict[str, Any]]:
    await agreements.flush()
    await recorder.flush()
    assert isinstance(recorder.sink, MemoryOutcomes)
    return [msgspec.json.decode(r) for r in recorder.sink.records()]


def _count(registry: CollectorRegistry, path: str, result: str) -> float:
    return registry.get_sample_value("tiergate_router_agreements_total", {"path": path, "result": result}) or 0


_ESCALATED = CascadeVerdict(False, "low_confidence", Confidence(1, -2.0, -2.0, None))
_KEPT = CascadeVerdict(True, "confident", Confidence(1, -0.1, -0.1, None))


@pytest.mark.parametrize(("draft", "cloud", "label"), [("7 + 8 = 15", "15", 1), ("16", "The answer is 15.", 0)])
async def test_an_escalated_draft_is_judged_against_the_answer_the_client_got(tmp_path, draft, cloud, label):
    router, agreements, recorder, registry = _parts()
    ctx, outcome = _ctx(tmp_path, "cascade"), Outcome()
    router.judged(ctx, outcome, _ESCALATED, "smollm2", draft)
    assert outcome.pair is not None
    assert [r["source"] for r in await _records(recorder, agreements)] == ["cascade"]  # none before the cloud's
    outcome.pair.cloud(cloud, "cloud")  # what the relay does once the client's answer is whole
    recs = await _records(recorder, agreements)
    assert [(r["source"], r["label"], r["reason"]) for r in recs] == [
        ("cascade", 0, "low_confidence"), ("agreement", label, "escalation")]
    assert recs[1]["edge_version"] == "smollm2" and recs[1]["rule"] == "cascade"
    assert _count(registry, "escalation", "agreed" if label else "disagreed") == 1
    assert registry.get_sample_value("tiergate_router_outcomes_total",
                                     {"source": "agreement", "stood": "true" if label else "false"}) == 1


async def test_no_label_without_a_whole_draft_a_reference_from_the_edge_or_a_verdict(tmp_path):
    router, agreements, recorder, registry = _parts()
    ctx = _ctx(tmp_path, "cascade")
    for draft, cloud, tier in ((None, "15", "cloud"), ("15", "15", "edge"), ("15", None, "cloud")):
        outcome = Outcome()
        router.judged(ctx, outcome, _ESCALATED, "smollm2", draft)
        assert outcome.pair is not None
        outcome.pair.cloud(cloud, tier)
    outcome = Outcome()
    long = _ctx(tmp_path, "cascade", question="Explain recursion.")
    router.judged(long, outcome, _ESCALATED, "smollm2", "A function calling itself.")
    assert outcome.pair is not None
    outcome.pair.cloud(" ".join(["recursion"] * 20), "cloud")  # long, and no fallback judge: no verdict
    recs = await _records(recorder, agreements)
    assert {r["source"] for r in recs} == {"cascade"}
    assert _count(registry, "escalation", "no_answer") == 3 and _count(registry, "escalation", "no_verdict") == 1


async def test_an_exploration_is_judged_against_the_routed_answer(tmp_path):
    dispatcher = _Dispatcher({"edge": _answer("15")})
    router, agreements, recorder, registry = _parts(dispatcher)
    held = SimpleNamespace(routing=SimpleNamespace(tiers={}), release=lambda: None)
    ex = Explorations(dispatcher=dispatcher, router=router, draining=lambda: False,  # type: ignore[arg-type]
                      hold=lambda _r: held)  # type: ignore[arg-type,return-value]
    ctx, outcome = _ctx(tmp_path, "predicted-failure"), Outcome()
    ex.maybe_start(ctx, outcome)
    assert outcome.pair is not None
    outcome.pair.cloud("15", "cloud")  # the client's answer may well come first
    await eventually(lambda: _count(registry, "exploration", "agreed") == 1, "the exploration compared")
    recs = await _records(recorder, agreements)
    assert sorted((r["source"], r["label"], r["reason"]) for r in recs) == [
        ("agreement", 1, "exploration"), ("explore", 1, "confident")]
    assert [r["edge_version"] for r in recs if r["source"] == "agreement"] == ["edge-v1"]
    await ex.stop()


async def test_a_sampled_kept_answer_is_verified_against_the_cascade_target(tmp_path):
    dispatcher = _Dispatcher({"cloud": _answer("16")})
    router, agreements, recorder, registry = _parts(dispatcher)
    ctx = _ctx(tmp_path, "cascade", verify=1.0)
    outcome = Outcome()
    router.judged(ctx, outcome, _KEPT, "smollm2", "15")
    assert outcome.pair is None  # the client has the edge's answer: nothing waits on it
    recs = await _records(recorder, agreements)
    assert [(r["source"], r["label"], r["reason"]) for r in recs] == [
        ("cascade", 1, "confident"), ("agreement", 0, "verify")]  # kept, yet the cloud says otherwise
    [opened] = dispatcher.opened
    assert opened["decision"].tier == "cloud" and opened["decision"].cascade is None and opened["stream"] is False
    assert _count(registry, "verify", "disagreed") == 1


async def test_verification_is_off_by_default_and_skipped_without_a_whole_answer_or_while_draining(tmp_path):
    dispatcher = _Dispatcher({"cloud": _answer("15")})
    router, agreements, recorder, registry = _parts(dispatcher)
    router.judged(_ctx(tmp_path, "cascade"), Outcome(), _KEPT, "smollm2", "15")  # verify: 0
    router.judged(_ctx(tmp_path, "cascade", verify=1.0), Outcome(), _KEPT, "smollm2", None)  # a stream's start
    draining, agreements2, recorder2, registry2 = _parts(dispatcher, draining=True)
    draining.judged(_ctx(tmp_path, "cascade", verify=1.0), Outcome(), _KEPT, "smollm2", "15")
    await asyncio.gather(_records(recorder, agreements), _records(recorder2, agreements2))
    assert dispatcher.opened == []
    assert _count(registry, "verify", "skipped") == 1 and _count(registry2, "verify", "skipped") == 1


@pytest.mark.parametrize("garbage", [b"not json at all", b'{"choices": "nope"}', b"[]"])
async def test_a_lying_cloud_during_verification_is_counted_as_failed_and_labels_nothing(tmp_path, garbage):
    """The verification's backend may answer anything: a body that is no chat completion is a failed check, no
    agreement label, and the hold on the routing version is let go (nothing left running)."""
    dispatcher = _Dispatcher({"cloud": garbage})
    router, agreements, recorder, registry = _parts(dispatcher)
    router.judged(_ctx(tmp_path, "cascade", verify=1.0), Outcome(), _KEPT, "smollm2", "15")
    recs = await _records(recorder, agreements)
    assert [r["source"] for r in recs] == ["cascade"]  # the cascade's own verdict only
    assert _count(registry, "verify", "failed") == 1 and agreements.running == 0
