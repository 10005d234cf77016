"""The gateway in front of real llama.cpp edge nodes (edge-node serve), driven with the official openai SDK."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import openai
import pytest

from gateway.auth import KeyRing
from gateway.settings import Settings
from tests.support.servers import gateway_server, wait_until

pytestmark = pytest.mark.integration
KEYS = KeyRing.from_inline("int-key-1=acme:normal")


def _policy(path: Path, cloud_url: str, tokenizer: Path) -> Path:
    path.write_text(f"""\
version: 1
defaults:
  timeouts: {{connect_s: 1, first_byte_s: 30, between_chunks_s: 10, total_s: 60, queue_s: 5}}
  cache: {{enabled: true, semantic: false, max_temperature: 0.3}}
tiers:
  edge:
    kind: edge
    model: tiergate-edge
    tokenizer: {tokenizer}
    max_context: 1024
  cloud:
    kind: cloud
    model: tiergate-cloud
    served_model: cloud-standin
    stand_in: true
    endpoints: ["{cloud_url}"]
    tokenizer: {tokenizer}
rules:
  - name: explicit-cloud
    when: {{model: [tiergate-cloud]}}
    tier: cloud
  - name: long-prompt
    when: {{prompt_tokens: {{min: 2000}}}}
    tier: cloud
  - name: default
    tier: edge
    fallbacks: [cloud]
