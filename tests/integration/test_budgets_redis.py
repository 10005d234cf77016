"""Budgets and spend on real Redis (7 and 8, and the ledger on a three-node Cluster): two gateway replicas share
one ledger, 50 concurrent requests at the edge of a budget never overshoot it, spend recorded by one replica is
read on the other, and a hard budget does what the policy says while Redis is down.

The gateways run in process (`tests.support.inprocess`) in front of an instant backend; prices make each request's
worst case exactly its cost (a completion token costs 1 USD on the edge, prompts nothing, and the backend answers
`max_tokens` tokens), so the number a budget admits is known exactly."""

from __future__ import annotations

import asyncio
import datetime as dt
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from tests.gateway.conftest import write_policy
from tests.support.inprocess import in_process
from tests.support.instant_upstream import make_app
from tests.support.ports import free_port
from tests.support.servers import aiohttp_server
from tiergate.cache.redis.conn import open_redis
from tiergate.core.errors import OpenAIError
from tiergate.gateway.auth import KeyRing, hash_key
from tiergate.gateway.budgets import Budgets
from tiergate.gateway.ledger import NANO, Counter, RedisLedger, counter_key
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.settings import Settings
from tiergate.policies.loader import parse_policy

pytestmark = [pytest.mark.integration, pytest.mark.anyio, pytest.mark.timeout(180)]

KEYS = KeyRing.from_inline("key-alpha-1=alpha,key-alpha-2=alpha")
A1, A2 = ({"Authorization": f"Bearer {k}"} for k in ("key-alpha-1", "key-alpha-2"))
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 1}


def _sections(on_redis_down: str = "refuse") -> str:
    return f"""
costs:
  currency: USD
  reference_tier: cloud
  prices:
    edge: {{completion_per_1k: 1000}}
    cloud: {{completion_per_1k: 2000}}
budgets:
  on_redis_down: {on_redis_down}
  tenants:
    alpha: {{period: day, hard: 100, soft: 50}}
"""


def _policy_file(tmp_path: Path, backend: str, on_redis_down: str = "refuse") -> Path:
    path = write_policy(tmp_path / "policy.yaml", [backend], [backend], fallback=False, cache=False)
    path.write_text(path.read_text() + _sections(on_redis_down))
    return path


async def _counter(url: str) -> int:
    day = dt.datetime.now(dt.UTC).date().isoformat()
    client = aioredis.Redis.from_url(url)
    try:
        return int(await client.get(counter_key("tg:spend", "alpha", "tenant", day)) or 0)
    finally:
        await client.aclose()


async def test_fifty_concurrent_requests_on_two_replicas_never_overshoot_a_hard_budget(tmp_path, redis_url):
    """A budget of 100 and requests that each cost (and reserve) 4: of 50 sent at once, half to each replica,
    exactly 25 are answered and 25 refused, the ledger holds exactly 100, and either replica reports the spend
    both recorded."""
    with aiohttp_server(make_app(8, "ok", model="edge-model")) as backend:
        settings = Settings(policy=_policy_file(tmp_path, backend.url), embedder=None, redis_url=redis_url)
        async with AsyncExitStack() as es:
            a = await es.enter_async_context(in_process(settings, KEYS))
            b = await es.enter_async_context(in_process(settings, KEYS))
            answers = await asyncio.gather(*(
                (a if i % 2 else b).post("/v1/chat/completions", json=CHAT, headers=A1 if i % 3 else A2)
                for i in range(50)))
            ok = [r for r in answers if r.status_code == 200]
            refused = [r for r in answers if r.status_code != 200]
            assert len(ok) == 25 and len(refused) == 25, [r.status_code for r in answers]
            assert sum(float(r.headers["x-tiergate-cost"]) for r in ok) == 100.0
            assert {r.status_code for r in refused} == {429}
            assert {r.json()["error"]["code"] for r in refused} == {"budget_exceeded"}
            assert await _counter(redis_url) == 100 * NANO  # every reservation settled: nothing over, nothing lost
            one = (await a.get("/v1/usage", headers=A1)).json()
            two = (await b.get("/v1/usage", headers=A2)).json()
            assert one["spend"] + two["spend"] == 100.0 and one["requests"] + two["requests"] == 25
            assert one["budgets"]["tenant"]["remaining"] == two["budgets"]["tenant"]["remaining"] == 0.0
            again = await b.get("/v1/usage", headers=A1)
            assert again.json()["spend"] == one["spend"]  # replica b reads what replica a recorded


