"""Exploration's bookkeeping: what is skipped (draining, no room, a tool call, no cascade to judge by), and an edge
that fails an exploration is a recorded label, never an error (fakes at the dispatcher boundary;
tests/integration/test_learned_router.py explores on a real edge node)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from tests.support.router_policy import router_policy
from tests.support.waiting import eventually
from tiergate.core.errors import OpenAIError
from tiergate.core.wire import decode_request
from tiergate.gateway.exploration import Explorations
from tiergate.gateway.learned_router import LearnedRouter
from tiergate.gateway.outcomes import MemoryOutcomes, OutcomeRecorder
from tiergate.policies.store import PolicyStore

pytestmark = pytest.mark.anyio

POLICY = router_policy("{model: router.json, explore: 1.0, explore_concurrency: 1}")


@pytest.fixture
def anyio_backend():
    return "asyncio"


class _Dispatcher:
    """Holds every request until `release` is set, then fails it as a full edge tier would."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.opened: list[Any] = []

    async def open(self, **kw: Any) -> Any:
        self.opened.append(kw)
        await self.release.wait()
        raise OpenAIError(503, "Tier `edge`: no backend available.", type="upstream_error", code="upstream_down")


def _ctx(tmp_path: Path, body: bytes = b'{"model": "auto", "messages": [{"role": "user", "content": "hi"}]}',
         rule: str = "predicted-failure", text: str = POLICY) -> Any:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    active = PolicyStore(path).current
    req, _ = decode_request(body, "chat")
    features = SimpleNamespace(prompt_tokens=3, complexity=0.2, max_tokens=None, temperature=None, stream=False,
                               text="hi")
    return SimpleNamespace(policy=active.policy, decision=SimpleNamespace(rule=rule, tier="cloud"),
                           routing=SimpleNamespace(active=active, tiers={}), req=req, request_id="r1",
                           raw={k: msgspec.Raw(msgspec.json.encode(v)) for k, v in msgspec.json.decode(body).items()},
                           max_tokens=lambda: 16, features=features, tenant=SimpleNamespace(id="t"))


def _explorations(draining: bool = False) -> tuple[Explorations, _Dispatcher, CollectorRegistry, OutcomeRecorder]:
    registry = CollectorRegistry()
    recorder = OutcomeRecorder(None, registry)
    router = LearnedRouter(registry, recorder, random.Random(0))
    dispatcher = _Dispatcher()
    held = SimpleNamespace(routing=SimpleNamespace(tiers={}), release=lambda: None)
    ex = Explorations(dispatcher=dispatcher, router=router, draining=lambda: draining,  # type: ignore[arg-type]
                      hold=lambda routing: held)  # type: ignore[arg-type,return-value]
    return ex, dispatcher, registry, recorder


def _count(registry: CollectorRegistry, result: str) -> float:
    return registry.get_sample_value("tiergate_router_explorations_total", {"result": result}) or 0


async def test_a_failing_edge_is_a_label_and_a_second_exploration_finds_no_room(tmp_path):
    ex, dispatcher, registry, recorder = _explorations()
    ctx = _ctx(tmp_path)
    ex.maybe_start(ctx)
    await eventually(lambda: len(dispatcher.opened) == 1, "the edge asked")
    assert dispatcher.opened[0]["decision"].tier == "edge" and dispatcher.opened[0]["stream"] is False
    ex.maybe_start(ctx)  # explore_concurrency: 1
    assert _count(registry, "skipped") == 1
    dispatcher.release.set()
    await eventually(lambda: _count(registry, "judged") == 1, "the exploration judged")
    await recorder.flush()
    assert isinstance(recorder.sink, MemoryOutcomes)
    [rec] = [msgspec.json.decode(r) for r in recorder.sink.records()]
    assert (rec["label"], rec["reason"], rec["source"], rec["rule"]) == (0, "first_tier_failed", "explore",
                                                                         "predicted-failure")
    await ex.stop()


async def test_draining_tool_calls_and_rules_the_router_did_not_decide_are_not_explored(tmp_path):
    ex, dispatcher, registry, _ = _explorations(draining=True)
    ex.maybe_start(_ctx(tmp_path))
    assert _count(registry, "skipped") == 1
    ex, dispatcher, registry, _ = _explorations()
    tools = (b'{"model": "auto", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", '
             b'"function": {"name": "f", "parameters": {}}}]}')
    ex.maybe_start(_ctx(tmp_path, tools))
    ex.maybe_start(_ctx(tmp_path, rule="cascade"))
    assert _count(registry, "skipped") == 1 and dispatcher.opened == [] and ex.running == 0
    assert registry.get_sample_value("tiergate_router_routed_total",
                                     {"rule": "predicted-failure", "explored": "true"}) == 1


async def test_without_a_cascade_to_judge_by_nothing_is_explored(tmp_path):
    ex, dispatcher, registry, _ = _explorations()
    no_judge = POLICY.replace("explore: 1.0", "explore: 1.0, judge_rule: cascade")
    ctx = _ctx(tmp_path, text=no_judge)
    ctx.routing.active.engine.decision_of = lambda name: None  # type: ignore[method-assign]
    ex.maybe_start(ctx)
    assert _count(registry, "skipped") == 1 and dispatcher.opened == []
