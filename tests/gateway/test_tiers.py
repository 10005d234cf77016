"""The gateway's tiers: which pool a policy tier gets, and how its config reaches the pool."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from tiergate.gateway.pools.cloud import CloudPool, CloudPoolSettings
from tiergate.gateway.pools.edge import EdgePool
from tiergate.gateway.pools.metrics import CloudMetrics
from tiergate.gateway.tiers import make_pool
from tiergate.policies.tier_config import TierConfig

MODEL = "served-model"
METRICS = CloudMetrics(CollectorRegistry())


def test_a_cloud_tier_config_reaches_its_vllm_pool() -> None:
    tier = TierConfig(name="cloud", kind="cloud", model="public-name", served_model=MODEL,
                      endpoints=["http://a:8000/"],
                      discovery={"dns": "vllm.svc", "port": 8001, "scheme": "https", "interval_s": 3},
                      routing={"strategy": "least_load", "load_bound": 2.0, "cached_load_bound": 2.5, "affinity_chars": 64,
                               "max_num_seqs": 64})
    pool = make_pool(tier, None, METRICS)
    assert isinstance(pool, CloudPool) and pool.metrics is METRICS
    assert pool.settings == CloudPoolSettings(
        "cloud", MODEL, ("http://a:8000",), dns="vllm.svc", port=8001, scheme="https", dns_interval_s=3, slots=64,
        strategy="least_load", load_bound=2.0, cached_load_bound=2.5, affinity_chars=64, max_context=tier.max_context)
    assert (pool.tier, pool.model, pool.strategy) == ("cloud", MODEL, "least_load")
    assert (pool.selector.bound, pool.selector.affinity_chars) == (2.0, 64)
    assert pool.selector.cached_bound == 2.5
    assert [(e.id, e.base_url, e.slots) for e in pool.endpoints()] == [("a:8000", "http://a:8000", 64)]
    bare_tier = TierConfig(name="c2", kind="cloud", model=MODEL, endpoints=["http://b:8000"])
    bare = make_pool(bare_tier, None, METRICS)
    assert isinstance(bare, CloudPool)
    assert bare.settings == CloudPoolSettings("c2", MODEL, ("http://b:8000",), max_context=bare_tier.max_context)
    assert (bare.model, bare.strategy, bare.endpoints()[0].slots) == (MODEL, "prefix", 256)
    assert bare.selector.bound == 1.2 and bare.selector.cached_bound == pytest.approx(1.8)


def test_edge_tiers_and_cloud_stand_ins_get_the_edge_pool() -> None:
    edge = make_pool(TierConfig(name="edge", kind="edge", model="e", endpoints=["http://a:8081"]), None, METRICS)
    stand_in = make_pool(TierConfig(name="cloud", kind="cloud", model="c", stand_in=True,
                                    endpoints=["http://b:8090"]), None, METRICS)
    assert isinstance(edge, EdgePool) and isinstance(stand_in, EdgePool)
    assert [e.base_url for e in stand_in.endpoints()] == ["http://b:8090"]
