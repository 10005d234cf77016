"""What the gateway presents to backends: per-node keys for nodes registered with their own key, the tier's key
(`api_key_env`) for every other backend, on requests and health polls alike."""

from __future__ import annotations

import asyncio
import ssl

from aiohttp import web
from prometheus_client import CollectorRegistry

from tests.support.servers import aiohttp_server
from tiergate.core.edge_identity import node_api_key, node_key
from tiergate.gateway.pools.access import NODE_KEY_OWNER, BackendAccess, tier_headers
from tiergate.gateway.pools.edge import EdgePool
from tiergate.gateway.pools.metrics import CloudMetrics
from tiergate.gateway.tiers import make_pool
from tiergate.policies.tier_config import TierConfig

SECRET = "gateway-edge-secret-0123456789abcdef"


def test_a_node_registered_with_its_key_is_sent_its_own_api_key_and_any_other_the_tiers():
    access = BackendAccess({"authorization": "Bearer tier-key"}, edge_secret=SECRET)
    own = f"Bearer {node_api_key(node_key(SECRET, 'jetson-01'))}"
    assert access.node_headers("jetson-01", NODE_KEY_OWNER) == {"authorization": own}
    assert access.node_headers("jetson-01", "claim:abc") == {"authorization": "Bearer tier-key"}
    assert BackendAccess().node_headers("jetson-01", NODE_KEY_OWNER) == {}  # no secret: nothing to derive
    assert "tier-key" not in repr(access) and SECRET not in repr(access)


def test_the_tier_key_comes_from_the_environment_variable_the_policy_names():
    assert tier_headers("cloud", "VLLM_API_KEY", {"VLLM_API_KEY": " k-123 "}) == {"authorization": "Bearer k-123"}
    assert tier_headers("cloud", None, {"VLLM_API_KEY": "k"}) == {}
    assert tier_headers("cloud", "VLLM_API_KEY", {}) == {}  # unset: logged, and the backends will answer 401


def test_pools_put_the_keys_on_their_endpoints_and_verify_tls_with_the_gateway_context(monkeypatch):
    monkeypatch.setenv("EDGE_TIER_KEY", "edge-tier-key-0123")
    monkeypatch.setenv("CLOUD_TIER_KEY", "cloud-tier-key-0123")
    tls = ssl.create_default_context()
    base = BackendAccess(tls=tls, edge_secret=SECRET)
    metrics = CloudMetrics(CollectorRegistry())
    edge = make_pool(TierConfig(name="edge", kind="edge", model="e", endpoints=["http://10.0.0.9:8081"],
                                api_key_env="EDGE_TIER_KEY"), None, metrics, base)
    cloud = make_pool(TierConfig(name="cloud", kind="cloud", model="c", endpoints=["https://10.0.0.8:8000"],
                                 api_key_env="CLOUD_TIER_KEY"), None, metrics, base)
    assert isinstance(edge, EdgePool) and edge.access.tls is tls
    assert [e.headers for e in edge.endpoints()] == [{"authorization": "Bearer edge-tier-key-0123"}]
    assert [e.headers for e in cloud.endpoints()] == [{"authorization": "Bearer cloud-tier-key-0123"}]
    asyncio.run(edge.heartbeat({"node_id": "n1", "url": "http://10.0.0.7:8081", "model": "e"},
                               owner=NODE_KEY_OWNER, authoritative=True))
    asyncio.run(edge.heartbeat({"node_id": "n2", "url": "http://10.0.0.6:8081", "model": "e"}, owner="claim:x"))
    by_id = {e.id: e.headers["authorization"] for e in edge.endpoints()}
    assert by_id["n1"] == f"Bearer {node_api_key(node_key(SECRET, 'n1'))}"
    assert by_id["n2"] == "Bearer edge-tier-key-0123"


def test_health_polls_carry_the_key():
    seen: list[str | None] = []

    async def health(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"status": "ok", "slots": 2, "busy": 0, "queued": 0, "model": "m"})

    app = web.Application()
    app.router.add_get("/health", health)
    with aiohttp_server(app) as node:
        async def scenario() -> None:
            pool = EdgePool("edge", [node.url], "m", poll_interval_s=0.05,
                            access=BackendAccess({"authorization": "Bearer tier-key-0123"}))
            await pool.start()
            try:
                for _ in range(200):
                    if seen:
                        return
                    await asyncio.sleep(0.02)
            finally:
                await pool.stop()

        asyncio.run(scenario())
    assert seen and set(seen) == {"Bearer tier-key-0123"}
