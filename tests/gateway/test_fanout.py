"""`n > 1` and prompt lists: `plan` on its own, then through a real gateway with the official openai SDK."""

from __future__ import annotations

import hashlib

import httpx
import msgspec
import openai
import pytest

from tests.gateway.conftest import KEYS, stack, write_policy
from tests.support.instant_upstream import HITS, LAST_BODY, make_app
from tests.support.servers import aiohttp_server, gateway_server
from tiergate.core.errors import OpenAIError
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.fanout import plan
from tiergate.gateway.settings import Settings

AUTH = {"Authorization": "Bearer key-alpha-1"}


def _enc(obj: object) -> bytes:
    return msgspec.json.encode(obj)


# ---- plan ---------------------------------------------------------------------------------------------------

def test_one_answer_is_not_fanned_out() -> None:
    assert plan(_enc({"model": "auto", "messages": [], "n": 1}), "chat", 8) is None
    assert plan(_enc({"model": "auto", "prompt": ["one"]}), "text", 8) is None
    assert plan(b"not json", "chat", 8) is None
    assert plan(_enc([1, 2]), "chat", 8) is None
    assert plan(_enc({"n": "2"}), "chat", 8) is None  # a type error: the pipeline's decoder names it


def test_n_becomes_n_uncached_requests_with_distinct_seeds() -> None:
    p = plan(_enc({"model": "auto", "messages": [], "n": 3, "seed": 7, "stream": True, "extra": {"k": 1}}),
             "chat", 8)
    assert p is not None and not p.cache and p.stream and not p.include_usage
    subs = [msgspec.json.decode(b) for b in p.bodies]
    assert [s["seed"] for s in subs] == [7, 8, 9]
    assert all("n" not in s and s["extra"] == {"k": 1} for s in subs)


def test_prompt_lists_keep_their_order_and_are_cacheable_with_n_1() -> None:
    p = plan(_enc({"model": "auto", "prompt": ["a", "b", "c"], "stream_options": {"include_usage": True}}),
             "text", 8)
    assert p is not None and p.cache and p.include_usage
    assert [msgspec.json.decode(b)["prompt"] for b in p.bodies] == ["a", "b", "c"]
    both = plan(_enc({"model": "auto", "prompt": ["a", "b"], "n": 2}), "text", 8)
    assert both is not None and not both.cache
    assert [msgspec.json.decode(b)["prompt"] for b in both.bodies] == ["a", "a", "b", "b"]


@pytest.mark.parametrize("body, param, words", [
    ({"n": 0}, "n", "from 1 to 8"),
    ({"n": 9}, "n", "from 1 to 8"),
    ({"n": 100000000}, "n", "from 1 to 8"),
    ({"prompt": []}, "prompt", "empty"),
    ({"prompt": [1, 2, 3]}, "prompt", "Token-id"),
    ({"prompt": [[1, 2], [3]]}, "prompt", "Token-id"),
    ({"prompt": ["a", 5]}, "prompt", "Token-id"),
    ({"prompt": ["p"] * 5, "n": 2}, "prompt", "10 answers"),
])
def test_what_is_not_served_is_a_400_naming_the_field(body, param, words) -> None:
    with pytest.raises(OpenAIError) as err:
        plan(_enc({"model": "auto", "prompt": "x"} | body), "text", 8)
    assert err.value.status == 400 and err.value.param == param and words in err.value.message


# ---- through a gateway ----------------------------------------------------------------------------------------

def _client(s) -> openai.OpenAI:
    return openai.OpenAI(base_url=s["gw"].url + "/v1", api_key="key-alpha-1", max_retries=0)


def _q(text: str) -> str:
    """The first word the echoing backend answers `text` with."""
    return f"q{hashlib.sha256(msgspec.json.encode(text)).hexdigest()[:12]} "


def test_chat_n_gives_n_choices_each_its_own_request(tmp_path) -> None:
    with stack(tmp_path) as s:
        raw = _client(s).chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": "hi"}], n=3, max_tokens=2, temperature=0, seed=5)
        r = raw.parse()
        assert [c.index for c in r.choices] == [0, 1, 2]
        assert all(c.message.content == "w0 w1 " for c in r.choices)
        assert r.usage.completion_tokens == 6 and r.usage.prompt_tokens == 15  # three requests' usage, summed
        assert s["edges"][0].app[HITS] == 3
        assert msgspec.json.decode(s["edges"][0].app[LAST_BODY])["seed"] == 7
        assert raw.headers["x-tiergate-answers"] == "3" and raw.headers["x-tiergate-tier"] == "edge"
        assert raw.headers["x-tiergate-cache"] == "bypass"  # n > 1 never reads or fills the cache
        again = _client(s).chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "hi"}], n=2, max_tokens=2, temperature=0)
        assert len(again.choices) == 2 and s["edges"][0].app[HITS] == 5


