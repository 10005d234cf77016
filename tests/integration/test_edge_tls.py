"""An edge node serving HTTPS with its own key, behind a gateway that verifies its certificate (issue 39, item 3).

A real `edge-node serve` (tiny INT4 model) with a self-signed certificate made here, `--node-key` and `--gateway`:
it registers with a gateway in per-node-key mode whose TIERGATE_BACKEND_CA_FILE is that certificate, and the
gateway's requests reach it over TLS with the node's API key. Asked directly, the node answers 401 without the key.
Gateways that do not trust the certificate, or do not present the key, get nothing from it.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import write_policy
from tests.support.instant_upstream import make_app
from tests.support.servers import aiohttp_server, free_port, gateway_server
from tests.support.tls import self_signed
from tests.support.waiting import wait_until
from tiergate.core.edge_identity import node_api_key, node_key
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
KEYS = KeyRing.from_inline("tls-key-1=acme:normal")
API = {"Authorization": "Bearer tls-key-1"}
SECRET = "gateway-edge-secret-0123456789abcdef"
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "temperature": 0}


def _static_policy(path: Path, edge_url: str, cloud_url: str, key_env: str | None) -> Path:
    key = f"\n    api_key_env: {key_env}" if key_env else ""
    path.write_text(f"""\
version: 1
defaults:
  timeouts: {{connect_s: 2, first_byte_s: 30, between_chunks_s: 10, total_s: 60, queue_s: 5}}
  cache: {{enabled: false}}
tiers:
  edge:
    kind: edge
    model: tiergate-edge
    endpoints: ["{edge_url}"]{key}
  cloud:
    kind: cloud
    model: tiergate-cloud
    served_model: cloud-model
    endpoints: ["{cloud_url}"]
rules:
  - name: default
    tier: edge
    fallbacks: [cloud]
""")
    return path


def test_the_gateway_reaches_a_tls_node_with_its_key_and_nothing_else_does(tmp_path, edge_node_factory, monkeypatch):
    tls = self_signed(tmp_path / "tls")
    key = node_key(SECRET, "tls-node")
    api_key = node_api_key(key)
    port = free_port()
    node_url = f"https://127.0.0.1:{port}"
    with aiohttp_server(make_app(4, model="cloud-model")) as cloud:
        policy = write_policy(tmp_path / "policy.yaml", [], [cloud.url], cache=False)
        settings = Settings(policy=policy, embedder=None, edge_secret=SECRET, backend_ca_file=tls.cert)
        with gateway_server(settings, keyring=KEYS, ready=False) as gw:
            edge_node_factory("--parallel", "2", "--ctx", "512", "--node-id", "tls-node",
                              "--ssl-certfile", str(tls.cert), "--ssl-keyfile", str(tls.key),
                              "--gateway", gw.url, port=port, env={"TIERGATE_EDGE_NODE_KEY": key}, wait=False)
            wait_until(lambda: _health(node_url, tls.cert) == 200, timeout_s=120, what="the TLS node's /health")
            pool = gw.gateway.tiers["edge"].pool
            wait_until(lambda: [e.base_url for e in pool.endpoints()] == [node_url], timeout_s=30,
                       what="the node registered with its https URL")
            r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=API, timeout=60)
            assert r.status_code == 200 and r.headers["x-tiergate-tier"] == "edge", r.text[:300]
            assert "x-tiergate-fallback-from" not in r.headers

        # asked directly: HTTPS only, and the API key (derived from the node key) on everything but /health
        with httpx.Client(verify=str(tls.cert), timeout=30) as direct:
            refused = direct.post(node_url + "/v1/chat/completions", json=CHAT)
            assert refused.status_code == 401
            assert refused.json()["error"]["type"] == "authentication_error"
            assert direct.get(node_url + "/metrics").status_code == 401
            assert direct.post(node_url + "/v1/chat/completions", json=CHAT,
                               headers={"Authorization": f"Bearer {key}"}).status_code == 401  # not the node key
            ok = direct.post(node_url + "/v1/chat/completions", json=CHAT,
                             headers={"Authorization": f"Bearer {api_key}"})
            assert ok.status_code == 200 and ok.json()["choices"]
            assert direct.get(node_url + "/health").status_code == 200
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)

        # a tier naming the node as a static endpoint: it needs both the CA and the key
        monkeypatch.setenv("TLS_NODE_API_KEY", api_key)
        for name, ca, key_env, served_by_edge in [("trusted", tls.cert, "TLS_NODE_API_KEY", True),
                                                  ("untrusted", None, "TLS_NODE_API_KEY", False),
                                                  ("keyless", tls.cert, None, False)]:
            policy = _static_policy(tmp_path / f"{name}.yaml", node_url, cloud.url, key_env)
            with gateway_server(Settings(policy=policy, embedder=None, backend_ca_file=ca), keyring=KEYS,
                                ready=False) as gw:
                r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=API, timeout=60)
                assert r.status_code == 200, (name, r.text[:300])
                assert (r.headers["x-tiergate-tier"] == "edge") is served_by_edge, (name, dict(r.headers))
                assert ("x-tiergate-fallback-from" in r.headers) is not served_by_edge, name


def _health(url: str, ca: Path) -> int:
    try:
        return httpx.get(url + "/health", verify=str(ca), timeout=2).status_code
    except httpx.HTTPError:
        return 0
