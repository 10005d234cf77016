"""`POST /v1/embeddings` through a real gateway with the real ONNX embedder, driven by the official openai SDK."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from tests.gateway.conftest import KEYS, write_policy
from tests.support.instant_upstream import make_app
from tests.support.servers import aiohttp_server, gateway_server
from tiergate.cache.embedder import OnnxEmbedder
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings

AUTH = {"Authorization": "Bearer key-alpha-1"}
MODEL = "tiergate-embed"


@contextmanager
def served(tmp_path: Path, embedder: Path | None, keyring: KeyRing = KEYS, **settings: object) -> Iterator[str]:
    with ExitStack() as es:
        edge = es.enter_context(aiohttp_server(make_app(4, model="edge-model")))
        cloud = es.enter_context(aiohttp_server(make_app(4, model="cloud-model")))
        pol = write_policy(tmp_path / "policy.yaml", [edge.url], [cloud.url])
        gw = es.enter_context(gateway_server(Settings(policy=pol, embedder=embedder, redis_url=None, **settings),
                                             keyring=keyring))
        yield gw.url


def _client(url: str, key: str = "key-alpha-1") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def test_sdk_embeddings_are_the_embedders_vectors_with_real_token_counts(tmp_path, embedder_dir,
                                                                          onnx_embedder: OnnxEmbedder) -> None:
    texts = ["How do I bake bread?", "How can I bake bread?", "What is the GDP of Peru?"]
    expected = onnx_embedder.embed(texts).vectors
    with served(tmp_path, embedder_dir) as url:
        client = _client(url)
        r = client.embeddings.create(model=MODEL, input=texts)  # the SDK asks for base64 and decodes it
        got = np.array([d.embedding for d in r.data], dtype=np.float32)
        assert [d.index for d in r.data] == [0, 1, 2] and r.model == MODEL and r.object == "list"
        assert got.shape == (3, 384) and np.allclose(got, expected, atol=1e-5)
        assert got[0] @ got[1] > 0.9 > got[0] @ got[2]
        tokens = sum(onnx_embedder.token_count(t) for t in texts)
        assert r.usage.prompt_tokens == r.usage.total_tokens == tokens
        floats = client.embeddings.create(model=MODEL, input="How do I bake bread?", encoding_format="float")
        assert len(floats.data) == 1 and np.allclose(floats.data[0].embedding, expected[0], atol=1e-5)
        raw = httpx.post(url + "/v1/embeddings", headers=AUTH, json={"model": MODEL, "input": texts[2],
                                                                     "encoding_format": "base64"}).json()
        decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
        assert np.allclose(decoded, expected[2], atol=1e-5)
        assert client.embeddings.create(model=MODEL, input=texts[:1], dimensions=384).data[0].embedding
        card = client.models.retrieve(MODEL)
        assert card.model_extra["kind"] == "embedding" and card.model_extra["dimensions"] == 384
        assert MODEL in [m.id for m in client.models.list()]


@pytest.mark.parametrize("body, status, param, words", [
    ({"input": "x", "dimensions": 128}, 400, "dimensions", "must be omitted or 384"),
    ({"input": [1, 2, 3]}, 400, "input", "Token-id"),
    ({"input": [[1, 2], [3]]}, 400, "input", "Token-id"),
    ({"input": []}, 400, "input", "1 to 3 texts"),
    ({"input": ["a", "b", "c", "d"]}, 400, "input", "1 to 3 texts"),
    ({"input": ["ok", ""]}, 400, "input", "empty string"),
    ({"input": "x", "encoding_format": "int8"}, 400, "encoding_format", "float"),
    ({"input": "word " * 400}, 400, "input", "window of 256 tokens"),
    ({"input": ["fine", "word " * 400]}, 400, "input", "`input[1]`"),
    ({"input": {"text": "x"}}, 400, "input", "Expected"),
    ({"model": "text-embedding-3-small", "input": "x"}, 404, "model", "tiergate-embed"),
    ({"model": 5, "input": "x"}, 400, "model", "Expected"),
])
def test_what_cannot_be_served_as_asked_is_a_clear_openai_error(tmp_path, embedder_dir, body, status, param,
                                                                words) -> None:
    with served(tmp_path, embedder_dir, embeddings_max_inputs=3) as url:
        r = httpx.post(url + "/v1/embeddings", headers=AUTH, json={"model": MODEL} | body)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert err["param"] == param and words in err["message"], err
        assert httpx.post(url + "/v1/embeddings", content=b"{nope", headers=AUTH).status_code == 400


def test_keys_and_token_limits_apply(tmp_path, embedder_dir) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("tenants:\n  tiny: {tokens_per_minute: 20}\nkeys:\n  - {tenant: tiny, key: tiny-key-123}\n")
    with served(tmp_path, embedder_dir, keyring=KeyRing.from_file(keys)) as url:
        with pytest.raises(openai.AuthenticationError):
            _client(url, "wrong-key-000").embeddings.create(model=MODEL, input="x")
        client = _client(url, "tiny-key-123")
        assert client.embeddings.create(model=MODEL, input="one two three").usage.prompt_tokens == 5
        with pytest.raises(openai.RateLimitError) as err:
            client.embeddings.create(model=MODEL, input=["a b c d e f g h i j"] * 2)  # 24 tokens > what is left
        assert err.value.body["code"] == "token_limit_exceeded"


def test_without_an_embedder_no_embedding_model_is_offered(tmp_path) -> None:
    with served(tmp_path, None) as url:
        with pytest.raises(openai.NotFoundError) as err:
            _client(url).embeddings.create(model=MODEL, input="x")
        assert "TIERGATE_EMBEDDER" in err.value.message
        assert MODEL not in [m.id for m in _client(url).models.list()]


def test_embeddings_are_priced_spent_and_held_to_the_budget(tmp_path, embedder_dir,
                                                            onnx_embedder: OnnxEmbedder) -> None:
    """Priced at `costs.embeddings_per_1k`: the header quotes the exact cost, the key's usage and the spend
    counters record it with a saving of 0, and a budget that cannot cover the next request refuses it (429)
    without charging anything."""
    per_1k = 2.0
    text = "How do I bake bread at home?"
    cost = onnx_embedder.token_count(text) * per_1k / 1000
    with ExitStack() as es:
        edge = es.enter_context(aiohttp_server(make_app(4, model="edge-model")))
        cloud = es.enter_context(aiohttp_server(make_app(4, model="cloud-model")))
        pol = write_policy(tmp_path / "policy.yaml", [edge.url], [cloud.url])
        pol.write_text(pol.read_text() + f"""\