@pytest.mark.parametrize(("on_redis_down", "status"), [("refuse", 503), ("allow", 200)])
async def test_with_redis_down_a_hard_budget_does_what_the_policy_says(tmp_path, on_redis_down, status):
    with aiohttp_server(make_app(8, "ok", model="edge-model")) as backend:
        nowhere = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there: Redis is down
        settings = Settings(policy=_policy_file(tmp_path, backend.url, on_redis_down), embedder=None,
                            redis_url=nowhere)
        async with in_process(settings, KEYS) as gw:
            r = await gw.post("/v1/chat/completions", json=CHAT, headers=A1)
            assert r.status_code == status, r.text
            metrics = (await gw.get("/metrics")).text
            usage = await gw.get("/v1/usage", headers=A1)
    if on_redis_down == "refuse":
        assert r.json()["error"]["code"] == "budget_unavailable" and r.headers["retry-after"]
    else:
        assert 'tiergate_budget_unchecked_total{tenant="alpha"} 1.0' in metrics
    assert 'tiergate_spend_ledger_errors_total{op="reserve"} 1.0' in metrics
    assert usage.status_code == 503 and usage.json()["error"]["code"] == "usage_unavailable"


async def _ledger_check(url: str) -> None:
    """Two replicas' ledgers: one atomic check-and-take across them, settling to the real cost."""
    policy = parse_policy(f"""\
version: 1
tiers:
  edge: {{kind: edge, model: tiergate-edge}}
costs: {{currency: USD, reference_tier: edge, prices: {{edge: {{completion_per_1k: 1000}}}}}}
budgets:
  tenants:
    alpha:
      hard: 10
      keys:
        {hash_key("key-alpha-1")}: {{hard: 4}}
rules:
  - {{name: default, tier: edge}}
""")
    replicas = [Budgets(GatewayMetrics(CollectorRegistry()), RedisLedger(open_redis(url)), timeout_s=5.0)
                for _ in range(2)]
    key = hash_key("key-alpha-2")
    got = await asyncio.gather(*(replicas[i % 2].reserve(policy, "alpha", key, 1.5) for i in range(20)),
                               return_exceptions=True)
    holds = [h for h, _ in (g for g in got if not isinstance(g, BaseException))]
    assert len(holds) == 6 and all(isinstance(g, OpenAIError) for g in got if isinstance(g, BaseException))
    for i, hold in enumerate(holds):  # each used 1 of its 1.5: 3 given back in all
        await replicas[i % 2].settle(hold, policy, "alpha", key, 1.0, {"cost": 1.0, "requests": 1})
    with pytest.raises(OpenAIError):  # the key's own 4 holds even though the tenant has 4 left
        await replicas[0].reserve(policy, "alpha", hash_key("key-alpha-1"), 4.5)
    hold, _ = await replicas[1].reserve(policy, "alpha", hash_key("key-alpha-1"), 4.0)
    assert hold is not None
    usage = await replicas[0].usage(policy, "alpha", key)
    assert (usage.spend, usage.requests, usage.budgets["tenant"]["remaining"]) == (6.0, 6, 0.0)


async def test_the_ledger_is_shared_and_atomic_on_redis(redis_url):
    await _ledger_check(redis_url)


async def test_the_ledger_is_shared_and_atomic_on_a_redis_cluster(redis_cluster_url):
    await _ledger_check(redis_cluster_url)


async def test_a_reservation_that_does_not_fit_takes_nothing_on_redis(redis_url):
    ledger = RedisLedger(open_redis(redis_url))
    t, k = Counter("tg:spend:{x}:t", 10, 60), Counter("tg:spend:{x}:k", 3, 60)
    assert await ledger.reserve([t, k], 2) is None
    assert await ledger.reserve([t, k], 2) == (1, 2)
    assert await ledger.settle([t, k], -1, "tg:spend:{x}:day:d", {"cost": 0.5}, 60) == [1, 1]
    assert (await ledger.read([t.key, k.key], ["tg:spend:{x}:day:d"], ["cost"])) == ([1, 1], [0.5])
    client = aioredis.Redis.from_url(redis_url)
    try:
        ttl = await client.ttl(t.key)
        assert 0 < ttl <= 60 and 0 < await client.ttl("tg:spend:{x}:day:d") <= 60  # every entry expires
    finally:
        await client.aclose()
