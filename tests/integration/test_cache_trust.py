"""Issue 39, items 4 and 5, through a real gateway on Redis 8 (vector sets) with the real embedder.

- The cache key includes what changes the answer: the routing decision (its tier and the effective max_tokens),
  the last user message's `name`, and log-probabilities asked for in any form (a bypass).
- A semantic hit is never an opposite: "maximum" is not answered with "minimum" (the antonym guard).

Each scenario is the one the issue reported, as a client would see it: the headers and the answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.support.instant_upstream import HITS, make_app
from tests.support.redis import flushed
from tests.support.servers import aiohttp_server, gateway_server
from tests.support.waiting import wait_until
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

KEY = "acme-key-123"
POLICY = """\
version: 1
defaults:
  timeouts: {{connect_s: 1.0, first_byte_s: 10, between_chunks_s: 10, total_s: 30, queue_s: 5}}
  cache: {{enabled: true, semantic: true, threshold: 0.94, ttl_s: 3600, max_temperature: 0.3}}
tiers:
  edge:
    kind: edge
    model: tiergate-edge
    endpoints: ["{edge}"]
  cloud:
    kind: cloud
    model: tiergate-cloud
    served_model: cloud-model
    endpoints: ["{cloud}"]
rules:
  - name: free-plan
    when: {{headers: {{x-plan: free}}}}
    tier: edge
    max_tokens: 4
  - name: reasoning-request
    when:
      keywords: {{any: ["step by step"]}}
      priority: {{min: normal}}
    tier: cloud
  - name: default
    tier: edge
"""


@pytest.fixture
def gateway(tmp_path: Path, redis8_server, embedder_dir) -> Iterator[dict]:
    with ExitStack() as es:
        edge = es.enter_context(aiohttp_server(make_app(8, "ok", model="edge-model")))
        cloud = es.enter_context(aiohttp_server(make_app(8, "ok", model="cloud-model")))
        policy = tmp_path / "policy.yaml"
        policy.write_text(POLICY.format(edge=edge.url, cloud=cloud.url))
        settings = Settings(policy=policy, embedder=str(embedder_dir), redis_url=flushed(redis8_server))
        gw = es.enter_context(gateway_server(settings, keyring=KeyRing.from_inline(f"{KEY}=acme:normal")))
        cache = httpx.get(gw.url + "/readyz", timeout=5).json()["cache"]
        assert cache["store"] == "redis-vectorset" and cache["up"] is True
        yield {"url": gw.url, "edge": edge, "cloud": cloud}


def chat(url: str, text: str, *, headers: dict[str, str] | None = None, name: str | None = None,
         max_tokens: int = 32) -> httpx.Response:
    message = {"role": "user", "content": text} | ({"name": name} if name else {})
    r = httpx.post(url + "/v1/chat/completions", timeout=30, headers={"authorization": f"Bearer {KEY}"} | (headers or {}),
                   json={"model": "auto", "messages": [message], "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r


def stored(url: str, text: str, **kw) -> None:
    """Ask once (not a hit: a miss, or a bypass when a loaded machine makes the lookup time out), then wait until
    the answer is in the cache (it is stored after the response)."""
    assert not chat(url, text, **kw).headers["x-tiergate-cache"].startswith("hit")
    wait_until(lambda: chat(url, text, **kw).headers["x-tiergate-cache"] == "hit-exact",
               what="the answer to be stored (after its response)")


def test_an_answer_cut_by_a_rules_cap_is_not_served_to_an_uncapped_request(gateway):
    url = gateway["url"]
    q = "Explain how a hash map works."
    stored(url, q, headers={"x-plan": "free"})  # the free plan's rule caps max_tokens at 4
    capped = chat(url, q, headers={"x-plan": "free"})
    assert capped.json()["choices"][0]["finish_reason"] == "length"
    assert len(capped.json()["choices"][0]["message"]["content"].split()) == 4
    full = chat(url, q)  # the same tenant, the same max_tokens (32), no cap
    assert full.headers["x-tiergate-cache"] == "miss" and full.headers["x-tiergate-rule"] == "default"
    assert len(full.json()["choices"][0]["message"]["content"].split()) == 8  # the whole answer, not the 4 words


def test_an_edge_answer_is_not_served_to_a_request_the_policy_sends_to_the_cloud(gateway):
    url, cloud = gateway["url"], gateway["cloud"]
    q = "Explain step by step how to boil an egg."
    low = {"x-tiergate-priority": "low"}  # below the reasoning rule's priority: the default rule, the edge
    stored(url, q, headers=low)
    assert chat(url, q, headers=low).headers["x-tiergate-tier"] == "cache"
    before = cloud.app[HITS]
    normal = chat(url, q)  # normal priority: the reasoning rule, the cloud
    assert normal.headers["x-tiergate-rule"] == "reasoning-request"
    assert normal.headers["x-tiergate-cache"] == "miss" and normal.headers["x-tiergate-tier"] == "cloud"
    assert cloud.app[HITS] == before + 1
    assert normal.json()["model"] == "cloud-model"  # the cloud's own answer


def test_the_askers_name_is_part_of_the_key(gateway):
    url = gateway["url"]
    stored(url, "What is my name?", name="alice")
    assert chat(url, "What is my name?", name="bob").headers["x-tiergate-cache"] == "miss"
    assert chat(url, "What is my name?").headers["x-tiergate-cache"] == "miss"


def test_completions_asking_for_logprobs_0_bypass_the_cache(gateway):
    url = gateway["url"]

    def complete(**extra) -> httpx.Response:
        r = httpx.post(url + "/v1/completions", timeout=30, headers={"authorization": f"Bearer {KEY}"},
                       json={"model": "auto", "prompt": "The capital of France is", "max_tokens": 8,
                             "temperature": 0} | extra)
        assert r.status_code == 200, r.text
        return r

    wait_until(lambda: complete().headers["x-tiergate-cache"] == "hit-exact", what="the answer to be stored")
    for n, logprobs in enumerate((0, 1), 1):
        assert complete(logprobs=logprobs).headers["x-tiergate-cache"] == "bypass", logprobs
        skipped = [line for line in httpx.get(url + "/metrics", timeout=5).text.splitlines()
                   if line.startswith('tiergate_cache_skipped_total{reason="logprobs"}')]
        assert skipped == [f'tiergate_cache_skipped_total{{reason="logprobs"}} {float(n)}']  # for that reason


def test_a_dosage_question_is_never_answered_with_its_opposite(gateway):
    url = gateway["url"]
    stored(url, "What is the maximum daily dose of acetaminophen for adults?")
    for q in ("What is the minimum daily dose of acetaminophen for adults?",):
        r = chat(url, q)
        assert r.headers["x-tiergate-cache"] == "miss", (q, r.headers.get("x-tiergate-cache-similarity"))
    pairs = [("Is it legal to drive barefoot in California?", "Is it illegal to drive barefoot in California?"),
             ("Is it safe to eat raw cookie dough?", "Is it unsafe to eat raw cookie dough?"),
             ("Should I take ibuprofen before meals?", "Should I take ibuprofen after meals?"),
             ("How do I sort a list in ascending order in Python?",
              "How do I sort a list in descending order in Python?")]
    for a, b in pairs:
        stored(url, a)
        r = chat(url, b)
        assert r.headers["x-tiergate-cache"] == "miss", (b, r.headers.get("x-tiergate-cache-similarity"))
    para = chat(url, "What is the maximum daily dose of acetaminophen for an adult?")  # a paraphrase still hits
    assert para.headers["x-tiergate-cache"] == "hit-semantic"
