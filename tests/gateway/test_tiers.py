"""The gateway's tiers: which pool a policy tier gets, how its config reaches the pool, and how a reload moves
requests from one routing version to the next."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.support.waiting import eventually
from tiergate.gateway import tiers as tiers_module
from tiergate.gateway.pools.cloud import CloudPool, CloudPoolSettings
from tiergate.gateway.pools.edge import EdgePool
from tiergate.gateway.pools.metrics import CloudMetrics
from tiergate.gateway.tiers import Tiers, make_pool
from tiergate.policies.store import ActivePolicy, PolicyStore
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


# ---- routing versions: a reload, and who still holds the version before it --------------------------------------

class _FakePool:
    """Start and stop, counted; nothing else of a pool is used by `Tiers`."""

    def __init__(self, name: str, fail: bool = False) -> None:
        self.name, self.fail, self.started, self.stopped = name, fail, 0, 0

    async def start(self) -> None:
        if self.fail:
            raise OSError(f"{self.name} cannot start")
        self.started += 1

    async def stop(self) -> None:
        self.stopped += 1

    def endpoints(self) -> list:
        return []


def _active(tmp_path: Path, tiers: dict[str, str]) -> ActivePolicy:
    """A policy whose tiers are `name: endpoint`, loaded as the store would load it."""
    lines = "".join(f'  {n}: {{kind: edge, model: m-{n}, endpoints: ["{url}"]}}\n' for n, url in tiers.items())
    rule = next(iter(tiers))
    path = tmp_path / "p.yaml"
    path.write_text(f"version: 1\ntiers:\n{lines}rules:\n  - {{name: r, tier: {rule}}}\n")
    return PolicyStore(path).current


@pytest.fixture
def pools(monkeypatch) -> dict[str, list[_FakePool]]:
    """Every pool `Tiers` builds, by tier name; a tier named `broken` cannot start."""
    built: dict[str, list[_FakePool]] = {}

    def make(config, redis, metrics, access=None):
        pool = _FakePool(config.name, fail=config.name == "broken")
        built.setdefault(config.name, []).append(pool)
        return pool

    monkeypatch.setattr(tiers_module, "make_pool", make)
    return built


@pytest.mark.anyio
async def test_a_version_still_held_keeps_its_pools_and_they_stop_when_the_last_request_ends(tmp_path, pools):
    tiers = Tiers(None, METRICS)
    await tiers.sync(_active(tmp_path, {"edge": "http://a:1", "cloud": "http://c:1"}))
    first = tiers.current
    a, b = tiers.hold(), tiers.hold()
    await tiers.sync(_active(tmp_path, {"edge": "http://a:1", "fresh": "http://f:1"}))  # `cloud` goes
    assert tiers.current is not first and tiers["edge"] is first.tiers["edge"]  # unchanged: the same pool
    assert "cloud" not in tiers and pools["cloud"][0].stopped == 0  # two requests still hold version 1
    a.release()
    a.release()  # given back once, however often released
    assert tiers.held_versions == 2 and pools["cloud"][0].stopped == 0
    b.release()
    await eventually(lambda: pools["cloud"][0].stopped == 1, "the retired pool stopped")
    assert pools["edge"][0].stopped == 0 and tiers.held_versions == 1  # still in use by version 2
    assert tiers.hold(first) is None  # nothing holds version 1: a late check cannot revive it
    await tiers.stop()
    assert [p.stopped for p in (*pools["edge"], *pools["fresh"], *pools["cloud"])] == [1, 1, 1]


@pytest.mark.anyio
async def test_a_pool_two_old_versions_share_stops_once_both_have_ended(tmp_path, pools):
    tiers = Tiers(None, METRICS)
    await tiers.sync(_active(tmp_path, {"edge": "http://a:1"}))
    v1 = tiers.hold()
    await tiers.sync(_active(tmp_path, {"edge": "http://a:1", "extra": "http://x:1"}))  # `edge` kept
    v2 = tiers.hold()
    await tiers.sync(_active(tmp_path, {"other": "http://o:1"}))  # `edge` gone from version 3
    v2.release()
    await asyncio.sleep(0)
    assert pools["edge"][0].stopped == 0 and pools["extra"][0].stopped  # version 1 still uses `edge`
    v1.release()
    await eventually(lambda: pools["edge"][0].stopped == 1, "`edge` stopped once nothing held it")
    await tiers.stop()
    assert pools["edge"][0].stopped == 1


@pytest.mark.anyio
async def test_a_version_whose_pool_cannot_start_is_never_served_and_leaves_nothing_running(tmp_path, pools):
    tiers = Tiers(None, METRICS)
    await tiers.sync(_active(tmp_path, {"edge": "http://a:1"}))
    first = tiers.current
    with pytest.raises(OSError, match="broken cannot start"):
        await tiers.sync(_active(tmp_path, {"fresh": "http://f:1", "broken": "http://b:1"}))
    assert tiers.current is first and pools["fresh"][0].stopped == 1 and pools["edge"][0].stopped == 0
