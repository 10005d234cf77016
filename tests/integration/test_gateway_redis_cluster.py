"""Two real gateways whose shared state (cache, rate limits, edge registry) lives on a three-node Redis Cluster."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import write_policy
from tests.support.instant_upstream import make_app
from tests.support.registration import CLAIM
from tests.support.servers import aiohttp_server, gateway_server
from tests.support.waiting import wait_until
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KEY = "cluster-key-123"


def keyring(tmp_path: Path) -> KeyRing:
    keys = tmp_path / "keys.yaml"
    keys.write_text("tenants:\n  acme: {requests_per_minute: 6}\nkeys:\n  - {tenant: acme, key: cluster-key-123}\n")
    return KeyRing.from_file(keys)


def chat(url: str, text: str, *, stream: bool = False) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"}, timeout=30,
                      json={"model": "auto", "messages": [{"role": "user", "content": text}], "max_tokens": 5,
                            "temperature": 0, "stream": stream})


def fail_open(*gateways) -> float:
    """Limit checks that skipped Redis, over the gateways' own registries."""
    return sum(g.gateway.registry.get_sample_value("tiergate_rate_limit_fail_open_total") or 0.0 for g in gateways)


def test_two_gateways_share_cache_limits_and_edge_registry(tmp_path: Path, redis_cluster_url):
    with aiohttp_server(make_app(3, "ok", model="edge-model")) as edge, \
            aiohttp_server(make_app(3, "ok", model="cloud-model")) as cloud:
        pol = write_policy(tmp_path / "policy.yaml", [], [cloud.url], cache=True)
        settings = Settings(policy=pol, embedder=None, redis_url=redis_cluster_url)
        with gateway_server(settings, keyring=keyring(tmp_path), ready=False) as one, \
                gateway_server(settings, keyring=keyring(tmp_path), ready=False) as two:
            beat = httpx.post(one.url + "/edge/v1/heartbeat", timeout=5, headers=CLAIM, json={
                "node_id": "node-a", "url": edge.url, "model": "edge-model", "slots": 4, "busy": 0, "queued": 0,
                "ctx": 2048})
            assert beat.status_code == 200, beat.text
            pool_two = two.gateway.tiers["edge"].pool  # heard by gateway one, known to two through the cluster
            wait_until(lambda: any(e.id == "node-a" for e in pool_two.endpoints()), timeout_s=20,
                       what="gateway two to learn the edge node")

            first = chat(one.url, "What is a hash slot?")
            assert first.status_code == 200 and first.headers["x-tiergate-cache"] == "miss"
            assert first.headers["x-tiergate-tier"] == "edge"
            again = chat(two.url, "What is a hash slot?", stream=True)  # the other gateway, as a stream
            assert again.status_code == 200 and again.headers["x-tiergate-cache"] == "hit-exact"
            assert again.text.rstrip().endswith("data: [DONE]")

            answered = [chat((one, two)[i % 2].url, f"question {i}").status_code for i in range(6)]
            assert answered == [200, 200, 200, 200, 429, 429]  # 6 per minute, counted across both gateways
            limited = chat(one.url, "one more")
            assert limited.json()["error"]["code"] == "rate_limit_exceeded" and "retry-after" in limited.headers
            assert fail_open(one, two) == 0  # every limit check reached the cluster
