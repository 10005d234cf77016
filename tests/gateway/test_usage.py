"""Budgets, self-service usage and the cost of streams, end to end: a real gateway (uvicorn) in front of instant
backends, spend in the in-process ledger. (Across replicas on real Redis: `tests/integration/test_budgets_redis.py`.)

Prices make the arithmetic exact: a completion token costs 1 USD on the edge, 2 on the cloud, prompts nothing; the
instant backend answers `max_tokens` tokens, so a request reserves exactly what it will cost."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import jsonschema
import msgspec
import pytest
from openai import OpenAI

from tests.gateway.conftest import write_policy
from tests.support.instant_upstream import make_app
from tests.support.servers import aiohttp_server, gateway_server
from tiergate.gateway.auth import KeyRing, hash_key
from tiergate.gateway.openapi import openapi_document
from tiergate.gateway.settings import Settings

KEYS = KeyRing.from_inline("key-alpha-1=alpha,key-alpha-2=alpha,key-beta-1=beta")
A1, A2, B1 = ({"Authorization": f"Bearer {k}"} for k in ("key-alpha-1", "key-alpha-2", "key-beta-1"))
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 1}
SECTIONS = f"""
costs:
  currency: USD
  reference_tier: cloud
  prices:
    edge: {{completion_per_1k: 1000}}
    cloud: {{completion_per_1k: 2000}}
budgets:
  tenants:
    alpha:
      period: day
      hard: 20
      soft: 10
      keys:
        {hash_key("key-alpha-2")}: {{hard: 6}}
"""


@contextmanager
def gateway(tmp_path: Path, cloud_mode: str = "ok") -> Iterator[str]:
    with ExitStack() as es:
        edge = es.enter_context(aiohttp_server(make_app(8, "ok", model="edge-model")))
        cloud = es.enter_context(aiohttp_server(make_app(8, cloud_mode, model="cloud-model")))
        path = write_policy(tmp_path / "policy.yaml", [edge.url], [cloud.url], fallback=False)
        path.write_text(path.read_text() + SECTIONS)
        gw = es.enter_context(gateway_server(Settings(policy=path, embedder=None, redis_url=None), keyring=KEYS))
        yield gw.url


def _usage(url: str, headers: dict[str, str], **params: str) -> dict:
    r = httpx.get(url + "/v1/usage", headers=headers, params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_key_reads_its_own_usage_and_budget_and_never_another_keys(tmp_path):
    with gateway(tmp_path) as url:
        chat = url + "/v1/chat/completions"
        costs = [float(httpx.post(chat, json=CHAT, headers=A1).headers["x-tiergate-cost"]) for _ in range(2)]
        assert costs == [4.0, 4.0]
        assert httpx.post(chat, json={**CHAT, "max_tokens": 2}, headers=A2).headers["x-tiergate-cost"].startswith("2.")
        assert httpx.post(chat, json=CHAT, headers=B1).status_code == 200
        mine, theirs, beta = _usage(url, A1), _usage(url, A2), _usage(url, B1)
    assert (mine["object"], mine["tenant"], mine["currency"]) == ("usage", "alpha", "USD")
    assert (mine["spend"], mine["requests"], mine["completion_tokens"]) == (8.0, 2, 8)  # not alpha-2's, not beta's
    assert mine["budgets"] == {"tenant": {"period": "day", "period_end": mine["period"]["end"], "hard_limit": 20.0,
                                          "soft_limit": 10.0, "remaining": 10.0}}
    assert (theirs["spend"], theirs["requests"]) == (2.0, 1)
    assert theirs["budgets"]["key"]["remaining"] == 4.0 and theirs["budgets"]["tenant"]["remaining"] == 10.0
    assert (beta["spend"], beta["budgets"]) == (4.0, {})  # beta has no budget: its spend is still recorded
    doc = msgspec.json.decode(openapi_document())
    for body in (mine, theirs, beta):  # what /openapi.json says the route answers
        jsonschema.Draft202012Validator({"$ref": "#/components/schemas/Usage", **doc}).validate(body)


def test_usage_refuses_a_missing_key_and_a_bad_period_in_the_openai_format(tmp_path):
    with gateway(tmp_path) as url:
        anon = httpx.get(url + "/v1/usage")
        bad = httpx.get(url + "/v1/usage", headers=A1, params={"period": "year"})
        week = _usage(url, A1, period="week")
        post = httpx.post(url + "/v1/usage", headers=A1)
    assert anon.status_code == 401 and anon.json()["error"]["type"] == "authentication_error"
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_period"
    assert bad.json()["error"]["param"] == "period"
    assert "-W" in week["period"]["id"]
    assert post.status_code == 405


def test_a_spent_budget_is_an_openai_429_with_retry_after_at_the_periods_end(tmp_path):
    with gateway(tmp_path) as url:
        chat = url + "/v1/chat/completions"
        answers = [httpx.post(chat, json=CHAT, headers=A1) for _ in range(6)]
        other_tenant = httpx.post(chat, json=CHAT, headers=B1)
        usage = _usage(url, A1)
    assert [r.status_code for r in answers] == [200] * 5 + [429]  # 5 × 4 = 20: the sixth does not fit
    err = answers[-1].json()["error"]
    assert (err["type"], err["code"]) == ("insufficient_quota", "budget_exceeded")
    retry = int(answers[-1].headers["retry-after"])
    assert 0 < retry <= 86_400 and answers[-1].headers["x-should-retry"] == "false"
    assert answers[-1].headers["x-request-id"]
    assert other_tenant.status_code == 200
    assert usage["spend"] == 20.0 and usage["budgets"]["tenant"]["remaining"] == 0.0


def test_a_keys_budget_refuses_that_key_while_the_tenants_other_keys_go_on(tmp_path):
    with gateway(tmp_path) as url:
        chat = url + "/v1/chat/completions"
        codes = [httpx.post(chat, json=CHAT, headers=A2).status_code for _ in range(2)]
        other = httpx.post(chat, json=CHAT, headers=A1)
    assert codes == [200, 429] and other.status_code == 200  # 4 of the key's 6, then 8 > 6


def test_a_refused_or_failed_request_and_a_cache_hit_give_their_reservation_back(tmp_path):
    """Settled on every path: a backend's error costs nothing, a cache hit costs nothing, only answers count."""
    with gateway(tmp_path, cloud_mode="error500") as url:
        chat = url + "/v1/chat/completions"
        failed = httpx.post(chat, json={**CHAT, "model": "tiergate-cloud"}, headers=A1)
        cached = {**CHAT, "temperature": 0}
        first, hit = (httpx.post(chat, json=cached, headers=A1) for _ in range(2))
        usage = _usage(url, A1)
    assert failed.status_code >= 500
    assert first.headers["x-tiergate-cache"] == "miss" and hit.headers["x-tiergate-cache"].startswith("hit")
    assert hit.headers["x-tiergate-cost"] == "0.0000000000"
    assert usage["spend"] == 4.0 and usage["budgets"]["tenant"]["remaining"] == 16.0


