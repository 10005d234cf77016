"""The learned router on the request path: cold start leaves Features as they are, a model answers for its own edge
version only and is reloaded when its file changes (a bad file keeps the last good model), exploration draws its
share, and outcome records are bounded and keep no prompt unless the tenant opted in (fakes at the pool boundary;
tests/integration/test_learned_router.py runs it through a real gateway, edge node and Redis)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from types import SimpleNamespace

import msgspec
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from tests.support.router_policy import router_policy
from tests.support.waiting import wait_until
from tiergate.complexity.edge_router import DENSE, HASH_BUCKETS, RouterArtifact, RouterModel
from tiergate.core.types import Features, Priority
from tiergate.gateway.learned_router import LearnedRouter
from tiergate.gateway.outcomes import MemoryOutcomes, OutcomeRecorder
from tiergate.gateway.tiers import Routing
from tiergate.policies.store import PolicyStore

POLICY = router_policy("{model: router.json, explore: 0.25, max_records: 100}")


def _routing(tmp_path: Path, text: str = POLICY, served: tuple[str, ...] = ("smollm2",)) -> Routing:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    active = PolicyStore(path).current
    pool = SimpleNamespace(endpoints=lambda: [SimpleNamespace(model=m) for m in served])
    tiers = {n: SimpleNamespace(config=c, pool=pool) for n, c in active.policy.tiers.items()}
    return Routing(active, tiers)  # type: ignore[arg-type]


def _save(path: Path, version: str, bias: float) -> None:
    RouterArtifact({version: RouterModel(version, np.zeros(DENSE + HASH_BUCKETS), bias)}).save(path)


def _features() -> Features:
    return Features(prompt_tokens=12, priority=Priority.NORMAL, complexity=0.3, requested_model="auto",
                    tenant="t", text="Which is a metal?\nA. iron\nB. water\nC. air\nD. wood")


def _router(seed: int = 0) -> tuple[LearnedRouter, CollectorRegistry]:
    registry = CollectorRegistry()
    return LearnedRouter(registry, OutcomeRecorder(None, registry), random.Random(seed)), registry


def test_cold_start_leaves_the_features_as_they_are(tmp_path):
    router, registry = _router()
    routing = _routing(tmp_path)
    f = _features()
    assert router.annotate(f, routing.policy, routing) is f
    assert registry.get_sample_value("tiergate_router_predictions_total", {"model": "false"}) == 1


def test_a_model_answers_for_its_own_edge_version_only(tmp_path):
    router, _ = _router()
    _save(tmp_path / "router.json", "smollm2", -3.0)
    routing = _routing(tmp_path)
    p = router.annotate(_features(), routing.policy, routing).edge_success
    assert p == pytest.approx(1 / (1 + np.exp(3.0)))
    promoted = _routing(tmp_path, served=("smollm2-v2",))  # a new edge model: no model of its own yet
    assert router.annotate(_features(), promoted.policy, promoted).edge_success is None


def test_the_edge_version_is_what_most_backends_serve(tmp_path):
    routing = _routing(tmp_path, served=("new", "old", "new"))
    assert LearnedRouter.edge_version(routing, "edge") == "new"
    assert LearnedRouter.edge_version(_routing(tmp_path, served=("old", "new", "new")), "edge") == "new"
    assert LearnedRouter.edge_version(_routing(tmp_path, served=("v", "v")), "edge") == "v"
    assert LearnedRouter.edge_version(_routing(tmp_path, served=()), "edge") == "tiergate-edge"


def test_a_policy_without_edge_success_pays_nothing(tmp_path):
    router, registry = _router()
    _save(tmp_path / "router.json", "smollm2", -3.0)
    text = POLICY.replace("  - name: predicted-failure\n    when: {edge_success: {max: 0.2}}\n    tier: cloud\n", "")
    routing = _routing(tmp_path, text)
    f = _features()
    assert router.annotate(f, routing.policy, routing) is f
    assert registry.get_sample_value("tiergate_router_predictions_total", {"model": "true"}) is None


def test_a_rewritten_model_is_used_without_restart_and_a_bad_one_keeps_the_last_good(tmp_path):
    router, registry = _router()
    path = tmp_path / "router.json"
    routing = _routing(tmp_path)

    def p() -> float | None:
        return router.annotate(_features(), routing.policy, routing).edge_success

    assert p() is None
    _save(path, "smollm2", 3.0)
    wait_until(lambda: p() is not None and p() > 0.9, timeout_s=10, what="the new model in force")
    path.write_text("{not json")

    def bad_file_seen() -> bool:
        kept = p()  # each prediction may look at the file again
        assert kept is not None and kept > 0.9  # the last good model, all along
        return (registry.get_sample_value("tiergate_router_model_reloads_total", {"result": "invalid"}) or 0) >= 1

    wait_until(bad_file_seen, timeout_s=10, what="the bad file seen")
    path.unlink()
    wait_until(lambda: p() is None, timeout_s=10, what="a deleted model is a cold start again")


def test_exploration_draws_its_share_of_the_routed_rules_only(tmp_path):
    router, registry = _router(seed=1)
    policy = _routing(tmp_path).policy
    draws = [router.explore(policy, "predicted-failure") for _ in range(4000)]
    assert 0.22 < sum(draws) / len(draws) < 0.28
    assert not any(router.explore(policy, "cascade") for _ in range(100))  # not a routed rule
    routed = {e: registry.get_sample_value("tiergate_router_routed_total", {"rule": "predicted-failure",
                                                                            "explored": e}) for e in ("true", "false")}
    assert routed["true"] == sum(draws) and routed["true"] + routed["false"] == 4000
    assert registry.get_sample_value("tiergate_router_explore_share") == 0.25


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_outcome_records_are_bounded_and_keep_no_prompt_unless_opted_in(tmp_path, anyio_backend):
    registry = CollectorRegistry()
    recorder = OutcomeRecorder(None, registry)
    opted = POLICY + "distill: {tenants: [opted], redact: {patterns: ['[0-9]{4}']}}\n"
    policy = _routing(tmp_path, opted).policy
    f = Features(prompt_tokens=9, priority=Priority.NORMAL, complexity=0.2, requested_model="auto", tenant="x",
                 text="my PIN is 1234, what is 2+2?")
    for i in range(150):
        recorder.record(policy=policy, features=f, tenant="opted" if i == 149 else "other", rule="cascade",
                        edge_version="smollm2", stood=i % 2 == 0, reason="confident", source="cascade")
    await recorder.flush()
    assert isinstance(recorder.sink, MemoryOutcomes)
    records = [msgspec.json.decode(r) for r in recorder.sink.records()]
    assert len(records) == 100  # max_records
    assert all("prompt" not in r for r in records[:-1]) and "PIN" not in str(records[:-1])
    assert records[-1]["prompt"] == "my PIN is [REDACTED], what is 2+2?"
    assert {r["edge_version"] for r in records} == {"smollm2"} and records[0]["fv"] == 1
    assert registry.get_sample_value("tiergate_router_outcomes_total", {"source": "cascade", "stood": "true"}) == 75


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_policy_that_does_not_record_writes_nothing(tmp_path, anyio_backend):
    recorder = OutcomeRecorder(None, CollectorRegistry())
    policy = _routing(tmp_path, POLICY.replace("max_records: 100", "max_records: 100, record: false")).policy
    recorder.record(policy=policy, features=_features(), tenant="t", rule="cascade", edge_version="v", stood=True,
                    reason="confident", source="cascade")
    await asyncio.sleep(0)
    assert isinstance(recorder.sink, MemoryOutcomes) and recorder.sink.records() == []
