"""bench/cloud and bench/overhead write policies for `tiergate serve`: they must load as the gateway loads them."""

from __future__ import annotations

from pathlib import Path

from bench.cloud.fronts import ROWS, _policy
from bench.cloud.workloads import REGIMES, requests
from bench.overhead.targets import POLICY, ROUTER, ROUTER_RULE, router_artifact
from tiergate.core.types import Features, Priority
from tiergate.policies.loader import parse_policy
from tiergate.policies.router_config import offline_router


def test_the_cloud_policy_has_one_tier_per_tiergate_row() -> None:
    policy = parse_policy(_policy(["http://127.0.0.1:9001", "http://127.0.0.1:9002"], "served", 8))
    models = {t.model for t in policy.tiers.values()}
    assert {r.model for r in ROWS.values() if r.kind == "tiergate"} <= models
    oracle = next(t for t in policy.tiers.values() if t.model == "cloud-oracle")
    assert oracle.routing.load_bound == 10 and oracle.served_model == "served"
    one = parse_policy(_policy(["http://127.0.0.1:9001"], "served", 8, ["cloud-prefix"]))  # a gateway per row
    assert [t.model for t in one.tiers.values()] == ["cloud-prefix"]


def test_the_overhead_policies_load() -> None:
    parse_policy(POLICY.format(port=9001, defaults="", rules=""))
    parse_policy(POLICY.format(port=9001, defaults="defaults:\n  cache: {enabled: true, semantic: true}\n",
                               rules=""))


def test_the_router_variant_predicts_for_every_request_and_routes_none(tmp_path: Path) -> None:
    model = router_artifact(tmp_path / "edge-router.json")
    policy = parse_policy(POLICY.format(port=9001, defaults=ROUTER.format(model=model), rules=ROUTER_RULE))
    assert policy.router is not None and policy.router.explore == 0
    tiers = {n: (t.kind, t.served_model or t.model) for n, t in policy.tiers.items()}
    version, predict = offline_router(policy.router, policy.resolve_path(policy.router.model), tiers, None)
    assert version == "tiergate-edge" and predict is not None  # a model for the edge's version: not a cold start
    f = predict(Features(prompt_tokens=12, priority=Priority.NORMAL, complexity=0.3, requested_model="auto",
                         tenant="bench", text="bench prompt 1: how do edge and cloud tiers share traffic?"))
    assert f.edge_success is not None and 0 < f.edge_success < 1  # never 0: the `max: 0.0` rule sends none away


def test_workloads_are_the_same_for_every_router() -> None:
    for regime in REGIMES.values():
        a = requests(50, regime)
        assert a == requests(50, regime) and len(a) == 50
    assert len({s for s, _ in requests(300, REGIMES["longtail"])}) > 60  # a long tail: many apps seen once or twice