""")
    return path


@pytest.fixture
def llama_stack(tmp_path, edge_model, edge_node_factory):
    """A gateway, one cloud stand-in (llama.cpp) and a factory for edge nodes that register with the gateway."""
    cloud = edge_node_factory("--parallel", "2", "--ctx", "1024", "--model-name", "cloud-standin")
    pol = _policy(tmp_path / "policy.yaml", cloud.url, edge_model.tokenizer_json)
    with gateway_server(Settings(policy=pol, embedder=None), keyring=KEYS, ready=True) as gw:
        def add_edge(*extra: str):
            node = edge_node_factory("--parallel", "4", "--ctx", "1024", "--gateway", gw.url, *extra)
            wait_until(lambda: any(e.base_url == node.url for e in gw.gateway.tiers["edge"].pool.endpoints()),
                       timeout_s=20, what="edge node registration")
            return node

        yield {"gw": gw, "cloud": cloud, "add_edge": add_edge}


def _client(gw) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="int-key-1", max_retries=0, timeout=60)


def test_sdk_sync_async_and_streaming_through_real_llama(llama_stack):
    gw = llama_stack["gw"]
    node = llama_stack["add_edge"]()
    c = _client(gw)
    raw = c.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "Hello there"}], max_tokens=12, temperature=0)
    r = raw.parse()
    assert raw.headers["x-tiergate-tier"] == "edge"
    assert r.usage.completion_tokens == 12 and r.choices[0].finish_reason == "length"
    assert r.choices[0].message.content  # printable text from the INT4 model
    assert r.model == node.health()["model"] if "model" in node.health() else r.model

    chunks = list(c.chat.completions.create(model="auto", messages=[{"role": "user", "content": "Count"}],
                                            max_tokens=10, temperature=0.8, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == 10
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)

    async def many() -> list[int]:
        ac = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="int-key-1", max_retries=0, timeout=60)
        rs = await asyncio.gather(*[ac.completions.create(model="auto", prompt=f"item {i}", max_tokens=6,
                                                          temperature=1) for i in range(6)])
        await ac.close()
        return [x.usage.completion_tokens for x in rs]

    assert asyncio.run(many()) == [6] * 6


def test_greedy_answer_is_cached_and_replayed_identically(llama_stack):
    gw = llama_stack["gw"]
    llama_stack["add_edge"]()
    c = _client(gw)
    msgs = [{"role": "user", "content": "What is a tier?"}]
    a = c.chat.completions.with_raw_response.create(model="auto", messages=msgs, max_tokens=8, temperature=0)
    b = c.chat.completions.with_raw_response.create(model="auto", messages=msgs, max_tokens=8, temperature=0)
    assert a.headers["x-tiergate-cache"] == "miss" and b.headers["x-tiergate-cache"] == "hit-exact"
    assert a.parse().choices[0].message.content == b.parse().choices[0].message.content


def test_explicit_cloud_model_reaches_the_stand_in(llama_stack):
    c = _client(llama_stack["gw"])
    raw = c.chat.completions.with_raw_response.create(model="tiergate-cloud", max_tokens=4,
                                                      messages=[{"role": "user", "content": "hi"}])
    assert raw.headers["x-tiergate-tier"] == "cloud" and raw.parse().model == "cloud-standin"
    models = {m.id: m for m in c.models.list()}
    assert "STAND-IN" in models["tiergate-cloud"].model_extra["description"]


def test_requests_land_on_the_least_loaded_node(llama_stack):
    gw = llama_stack["gw"]
    n1 = llama_stack["add_edge"]()
    n2 = llama_stack["add_edge"]()
    url = gw.url + "/v1/chat/completions"
    body = {"model": "auto", "messages": [{"role": "user", "content": "tell a long story"}], "max_tokens": 200,
            "temperature": 1, "stream": True}

    async def main() -> None:
        async with httpx.AsyncClient(timeout=60, headers={"Authorization": "Bearer int-key-1"}) as h:
            async def stream() -> None:
                async with h.stream("POST", url, json=body) as r:
                    async for _ in r.aiter_lines():
                        pass
            await asyncio.gather(*[stream() for _ in range(4)])

    asyncio.run(main())
    served = [n.metric("tiergate_edge_generation_tokens_total") / 200 for n in (n1, n2)]
    assert sum(served) == 4 and min(served) >= 1, served  # spread, not piled on one node


def test_drained_node_deregisters_and_traffic_moves(llama_stack):
    gw = llama_stack["gw"]
    n1 = llama_stack["add_edge"]()
    n2 = llama_stack["add_edge"]()
    pool = gw.gateway.tiers["edge"].pool
    assert n1.stop(signal.SIGTERM) == 0  # drain: deregister, finish in flight, exit 0
    wait_until(lambda: all(e.base_url != n1.url for e in pool.endpoints()), timeout_s=10, what="deregistration")
    r = _client(gw).chat.completions.with_raw_response.create(model="auto", max_tokens=3, temperature=1,
                                                              messages=[{"role": "user", "content": "x"}])
    assert r.headers["x-tiergate-tier"] == "edge"
    assert n2.metric("tiergate_edge_generation_tokens_total") >= 3


def test_edge_node_killed_mid_stream_ends_cleanly_and_the_next_request_is_served(llama_stack):
    gw = llama_stack["gw"]
    node = llama_stack["add_edge"]()
    with httpx.stream("POST", gw.url + "/v1/chat/completions", headers={"Authorization": "Bearer int-key-1"},
                      timeout=60, json={"model": "auto", "max_tokens": 400, "temperature": 1, "stream": True,
                                        "messages": [{"role": "user", "content": "go on and on"}]}) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert first
        node.proc.send_signal(signal.SIGKILL)
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    assert '"error"' in rest[-2]  # an explicit SSE error event, not a silent truncation
    # The dead node stops getting traffic; the cloud (fallback) answers meanwhile.
    r = _client(gw).chat.completions.with_raw_response.create(model="auto", max_tokens=3, temperature=1,
                                                              messages=[{"role": "user", "content": "x"}])
    assert r.headers["x-tiergate-tier"] in ("edge", "cloud") and r.parse().choices


def test_prompt_longer_than_the_edge_context_is_a_clear_400(llama_stack):
    gw = llama_stack["gw"]
    llama_stack["add_edge"]()
    long_prompt = " ".join(f"word{i}" for i in range(900))  # fits the 2000-token rule, not the 1024 context
    r = httpx.post(gw.url + "/v1/chat/completions", headers={"Authorization": "Bearer int-key-1"}, timeout=60,
                   json={"model": "tiergate-edge", "messages": [{"role": "user", "content": long_prompt}],
                         "max_tokens": 4})
    assert r.status_code == 400, r.text
    assert "context" in r.json()["error"]["message"].lower()
