"""bench/cloud and bench/overhead write policies for `tiergate serve`: they must load as the gateway loads them."""

from __future__ import annotations

from bench.cloud.fronts import ROWS, _policy
from bench.cloud.workloads import REGIMES, requests
from bench.overhead.targets import POLICY
from tiergate.policies.loader import parse_policy


def test_the_cloud_policy_has_one_tier_per_tiergate_row() -> None:
    policy = parse_policy(_policy(["http://127.0.0.1:9001", "http://127.0.0.1:9002"], "served", 8))
    models = {t.model for t in policy.tiers.values()}
    assert {r.model for r in ROWS.values() if r.kind == "tiergate"} <= models
    oracle = next(t for t in policy.tiers.values() if t.model == "cloud-oracle")
    assert oracle.routing.load_bound == 10 and oracle.served_model == "served"
    one = parse_policy(_policy(["http://127.0.0.1:9001"], "served", 8, ["cloud-prefix"]))  # a gateway per row
    assert [t.model for t in one.tiers.values()] == ["cloud-prefix"]


def test_the_overhead_policies_load() -> None:
    parse_policy(POLICY.format(port=9001, defaults=""))
    parse_policy(POLICY.format(port=9001, defaults="defaults:\n  cache: {enabled: true, semantic: true}\n"))


def test_workloads_are_the_same_for_every_router() -> None:
    for regime in REGIMES.values():
        a = requests(50, regime)
        assert a == requests(50, regime) and len(a) == 50
    assert len({s for s, _ in requests(300, REGIMES["longtail"])}) > 60  # a long tail: many apps seen once or twice
