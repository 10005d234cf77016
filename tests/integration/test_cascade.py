"""The confidence cascade through a real gateway, with a real llama.cpp edge node (SmolLM2) as the first tier.

The escalation target is an instant OpenAI-compatible backend, whose answers ("w0 w1 ...") tell at once which tier
answered. Each case checks that the client got exactly one answer (one body, or one stream ending in one
`[DONE]`), from the tier the headers name, with that answer's usage.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.edge import EdgeProcess, start_edge_node
from tests.support.instant_upstream import HITS, make_app
from tests.support.servers import aiohttp_server, gateway_server
from tests.support.waiting import wait_until
from tiergate.edge_node.model.packaged import packaged_path
from tiergate.gateway.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

AUTH = {"Authorization": "Bearer tg-demo-key"}
SURE = "What is the capital of France? Answer with one word."


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EdgeProcess]:
    with start_edge_node(packaged_path("smollm2-135m-instruct"), "--parallel", "2", "--ctx", "2048",
                         "--model-name", "smollm2", workdir=tmp_path_factory.mktemp("cascade-edge")) as node:
        yield node


def _policy(path: Path, edge: str, cloud: str, cascade: str) -> Path:
    path.write_text(f"""
version: 1
defaults:
  cache: {{enabled: false}}
  timeouts: {{connect_s: 1, first_byte_s: 60, between_chunks_s: 30, total_s: 120, queue_s: 5}}
tiers:
  edge: {{kind: edge, model: tiergate-edge, endpoints: ["{edge}"], max_context: 2048}}
  cloud: {{kind: cloud, model: tiergate-cloud, stand_in: true, endpoints: ["{cloud}"]}}
rules:
  - name: cascade
    tier: edge
    fallbacks: [cloud]
    cascade: {cascade}
""")
    return path


def _ask(url: str, *, stream: bool, prompt: str = SURE, **extra) -> tuple[httpx.Response, str, list[dict]]:
    body = {"model": "auto", "messages": [{"role": "user", "content": prompt}], "max_tokens": 16,
            "temperature": 0, "stream": stream, **extra}
    if not stream:
        r = httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH, timeout=120)
        assert r.status_code == 200, r.text
        return r, r.json()["choices"][0]["message"]["content"], [r.json()]
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream_options": {"include_usage": True}},
                      headers=AUTH, timeout=120) as r:
        assert r.status_code == 200
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines.count("[DONE]") == 1 and lines[-1] == "[DONE]"  # one stream, ended once
    events = [json.loads(x) for x in lines[:-1]]
    assert not any("error" in e for e in events)
    text = "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices") or ())
    return r, text, events


def _usage(events: list[dict]) -> dict:
    return next(e["usage"] for e in events if e.get("usage"))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_confident_edge_answer_is_kept_as_the_only_answer(edge, tmp_path, stream):
    with aiohttp_server(make_app(chunks=4, model="cloud-model")) as cloud:
        policy = _policy(tmp_path / "p.yaml", edge.url, cloud.url,
                         "{min_mean_logprob: -3.0, first_tokens: 4}")
        with gateway_server(Settings(policy=policy, embedder=None, redis_url=None)) as gw:
            r, text, events = _ask(gw.url, stream=stream)
            assert r.headers["x-tiergate-cascade"] == "kept" and r.headers["x-tiergate-tier"] == "edge"
            assert r.headers["x-tiergate-cascade-reason"] == "confident"
            assert float(r.headers["x-tiergate-confidence"]) >= -3.0
            assert "Paris" in text and cloud.app[HITS] == 0
            assert all(c.get("logprobs") is None for e in events for c in e.get("choices") or ())  # not asked for
            usage = _usage(events)
            assert usage["completion_tokens"] >= 1 and usage["prompt_tokens"] > 10  # the edge's own usage
            kept = gw.gateway.registry.get_sample_value("tiergate_cascade_total",
                                                        {"rule": "cascade", "outcome": "kept", "reason": "confident"})
            assert kept == 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_unsure_edge_answer_escalates_and_the_edge_work_is_charged(edge, tmp_path, stream):
    with aiohttp_server(make_app(chunks=4, model="cloud-model")) as cloud:
        # No answer is that sure: every token would need log-probability >= -0.0001.
        policy = _policy(tmp_path / "p.yaml", edge.url, cloud.url, "{min_token_logprob: -0.0001}")
        with gateway_server(Settings(policy=policy, embedder=None, redis_url=None)) as gw:
            r, text, events = _ask(gw.url, stream=stream, logprobs=True, top_logprobs=1)
            assert r.headers["x-tiergate-cascade"] == "escalated" and r.headers["x-tiergate-tier"] == "cloud"
            assert r.headers["x-tiergate-cascade-reason"] == "low_token_logprob"
            assert text.startswith("w0 w1") and "Paris" not in text and cloud.app[HITS] == 1
            assert _usage(events)["completion_tokens"] == 4  # the cloud answer's usage, not the edge's
            reg = gw.gateway.registry
            wait_until(lambda: (reg.get_sample_value("tiergate_cascade_escalated_edge_tokens_total",
                                                     {"rule": "cascade"}) or 0) > 10, what="edge tokens counted")
            assert reg.get_sample_value("tiergate_cascade_escalated_edge_seconds_total", {"rule": "cascade"}) > 0


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("first_tier", ["dead", "stall"])
def test_an_edge_that_fails_or_runs_out_of_time_escalates(tmp_path, stream, first_tier):
    with aiohttp_server(make_app(chunks=4, model="cloud-model")) as cloud, \
            aiohttp_server(make_app(chunks=4, mode="hang", model="edge-model")) as hung:
        edge_url = "http://127.0.0.1:9" if first_tier == "dead" else hung.url
        policy = _policy(tmp_path / "p.yaml", edge_url, cloud.url, "{min_mean_logprob: -3.0, budget_s: 1.0}")
        with gateway_server(Settings(policy=policy, embedder=None, redis_url=None), ready=False) as gw:
            r, text, _ = _ask(gw.url, stream=stream)
            assert r.headers["x-tiergate-cascade"] == "escalated" and r.headers["x-tiergate-tier"] == "cloud"
            expected = "first_tier_failed" if first_tier == "dead" else "timeout"
            assert r.headers["x-tiergate-cascade-reason"] == expected
            assert text.startswith("w0 w1") and cloud.app[HITS] == 1
