"""Spend and budgets in front of a real llama.cpp edge node, driven with the official openai SDK: a stream's
usage chunk carries its cost (priced from the node's own token counts), the key's usage reports it, and a spent
budget is a 429 the SDK raises without retrying (`x-should-retry: false`)."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from tests.support.servers import gateway_server
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings

pytestmark = pytest.mark.integration
KEYS = KeyRing.from_inline("int-key-1=acme:normal")


def _policy(path: Path, edge_url: str, tokenizer: Path) -> Path:
    path.write_text(f"""\
version: 1
defaults:
  timeouts: {{connect_s: 1, first_byte_s: 30, between_chunks_s: 10, total_s: 60, queue_s: 5}}
  cache: {{enabled: false}}
tiers:
  edge:
    kind: edge
    model: tiergate-edge
    tokenizer: {tokenizer}
    max_context: 1024
    endpoints: ["{edge_url}"]
costs:
  currency: USD
  reference_tier: edge
  prices:
    edge: {{prompt_per_1k: 1, completion_per_1k: 2}}
budgets:
  tenants:
    acme: {{period: month, hard: 0.06}}
rules:
  - name: default
    tier: edge
""")
    return path


def test_a_real_stream_carries_its_cost_and_a_spent_budget_is_not_retried(tmp_path, edge_model, edge_node):
    pol = _policy(tmp_path / "policy.yaml", edge_node.url, edge_model.tokenizer_json)
    with gateway_server(Settings(policy=pol, embedder=None), keyring=KEYS, ready=True) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="int-key-1", max_retries=2, timeout=60)
        chunks = list(client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "Hello there"}], max_tokens=12, temperature=0,
            stream=True, stream_options={"include_usage": True}))
        usage = chunks[-1].usage
        assert usage is not None and usage.prompt_tokens > 0 and usage.completion_tokens > 0
        cost = (usage.model_extra or {})["cost"]
        assert cost == pytest.approx((usage.prompt_tokens * 1 + usage.completion_tokens * 2) / 1000)
        mine = httpx.get(gw.url + "/v1/usage", headers={"Authorization": "Bearer int-key-1"}).json()
        assert mine["spend"] == pytest.approx(cost) and mine["requests"] == 1
        with pytest.raises(openai.RateLimitError) as over:
            for _ in range(10):  # each reserves up to 12 completion tokens more than it costs: soon refused
                client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "Hello there"}],
                                               max_tokens=12, temperature=0)
        assert over.value.code == "budget_exceeded" and over.value.type == "insufficient_quota"
        metrics = httpx.get(gw.url + "/metrics").text
    assert 'tiergate_budget_refused_total{action="refused",scope="tenant",tenant="acme"} 1.0' in metrics
