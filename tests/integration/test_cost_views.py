"""What routing costs and saves, against real things: a llama.cpp edge node that registers by heartbeat and prices
its tier by node time at its live throughput, a cascade that keeps some answers and escalates others, the cache,
and the status page's data (series over time, savings beside their quality cost, spend per tenant)."""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.edge import registered_node
from tests.support.instant_upstream import make_app
from tests.support.servers import aiohttp_server, gateway_server
from tests.support.waiting import wait_until
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings
from tiergate.policies.costs import PriceBasis

pytestmark = pytest.mark.integration
ADMIN_KEY = "cost-views-admin-key-0123456789"
KEYS = KeyRing.from_inline("cost-acme=acme:normal,cost-globex=globex:normal")
PER_SECOND, BENCHMARK_TPS = 0.00001, 25  # a small board's power and depreciation


def _policy(path: Path, cloud_url: str, tokenizer: Path) -> Path:
    path.write_text(f"""\
version: 1
defaults:
  timeouts: {{connect_s: 1, first_byte_s: 30, between_chunks_s: 10, total_s: 60, queue_s: 10}}
  cache: {{enabled: true, semantic: false, max_temperature: 0.3}}
  max_tokens: 12
tiers:
  edge: {{kind: edge, model: tiergate-edge, tokenizer: {tokenizer}, max_context: 1024}}
  cloud:
    kind: cloud
    model: tiergate-cloud
    stand_in: true
    endpoints: ["{cloud_url}"]
    tokenizer: {tokenizer}
costs:
  currency: USD
  reference_tier: cloud
  prices:
    cloud: {{prompt_per_1k: 0.0009, completion_per_1k: 0.0009}}
    edge: {{node: {{per_second: {PER_SECOND}, tokens_per_s: {BENCHMARK_TPS}, throughput: live}}}}
rules:
  - name: lenient-cascade       # the tiny model is never this unsure: kept
    when: {{headers: {{x-route: lenient}}}}
    tier: edge
    fallbacks: [cloud]
    cascade: {{min_mean_logprob: -1000, escalate_on_length: false}}
  - name: strict-cascade        # no model is this sure: escalated
    when: {{headers: {{x-route: strict}}}}
    tier: edge
    fallbacks: [cloud]
    cascade: {{min_token_logprob: -0.000001}}
  - name: default
    tier: edge
    fallbacks: [cloud]
""")
    return path


def _metrics(gw) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(gw.url + "/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _sum(samples: dict, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def _by(samples: dict, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for (n, labels), v in samples.items():
        if n == name:
            key = dict(labels)[label]
            out[key] = out.get(key, 0.0) + v
    return out


def test_live_node_prices_the_saving_split_and_the_status_data_with_traffic_running(tmp_path, edge_model,
                                                                                 edge_node_factory):
    with aiohttp_server(make_app(4, model="cloud-standin")) as cloud:
        policy = _policy(tmp_path / "policy.yaml", cloud.url, edge_model.tokenizer_json)
        settings = Settings(policy=policy, embedder=None, redis_url=None, admin_key=ADMIN_KEY, cache=True)
        with gateway_server(settings, keyring=KEYS) as gw:
            gw.gateway.history.step_s = 0.5  # charts with several points within the test
            costs = gw.gateway.policy_store.current.policy.costs
            assert costs is not None and costs.basis("edge") is PriceBasis.BENCHMARK_NO_READING
            registered_node(edge_node_factory, gw, timeout_s=30)
            pool = gw.gateway.tiers["edge"].pool
            marker = uuid.uuid4().hex[:8]
            routes = itertools.cycle([("cost-acme", None), ("cost-globex", "lenient"), ("cost-acme", "strict"),
                                      ("cost-globex", None)])
            sent = itertools.count()

            def one_request() -> None:
                key, route = next(routes)
                n = next(sent)
                text = f"{marker} question {n % 6}"  # every prompt comes back: the cache answers repeats
                r = httpx.post(gw.url + "/v1/chat/completions", timeout=60,
                               headers={"Authorization": f"Bearer {key}", **({"x-route": route} if route else {})},
                               json={"model": "auto", "temperature": 0, "max_tokens": 12,
                                     "messages": [{"role": "user", "content": text}]})
                assert r.status_code == 200, r.text
                assert float(r.headers["x-tiergate-cost"]) >= 0

            def traffic_until(condition) -> bool:
                one_request()
                return bool(condition())

            # the node reports its throughput in its heartbeats; the tier's price follows it
            wait_until(lambda: traffic_until(lambda: costs.basis("edge") is PriceBasis.LIVE), timeout_s=120,
                       interval_s=0.0, what="a heartbeat carrying the node's measured tokens per second")
            reported = [ep.extra["tokens_per_s"] for ep in pool.endpoints() if ep.extra.get("tokens_per_s")]
            found = costs.throughput("edge")
            assert found is not None and found[1] is PriceBasis.LIVE and found[0] > 0
            price = costs.tier_price("edge")
            assert price is not None and price.completion_per_1k == pytest.approx(PER_SECOND / found[0] * 1000)
            assert reported, "the node's heartbeat said how fast it generates"

            # the cascade both keeps and escalates, the cache answers, and the split adds up
            def mixed() -> bool:
                m = _metrics(gw)
                outcomes = _by(m, "tiergate_cascade_total", "outcome")
                saved_by = _by(m, "tiergate_savings_reference_total", "source")
                return bool(outcomes.get("kept") and outcomes.get("escalated") and saved_by.get("cache")
                            and saved_by.get("edge"))

            wait_until(lambda: traffic_until(mixed), timeout_s=120, interval_s=0.0,
                       what="kept and escalated cascades, cache hits and edge answers")
            m = _metrics(gw)
            reference, spend = _by(m, "tiergate_savings_reference_total", "source"), \
                _by(m, "tiergate_savings_spend_total", "source")
            assert set(reference) >= {"edge", "cache", "cascade"}
            split = sum(reference.get(s, 0.0) - spend.get(s, 0.0) for s in reference.keys() | spend.keys())
            assert split == pytest.approx(_sum(m, "tiergate_spend_reference_total") - _sum(m, "tiergate_spend_total"))
            assert spend["cascade"] > 0  # kept answers' node time and escalations' thrown-away attempts

            data = httpx.get(gw.url + "/dashboard/data", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                             timeout=10).json()
            assert data["policy"]["costs"]["tiers"]["edge"]["basis"] == "live"
            assert {t["tenant"] for t in data["history"]["tenants"]} == {"acme", "globex"}
            quality = data["history"]["costs"]["quality"]["cascade"]
            assert quality["kept"] > 0 and quality["escalated"] > 0
            assert httpx.get(gw.url + "/dashboard/data").status_code == 401  # the tenant table is the admin's

            def series() -> dict:
                return httpx.get(gw.url + "/dashboard/data", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                                 timeout=10).json()["history"]["series"]

            wait_until(lambda: traffic_until(lambda: len(series()["t"]) >= 2), timeout_s=60, interval_s=0.0,
                       what="two steps of history")
            s = series()
            assert set(s["saved_by"]) >= {"edge", "cache", "cascade"} and set(s["requests"]) >= {"edge", "cache"}
            assert all(len(v) == len(s["t"]) for v in s["saved_by"].values())
