"""Issue 41's smaller API surfaces against a real SmolLM2-135M-Instruct edge node and the real ONNX embedder,
driven by the official openai SDK: `n > 1`, prompt lists, `/v1/embeddings`, `/v1/models/{id}`, the policy's
model aliases and CORS.

Greedy answers make the checks exact: each of `n` choices, and each prompt of a list, must be the very answer the
same single request gets.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from tests.gateway.conftest import write_policy
from tests.support.edge import EdgeProcess, start_edge_node
from tests.support.servers import gateway_server
from tiergate.cache.embedder import OnnxEmbedder
from tiergate.edge_node.model.packaged import packaged_path
from tiergate.gateway.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer with one word."}]
ORIGIN = "https://app.example.com"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EdgeProcess]:
    with start_edge_node(packaged_path("smollm2-135m-instruct"), "--parallel", "2", "--ctx", "2048",
                         "--model-name", "smollm2", workdir=tmp_path_factory.mktemp("smollm2")) as n:
        yield n


@pytest.fixture
def gw(node: EdgeProcess, embedder_dir: Path, tmp_path: Path):
    policy = write_policy(tmp_path / "policy.yaml", [node.url], ["http://127.0.0.1:9"], fallback=False, cache=False)
    policy.write_text(policy.read_text() + 'model_aliases:\n  gpt-4o-mini: auto\n  "claude-*": edge\n')
    with gateway_server(Settings(policy=policy, embedder=embedder_dir, redis_url=None, cors_origins=ORIGIN)) as g:
        yield g


def _client(gw) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="tg-demo-key", max_retries=0, timeout=120)


def test_n_choices_are_each_the_models_own_answer_whole_and_streamed(gw) -> None:
    client = _client(gw)
    one = client.chat.completions.create(model="auto", messages=QUESTION, max_tokens=8, temperature=0)
    expected = one.choices[0].message.content
    assert expected
    many = client.chat.completions.create(model="auto", messages=QUESTION, max_tokens=8, temperature=0, n=3)
    assert [(c.index, c.message.content) for c in many.choices] == [(i, expected) for i in range(3)]
    assert many.usage.completion_tokens == 3 * one.usage.completion_tokens
    assert many.usage.prompt_tokens == 3 * one.usage.prompt_tokens
    texts: dict[int, str] = {}
    usage = []
    for chunk in client.chat.completions.create(model="auto", messages=QUESTION, max_tokens=8, temperature=0, n=2,
                                                stream=True, stream_options={"include_usage": True}):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
        if chunk.usage is not None:
            usage.append(chunk.usage)
    assert texts == {0: expected, 1: expected}
    assert len(usage) == 1 and usage[0].completion_tokens == 2 * one.usage.completion_tokens
    sampled = client.chat.completions.create(model="auto", messages=QUESTION, max_tokens=8, temperature=1.0, n=2,
                                             seed=3)
    assert len(sampled.choices) == 2 and all(c.message.content for c in sampled.choices)


def test_prompt_lists_give_each_prompt_its_own_answer_in_order(gw) -> None:
    client = _client(gw)
    prompts = ["The capital of France is", "One, two, three,", "def add(a, b):"]
    singles = [client.completions.create(model="auto", prompt=p, max_tokens=6, temperature=0).choices[0].text
               for p in prompts]
    batch = client.completions.create(model="auto", prompt=prompts, max_tokens=6, temperature=0)
    assert [(c.index, c.text) for c in batch.choices] == list(enumerate(singles))
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(model="auto", prompt=prompts[:2], max_tokens=6, temperature=0,
                                           stream=True):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert streamed == {0: singles[0], 1: singles[1]}
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="auto", prompt=[[1, 2, 3]], max_tokens=2)
    assert err.value.body["param"] == "prompt" and "Token-id" in err.value.message


def test_client_model_names_reach_the_edge_and_models_are_retrievable(gw) -> None:
    client = _client(gw)
    expected = client.chat.completions.create(model="auto", messages=QUESTION, max_tokens=8,
                                              temperature=0).choices[0].message.content
    for name in ("gpt-4o-mini", "claude-3-5-haiku-latest"):
        raw = client.chat.completions.with_raw_response.create(model=name, messages=QUESTION, max_tokens=8,
                                                               temperature=0)
        assert raw.headers["x-tiergate-tier"] == "edge" and raw.parse().choices[0].message.content == expected
    assert client.models.retrieve("claude-3-5-haiku-latest").model_extra["alias_for"] == "edge"
    assert client.models.retrieve("tiergate-edge").model_extra["backend_models"] == ["smollm2"]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-5")


def test_embeddings_from_the_gateways_own_embedder(gw, onnx_embedder: OnnxEmbedder) -> None:
    texts = ["How do I bake bread?", "How can I bake bread?", "What is the GDP of Peru?"]
    r = _client(gw).embeddings.create(model="tiergate-embed", input=texts)
    got = np.array([d.embedding for d in r.data], dtype=np.float32)
    assert np.allclose(got, onnx_embedder.embed(texts).vectors, atol=1e-5)
    assert r.usage.prompt_tokens == sum(onnx_embedder.token_count(t) for t in texts)


def test_a_browser_app_on_the_allowed_origin_gets_through_cors(gw) -> None:
    pre = httpx.options(gw.url + "/v1/chat/completions", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == ORIGIN
    r = httpx.post(gw.url + "/v1/chat/completions", timeout=120, headers={
        "Origin": ORIGIN, "Authorization": "Bearer tg-demo-key"},
        json={"model": "auto", "messages": QUESTION, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
