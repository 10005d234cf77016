"""gateway/history: the status page's series over time and spend table, read from the gateway's own counters."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from tiergate.cache.metrics import CacheMetrics
from tiergate.gateway.history import History
from tiergate.gateway.metrics import GatewayMetrics


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def parts() -> tuple[GatewayMetrics, CacheMetrics, History, Clock]:
    registry, clock = CollectorRegistry(), Clock()
    return GatewayMetrics(registry), CacheMetrics(registry), History(registry, step_s=5, points=3, clock=clock), clock


def _request(m: GatewayMetrics, tier: str, cache: str, n: int = 1) -> None:
    m.requests.labels("chat", tier, "default", cache, "200").inc(n)


def test_each_point_is_what_happened_in_its_step(parts) -> None:
    m, cache, history, clock = parts
    history.sample()  # the base: nothing yet
    _request(m, "edge", "miss", 3)
    _request(m, "cloud", "miss", 1)
    m.spend.labels("acme", "edge", "default", "answer", "USD").inc(0.5)
    m.spend_reference.labels("acme", "edge", "default", "USD").inc(2.0)
    m.savings_spend.labels("edge", "USD").inc(0.5)
    m.savings_reference.labels("edge", "USD").inc(2.0)
    m.cascade.labels("casc", "kept", "confident").inc(3)
    m.cascade.labels("casc", "escalated", "low_mean_logprob").inc(1)
    clock.t += 5
    history.sample()
    _request(m, "cache", "hit-exact", 2)
    _request(m, "edge", "miss", 2)
    m.spend.labels("globex", "cloud", "default", "answer", "USD").inc(1.0)
    m.spend_reference.labels("globex", "cloud", "default", "USD").inc(1.0)
    m.spend_reference.labels("acme", "cache", "default", "USD").inc(0.25)
    m.savings_reference.labels("cache", "USD").inc(0.25)
    m.spend.labels("acme", "cloud", "default", "shadow", "USD").inc(0.05)  # a shadow check of the hit
    m.savings_spend.labels("cache", "USD").inc(0.05)
    clock.t += 5
    history.sample()

    snap = history.snapshot()
    s = snap["series"]
    assert s["t"] == [1005.0, 1010.0]
    assert s["requests"] == {"cache": [0, 2], "cloud": [1, 0], "edge": [3, 2]}
    assert s["spend"] == pytest.approx([0.5, 1.05])
    assert s["saved"] == pytest.approx([1.5, 0.2])
    assert s["saved_by"]["cache"] == pytest.approx([0.0, 0.2]) and s["saved_by"]["edge"] == pytest.approx([1.5, 0])
    assert s["hit_rate"] == pytest.approx([0.0, 0.5])
    assert s["cascade_kept_rate"] == [0.75, None]  # nothing judged in the second step: no rate, not 0
    costs = snap["costs"]
    assert costs["currency"] == "USD" and (costs["spend"], costs["reference"]) == pytest.approx((1.55, 3.25))
    assert costs["saved"] == pytest.approx(1.7) and costs["saved_by"] == pytest.approx({"cache": 0.2, "edge": 1.5})
    assert costs["saved"] == pytest.approx(sum(costs["saved_by"].values()))
    assert costs["quality"]["cascade"] == {"kept": 3, "escalated": 1, "escalated_share": 0.25}
    assert snap["tenants"] == [  # largest spend first
        {"tenant": "globex", "spend": 1.0, "reference": 1.0, "saved": 0.0},
        {"tenant": "acme", "spend": 0.55, "reference": 2.25, "saved": pytest.approx(1.7)}]
    assert snap["tenants_total"] == 2


def test_quality_signals_come_from_the_caches_shadow_checks_and_feedback(parts) -> None:
    m, cache, history, _ = parts
    cache.verifications.labels("acme", "verify", "right").inc(9)
    cache.verifications.labels("acme", "verify", "wrong").inc(1)
    cache.verifications.labels("acme", "feedback", "wrong").inc(2)
    cache.verifications.labels("acme", "feedback", "right").inc(2)
    cache.verifications.labels("acme", "judge", "wrong").inc(50)  # a judge's near misses: not a served answer
    history.sample()
    q = history.snapshot()["costs"]["quality"]
    assert q["shadow_checks"] == {"checked": 10, "wrong": 1, "wrong_share": 0.1}
    assert q["cache_feedback"] == {"right": 2, "wrong": 2, "wrong_share": 0.5}
    assert q["cascade"]["escalated_share"] is None


def test_nothing_sampled_yet_is_an_empty_page_not_an_error(parts) -> None:
    _, _, history, _ = parts
    snap = history.snapshot()
    assert snap["series"]["t"] == [] and snap["tenants"] == [] and snap["costs"]["saved"] == 0


def test_the_window_is_bounded_and_counters_that_go_back_leave_a_gap(parts) -> None:
    m, _, history, clock = parts
    for _ in range(6):
        _request(m, "edge", "miss")
        clock.t += 5
        history.sample()
    assert len(history.snapshot()["series"]["t"]) == 3  # points=3
    m.requests.clear()  # a counter back at 0 (a restart of what feeds it)
    _request(m, "edge", "miss")
    clock.t += 5
    history.sample()
    assert len(history.snapshot()["series"]["t"]) == 2 and history.snapshot()["series"]["requests"]["edge"] == [1, 1]


def test_started_it_samples_every_step_until_stopped() -> None:
    registry = CollectorRegistry()
    m, history = GatewayMetrics(registry), History(registry, step_s=0.01)

    async def run() -> int:
        await history.start()
        _request(m, "edge", "miss")
        for _ in range(500):
            if sum(sum(v) for v in history.snapshot()["series"]["requests"].values()) == 1:
                break
            await asyncio.sleep(0.01)
        await history.stop()
        return sum(sum(v) for v in history.snapshot()["series"]["requests"].values())

    assert asyncio.run(run()) == 1
