"""The gateway in front of real llama.cpp edge nodes (edge-node serve), driven with the official openai SDK."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway.conftest import write_policy
from tests.support.edge import registered_node
from tests.support.instant_upstream import make_app
from tests.support.servers import aiohttp_server, gateway_server
from tests.support.waiting import wait_until
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings

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
            return registered_node(edge_node_factory, gw, *extra, timeout_s=20)

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

    # Without stream_options the client gets no `usage` field at all (the gateway asked the node for usage, which
    # puts `"usage": null` in every chunk); with it, null in every chunk and the numbers in the last, as OpenAI.
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Count"}]}),
                       ("/v1/completions", {"prompt": "Count"})):
        for asked in (False, True):
            extra = {"stream_options": {"include_usage": True}} if asked else {}
            r = httpx.post(gw.url + path, headers={"Authorization": "Bearer int-key-1"}, timeout=60,
                           json={"model": "auto", "max_tokens": 5, "temperature": 1, "stream": True, **body, **extra})
            events = [json.loads(line[6:]) for line in r.text.splitlines()
                      if line.startswith("data: {")]
            assert r.status_code == 200 and len(events) >= 2
            if asked:
                assert all("usage" in e for e in events) and events[-1]["usage"]["completion_tokens"] == 5
            else:
                assert not any("usage" in e for e in events), events

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
    """A node with a backlog (one slot, two dozen long requests sent to it directly) reports it in its heartbeats;
    requests through the gateway then all go to the idle node. Round robin would send half of them to the busy
    one; so would balancing by request count without the nodes' own readings."""
    gw = llama_stack["gw"]
    busy = llama_stack["add_edge"]("--parallel", "1", "--ctx", "1100", "--model-name", "edge-busy")
    llama_stack["add_edge"]("--model-name", "edge-idle")
    pool = gw.gateway.tiers["edge"].pool
    busy_ep = next(e for e in pool.endpoints() if e.base_url == busy.url)
    backlog = {"model": "x", "messages": [{"role": "user", "content": "go on"}], "max_tokens": 1000, "temperature": 1}

    async def main() -> list[str]:
        async with httpx.AsyncClient(timeout=300) as direct, \
                httpx.AsyncClient(timeout=60, headers={"Authorization": "Bearer int-key-1"}) as h:
            queued = [asyncio.create_task(direct.post(busy.url + "/v1/chat/completions", json=backlog))
                      for _ in range(24)]
            for _ in range(2000):  # until a heartbeat has told the gateway (every 2 s), well before the backlog ends
                if busy_ep.reported_load >= 4:
                    break
                await asyncio.sleep(0.01)
            assert busy_ep.reported_load >= 4, busy_ep.reported_load
            answers = [await h.post(gw.url + "/v1/chat/completions", json={
                "model": "auto", "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 4,
                "temperature": 1}) for i in range(4)]
            await asyncio.gather(*queued)
            return [r.json()["model"] for r in answers]

    assert asyncio.run(main()) == ["edge-idle"] * 4


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


def test_edge_node_killed_mid_stream_ends_cleanly_and_stops_getting_traffic(llama_stack):
    gw = llama_stack["gw"]
    nodes = {name: llama_stack["add_edge"]("--model-name", name) for name in ("edge-1", "edge-2")}
    pool = gw.gateway.tiers["edge"].pool
    with httpx.stream("POST", gw.url + "/v1/chat/completions", headers={"Authorization": "Bearer int-key-1"},
                      timeout=60, json={"model": "auto", "max_tokens": 400, "temperature": 1, "stream": True,
                                        "messages": [{"role": "user", "content": "go on and on"}]}) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        dead = json.loads(first[6:])["model"]  # the node streaming this answer
        nodes[dead].proc.send_signal(signal.SIGKILL)
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    assert '"error"' in rest[-2]  # an explicit SSE error event, not a silent truncation
    alive = next(name for name in nodes if name != dead)
    # The gateway stops offering the dead node (its health checks fail), and then stops trying it at all.
    wait_until(lambda: all(e.base_url != nodes[dead].url for e in pool.candidates()), timeout_s=30,
               what="the dead node out of the candidates")
    tried = _connect_failures(gw)
    for i in range(5):
        r = _client(gw).chat.completions.with_raw_response.create(model="auto", max_tokens=3, temperature=1,
                                                                  messages=[{"role": "user", "content": f"x {i}"}])
        assert r.headers["x-tiergate-tier"] == "edge" and r.parse().model == alive  # the other node, not the cloud
    assert _connect_failures(gw) == tried  # no request was sent to the dead node any more


def _connect_failures(gw) -> float:
    text = httpx.get(gw.url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("tiergate_upstream_errors_total{") and 'tier="edge"' in line)


def test_prompt_longer_than_the_edge_context_is_a_clear_400(llama_stack):
    gw = llama_stack["gw"]
    llama_stack["add_edge"]()
    long_prompt = " ".join(f"word{i}" for i in range(900))  # fits the 2000-token rule, not the 1024 context
    r = httpx.post(gw.url + "/v1/chat/completions", headers={"Authorization": "Bearer int-key-1"}, timeout=60,
                   json={"model": "tiergate-edge", "messages": [{"role": "user", "content": long_prompt}],
                         "max_tokens": 4})
    assert r.status_code == 400, r.text
    assert "context" in r.json()["error"]["message"].lower()


def test_an_image_the_edge_cannot_see_goes_to_the_next_tier(edge_node, tmp_path):
    # The edge node used to drop the image part and answer about a picture it never saw; it now refuses with a
    # capability code, and the gateway hands the request to the cloud (here a stub that answers anything).
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is in this image?"}, image]}]
    with aiohttp_server(make_app(4, model="cloud-model")) as cloud:
        policy = write_policy(tmp_path / "p.yaml", [edge_node.url], [cloud.url], cache=False)
        with gateway_server(Settings(policy=policy, embedder=None, redis_url=None)) as gw:
            raw = openai.OpenAI(base_url=gw.url + "/v1", api_key="tg-demo-key", max_retries=0).chat.completions \
                .with_raw_response.create(model="auto", messages=messages, max_tokens=4, temperature=0)
            text_only = httpx.post(gw.url + "/v1/chat/completions", headers={"Authorization": "Bearer tg-demo-key"},
                                   json={"model": "auto", "messages": [{"role": "user", "content": [
                                       {"type": "text", "text": "hello"}]}], "max_tokens": 4}, timeout=60)
    assert raw.headers["x-tiergate-tier"] == "cloud" and raw.headers["x-tiergate-fallback-from"] == "edge"
    assert raw.parse().choices[0].message.content
    assert text_only.status_code == 200 and text_only.headers["x-tiergate-tier"] == "edge"  # text parts stay