def test_chat_n_streams_each_choice_with_its_index_then_one_usage_chunk(tmp_path) -> None:
    with stack(tmp_path) as s:
        chunks = list(_client(s).chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "hi"}], n=2, max_tokens=3, temperature=0.0,
            stream=True, stream_options={"include_usage": True}))
        texts = {0: "", 1: ""}
        for c in chunks:
            for ch in c.choices:
                texts[ch.index] += ch.delta.content or ""
        assert texts == {0: "w0 w1 w2 ", 1: "w0 w1 w2 "}
        usage = [c.usage for c in chunks if c.usage is not None]
        assert len(usage) == 1 and usage[0].completion_tokens == 6 and not chunks[-1].choices
        plain = list(_client(s).chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "hi"}], n=2, max_tokens=1, stream=True))
        assert all(c.usage is None for c in plain) and {ch.index for c in plain for ch in c.choices} == {0, 1}


def test_completion_prompt_lists_give_one_choice_per_prompt_in_order(tmp_path) -> None:
    with aiohttp_server(make_app(8, model="edge-model", echo=True)) as edge, \
            aiohttp_server(make_app(8, model="cloud-model")) as cloud:
        pol = write_policy(tmp_path / "p.yaml", [edge.url], [cloud.url])
        with gateway_server(Settings(policy=pol, embedder=None, redis_url=None), keyring=KEYS) as gw:
            s = {"gw": gw}
            prompts = ["first prompt", "second prompt", "third prompt"]
            r = _client(s).completions.create(model="auto", prompt=prompts, max_tokens=2, temperature=0)
            assert [c.index for c in r.choices] == [0, 1, 2]
            assert [c.text for c in r.choices] == [_q(p) + "w1 " for p in prompts]
            both = _client(s).completions.create(model="auto", prompt=prompts[:2], n=2, max_tokens=1)
            assert [(c.index, c.text) for c in both.choices] == [
                (0, _q(prompts[0])), (1, _q(prompts[0])), (2, _q(prompts[1])), (3, _q(prompts[1]))]
            streamed = list(_client(s).completions.create(model="auto", prompt=prompts, max_tokens=2, stream=True))
            by_index: dict[int, str] = {}
            for c in streamed:
                for ch in c.choices:
                    by_index[ch.index] = by_index.get(ch.index, "") + ch.text
            assert by_index == {i: _q(p) + "w1 " for i, p in enumerate(prompts)}