costs:
  currency: USD
  reference_tier: cloud
  embeddings_per_1k: {per_1k}
budgets:
  tenants:
    alpha: {{period: day, hard: {cost * 2.5}}}
""")
        gw = es.enter_context(gateway_server(Settings(policy=pol, embedder=embedder_dir, redis_url=None),
                                             keyring=KEYS))
        first = httpx.post(gw.url + "/v1/embeddings", headers=AUTH, json={"model": MODEL, "input": text})
        assert first.status_code == 200 and float(first.headers["x-tiergate-cost"]) == pytest.approx(cost)
        assert _client(gw.url).embeddings.create(model=MODEL, input=text).usage.prompt_tokens > 0
        with pytest.raises(openai.RateLimitError) as over:  # 2 spent of 2.5: the third does not fit
            _client(gw.url).embeddings.create(model=MODEL, input=text)
        assert over.value.code == "budget_exceeded"
        usage = httpx.get(gw.url + "/v1/usage", headers=AUTH).json()
        assert usage["spend"] == pytest.approx(2 * cost) and usage["requests"] == 2
        metrics = httpx.get(gw.url + "/metrics").text
    spend = [line for line in metrics.splitlines() if line.startswith("tiergate_spend_total{")]
    assert len(spend) == 1 and 'tier="embeddings"' in spend[0]
    assert float(spend[0].rsplit(" ", 1)[1]) == pytest.approx(2 * cost)
    saved = {line.split(" ")[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
             if line.startswith("tiergate_savings_") and 'source="embeddings"' in line and "_created" not in line}
    assert saved['tiergate_savings_reference_total{currency="USD",source="embeddings"}'] == pytest.approx(
        saved['tiergate_savings_spend_total{currency="USD",source="embeddings"}'])