def test_past_the_hard_limit_a_downgrade_budget_answers_from_the_cheaper_tier(tmp_path):
    downgrade = SECTIONS.replace("      soft: 10\n", "      soft: 10\n      on_exceed: downgrade\n"
                                                    "      downgrade_to: edge\n")
    with ExitStack() as es:
        edge = es.enter_context(aiohttp_server(make_app(8, "ok", model="edge-model")))
        cloud = es.enter_context(aiohttp_server(make_app(8, "ok", model="cloud-model")))
        path = write_policy(tmp_path / "policy.yaml", [edge.url], [cloud.url], fallback=False)
        path.write_text(path.read_text() + downgrade)
        gw = es.enter_context(gateway_server(Settings(policy=path, embedder=None, redis_url=None), keyring=KEYS))
        chat = gw.url + "/v1/chat/completions"
        cloud_answers = [httpx.post(chat, json={**CHAT, "model": "tiergate-cloud"}, headers=A1) for _ in range(2)]
        downgraded = httpx.post(chat, json={**CHAT, "model": "tiergate-cloud"}, headers=A1)  # 16 + 8 > 20
        refused = httpx.post(chat, json={**CHAT, "model": "tiergate-cloud"}, headers=A1)  # 20: not even the edge
    assert [r.headers["x-tiergate-tier"] for r in cloud_answers] == ["cloud", "cloud"]
    assert downgraded.status_code == 200 and downgraded.headers["x-tiergate-tier"] == "edge"
    assert downgraded.headers["x-tiergate-cost"].startswith("4.")
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exceeded"


def _stream(url: str, headers: dict[str, str], **body: object) -> list[dict]:
    with httpx.stream("POST", url + "/v1/chat/completions", headers=headers,
                      json={**CHAT, "stream": True, **body}) as r:
        assert r.status_code == 200
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [msgspec.json.decode(x) for x in lines[:-1]]


def test_a_streams_usage_chunk_carries_its_cost_when_asked_for_usage(tmp_path):
    with gateway(tmp_path) as url:
        asked = _stream(url, A1, stream_options={"include_usage": True})
        opted_out = _stream(url, {**A1, "x-tiergate-cost": "off"}, stream_options={"include_usage": True})
        plain = _stream(url, A1)
        usage = _usage(url, A1)
    assert asked[-1]["choices"] == [] and asked[-1]["usage"]["cost"] == 4.0
    assert asked[-1]["usage"]["completion_tokens"] == 4
    assert "cost" not in opted_out[-1]["usage"]
    assert all("usage" not in c for c in plain)
    assert usage["spend"] == 12.0  # what the stream's chunk said is what was recorded


def test_a_policy_can_turn_the_streams_cost_off(tmp_path):
    off = SECTIONS.replace("budgets:\n", "budgets:\n  stream_cost: false\n")
    with ExitStack() as es:
        edge = es.enter_context(aiohttp_server(make_app(8, "ok", model="edge-model")))
        path = write_policy(tmp_path / "policy.yaml", [edge.url], [edge.url], fallback=False)
        path.write_text(path.read_text() + off)
        gw = es.enter_context(gateway_server(Settings(policy=path, embedder=None, redis_url=None), keyring=KEYS))
        chunks = _stream(gw.url, A1, stream_options={"include_usage": True})
    assert chunks[-1]["usage"]["completion_tokens"] == 4 and "cost" not in chunks[-1]["usage"]


def test_a_cached_stream_carries_its_cost_too(tmp_path):
    with gateway(tmp_path) as url:
        _stream(url, A1, temperature=0, stream_options={"include_usage": True})
        hit = _stream(url, A1, temperature=0, stream_options={"include_usage": True})
    assert hit[-1]["usage"]["cost"] == 0.0


@pytest.mark.parametrize("kind", ["chat", "text"])
def test_the_openai_sdk_parses_a_stream_whose_usage_carries_the_cost(tmp_path, kind):
    with gateway(tmp_path) as url:
        client = OpenAI(base_url=url + "/v1", api_key="key-alpha-1", max_retries=0)
        if kind == "chat":
            stream = client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=4, stream=True, stream_options={"include_usage": True})
        else:
            stream = client.completions.create(model="auto", prompt="hi", max_tokens=4, stream=True,
                                               stream_options={"include_usage": True})
        chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 4
    assert (usage.model_extra or {})["cost"] == 4.0  # an extra field: the SDK's models keep it