def test_each_answer_is_limited_like_a_request_and_refusals_are_openai_errors(tmp_path) -> None:
    with stack(tmp_path, settings={"max_choices": 4}) as s:
        url = s["gw"].url
        r = httpx.post(url + "/v1/completions", headers=AUTH, json={"model": "auto", "prompt": [1, 2], "n": 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        r = httpx.post(url + "/v1/chat/completions", headers=AUTH,
                       json={"model": "auto", "messages": [{"role": "user", "content": "x"}], "n": 5})
        assert r.status_code == 400 and "from 1 to 4" in r.json()["error"]["message"]
        r = httpx.post(url + "/v1/chat/completions", headers={"Authorization": "Bearer nope-nope-nope"},
                       json={"model": "auto", "messages": [{"role": "user", "content": "x"}], "n": 5})
        assert r.status_code == 401  # the key is checked before the body
        r = httpx.post(url + "/v1/chat/completions", headers=AUTH,  # each sub-request is checked as one
                       json={"model": "auto", "messages": [{"role": "user", "content": "x"}], "n": 2,
                             "temperature": 9})
        assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
        r = httpx.post(url + "/v1/chat/completions", headers=AUTH | {"x-request-id": "mine-1"}, json={
            "model": "auto", "messages": [{"role": "user", "content": "x"}], "n": 2, "stream": True,
            "temperature": 9})
        assert r.status_code == 400 and r.headers["x-request-id"] == "mine-1"


def test_every_answer_reserves_its_own_budget_so_n_cannot_step_around_a_token_limit(tmp_path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("tenants:\n  tiny: {tokens_per_minute: 60}\n  other: {tokens_per_minute: 60}\nkeys:\n"
                    "  - {tenant: tiny, key: tiny-key-123}\n  - {tenant: other, key: other-key-123}\n")
    with stack(tmp_path, keyring=KeyRing.from_file(keys), policy={"fallback": False}) as s:
        body = {"model": "auto", "messages": [{"role": "user", "content": "x"}], "max_tokens": 50, "n": 2}
        r = httpx.post(s["gw"].url + "/v1/chat/completions", headers={"Authorization": "Bearer tiny-key-123"},
                       json=body)
        assert r.status_code == 429 and r.json()["error"]["code"] == "token_limit_exceeded"
        assert s["edges"][0].app[HITS] == 1  # the first answer ran (and was charged); the second was refused
        assert int(r.headers["retry-after"]) >= 1
        streamed = httpx.post(s["gw"].url + "/v1/chat/completions", json=body | {"stream": True},
                              headers={"Authorization": "Bearer tiny-key-123"})
        assert streamed.status_code == 429 and int(streamed.headers["retry-after"]) >= 1  # refused before a byte
        assert streamed.headers["content-type"] == "application/json"
        cut = httpx.post(s["gw"].url + "/v1/chat/completions", json=body | {"stream": True},
                         headers={"Authorization": "Bearer other-key-123"})  # a fresh window: the first answer fits
        events = [line[6:] for line in cut.text.splitlines() if line.startswith("data: ")]
        assert cut.status_code == 200 and events[-1] == "[DONE]"
        chunks = [msgspec.json.decode(e) for e in events[:-1]]
        assert {c["choices"][0]["index"] for c in chunks if c.get("choices")} == {0}
        assert chunks[-1]["error"]["code"] == "token_limit_exceeded"  # the second answer's refusal ends the stream


def test_each_prompt_of_a_list_is_cached_as_that_prompt_alone_and_n_never_is(tmp_path) -> None:
    with stack(tmp_path) as s:
        client, edge = _client(s), s["edges"][0].app
        client.completions.create(model="auto", prompt=["alpha", "beta"], max_tokens=2, temperature=0)
        assert edge[HITS] == 2
        raw = client.completions.with_raw_response.create(model="auto", prompt="beta", max_tokens=2, temperature=0)
        assert raw.headers["x-tiergate-cache"] == "hit-exact" and edge[HITS] == 2  # stored by the list, as "beta"
        listed = client.completions.with_raw_response.create(model="auto", prompt=["beta", "alpha"], max_tokens=2,
                                                             temperature=0)
        assert [c.index for c in listed.parse().choices] == [0, 1] and edge[HITS] == 2  # both from the cache
        assert listed.headers["x-tiergate-tier"] == "cache"
        many = client.completions.with_raw_response.create(model="auto", prompt="beta", max_tokens=2, temperature=0,
                                                           n=2)
        assert many.headers["x-tiergate-cache"] == "bypass" and edge[HITS] == 4


def test_a_body_without_n_or_a_prompt_list_is_not_decoded_twice() -> None:
    assert plan(b'{"model": "auto", "prompt": "[not a list]", "messages": []}', "text", 8) is None
    assert plan(_enc({"model": "auto", "prompt": ["a", "b"]}), "chat", 8) is None  # chat has no prompt
    assert plan(b'{"model":"auto","prompt" :\n [ "a", "b" ]}', "text", 8) is not None


def test_keys_spelled_with_json_escapes_are_refused_not_half_served(tmp_path) -> None:
    with stack(tmp_path) as s:
        headers = AUTH | {"content-type": "application/json"}
        r = httpx.post(s["gw"].url + "/v1/chat/completions", headers=headers,
                       content=b'{"model":"auto","messages":[{"role":"user","content":"x"}],"\\u006e":2}')
        assert r.status_code == 400 and r.json()["error"]["param"] == "n"
        r = httpx.post(s["gw"].url + "/v1/completions", headers=headers,
                       content=b'{"model":"auto","\\u0070rompt":["a","b"]}')
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        assert s["edges"][0].app[HITS] == 0
