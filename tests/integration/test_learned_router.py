"""The learned router end to end: a real gateway on real Redis (7 and 8), a real llama.cpp edge node (SmolLM2) as
the cascade's first tier, and an instant cloud stand-in whose answers ("w0 w1 ...") say which tier answered.

One story per Redis: with no model the decision is the cascade's, as without a router, and the cascade's judgment
becomes an outcome record in Redis (no prompt text); `tiergate classifier train --from-outcomes` reads the stream
and writes the model; the running gateway picks it up without a restart and sends a predicted failure straight to
the cloud, while exploration still has the edge answer it unseen and records that label too.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from typer.testing import CliRunner

from tests.support.edge import EdgeProcess, start_edge_node
from tests.support.instant_upstream import HITS, make_app
from tests.support.servers import aiohttp_server, gateway_server
from tests.support.waiting import wait_until
from tiergate.complexity.cli import classifier_app
from tiergate.complexity.edge_router import FEATURES_VERSION, RouterArtifact, router_features
from tiergate.edge_node.model.packaged import packaged_path
from tiergate.gateway.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

AUTH = {"Authorization": "Bearer tg-demo-key"}
SURE = "What is the capital of France? Answer with one word."
MMLU = "Which of these is a noble gas?\nA. Oxygen\nB. Neon\nC. Nitrogen\nD. Hydrogen\nAnswer:"
STREAM = "tiergate:outcomes"


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EdgeProcess]:
    with start_edge_node(packaged_path("smollm2-135m-instruct"), "--parallel", "2", "--ctx", "2048",
                         "--model-name", "smollm2", workdir=tmp_path_factory.mktemp("router-edge")) as node:
        yield node


def _policy(path: Path, edge: str, cloud: str) -> Path:
    path.write_text(f"""
version: 1
defaults:
  cache: {{enabled: false}}
  timeouts: {{connect_s: 1, first_byte_s: 60, between_chunks_s: 30, total_s: 120, queue_s: 5}}
tiers:
  edge: {{kind: edge, model: tiergate-edge, endpoints: ["{edge}"], max_context: 2048}}
  cloud: {{kind: cloud, model: tiergate-cloud, stand_in: true, endpoints: ["{cloud}"]}}
router: {{model: router.json, explore: 1.0}}
rules:
  - name: predicted-failure
    when: {{edge_success: {{max: 0.2}}}}
    tier: cloud
  - name: cascade
    tier: edge
    fallbacks: [cloud]
    cascade: {{min_mean_logprob: -3.0}}
""")
    return path


def _ask(url: str, prompt: str) -> httpx.Response:
    body = {"model": "auto", "messages": [{"role": "user", "content": prompt}], "max_tokens": 16, "temperature": 0}
    r = httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    return r


def _records(client: redis.Redis) -> list[dict]:
    return [json.loads(fields[b"r"]) for _, fields in client.xrange(STREAM)]


def _history(n: int) -> list[dict]:
    """Earlier outcomes of this edge model: prompts with lettered options failed, plain questions stood."""
    rng = random.Random(0)
    out = []
    for i in range(n):
        mmlu = i % 2 == 0
        text = (f"Which of these is true of item {i}?\nA. one\nB. two\nC. three\nD. four\nAnswer:" if mmlu
                else f"What is the capital of country number {i}? Answer with one word.")
        f = router_features(prompt_tokens=len(text) // 3, complexity=rng.random(), max_tokens=16, temperature=0,
                            stream=False, text=text)
        stood = rng.random() < (0.03 if mmlu else 0.95)
        out.append({"ts": 0, "label": int(stood), "edge_version": "smollm2", "fv": FEATURES_VERSION,
                    "features": f.to_json(), "tenant": "demo", "rule": "cascade", "source": "cascade",
                    "reason": "confident" if stood else "low_mean_logprob"})
    return out


def test_outcomes_train_a_router_that_the_gateway_follows_without_restart(edge, tmp_path, redis_url):
    client = redis.Redis.from_url(redis_url)
    with aiohttp_server(make_app(chunks=4, model="cloud-model")) as cloud:
        policy = _policy(tmp_path / "p.yaml", edge.url, cloud.url)
        with gateway_server(Settings(policy=policy, embedder=None, redis_url=redis_url)) as gw:
            reg = gw.gateway.registry
            # Cold start: no model, so the cascade decides as it would without the router rule.
            r = _ask(gw.url, SURE)
            assert r.headers["x-tiergate-rule"] == "cascade" and r.headers["x-tiergate-tier"] == "edge"
            assert r.headers["x-tiergate-cascade"] == "kept" and cloud.app[HITS] == 0
            wait_until(lambda: len(_records(client)) == 1, what="the cascade's outcome in Redis")
            rec = _records(client)[0]
            assert (rec["label"], rec["edge_version"], rec["source"], rec["rule"], rec["tenant"]) == \
                (1, "smollm2", "cascade", "cascade", "demo")
            assert "prompt" not in rec and "France" not in json.dumps(rec)  # demo never opted in to distillation
            assert client.xinfo_stream(STREAM)["length"] == 1

            # More history of this edge model, then training straight from the stream.
            for old in _history(300):
                client.xadd(STREAM, {"r": json.dumps(old)})
            out = tmp_path / "router.json"
            trained = CliRunner().invoke(classifier_app, ["train", "--from-outcomes", redis_url, "--out", str(out)])
            assert trained.exit_code == 0, trained.output
            summary = json.loads(trained.output)
            assert summary["edge_version"] == "smollm2" and summary["outcomes"] == 301
            assert RouterArtifact.load(out).get("smollm2") is not None

            # The running gateway reads the new model: the MMLU-like prompt goes straight to the cloud ...
            def routed() -> bool:
                return _ask(gw.url, MMLU).headers["x-tiergate-rule"] == "predicted-failure"

            wait_until(routed, timeout_s=30, interval_s=0.3, what="the router model in force")
            r = _ask(gw.url, MMLU)
            assert r.headers["x-tiergate-tier"] == "cloud" and "x-tiergate-cascade" not in r.headers
            assert r.json()["choices"][0]["message"]["content"].startswith("w0 w1")
            # ... while the plain question keeps the cascade (the uncertain band and above).
            assert _ask(gw.url, SURE).headers["x-tiergate-rule"] == "cascade"

            # Exploration (share 1.0 here): the edge also answered the routed requests, unseen, and was judged.
            wait_until(lambda: any(x["source"] == "explore" for x in _records(client)), timeout_s=60,
                       what="an explored outcome")
            explored = next(x for x in _records(client) if x["source"] == "explore")
            assert explored["rule"] == "predicted-failure" and explored["edge_version"] == "smollm2"
            assert reg.get_sample_value("tiergate_router_routed_total",
                                        {"rule": "predicted-failure", "explored": "true"}) >= 2
            wait_until(lambda: (reg.get_sample_value("tiergate_router_explorations_total",
                                                     {"result": "judged"}) or 0) >= 2, timeout_s=60,
                       what="every exploration judged")
            assert reg.get_sample_value("tiergate_router_explore_share") == 1.0
    client.close()


def test_an_escalated_draft_becomes_an_agreement_outcome_that_training_prefers(edge, tmp_path, redis_url):
    """The cascade escalates every answer here, and the cloud tier is the same SmolLM2 node (greedy, so it answers
    as the edge did): the thrown-away draft agrees with the client's answer, and that graded label is in Redis."""
    client = redis.Redis.from_url(redis_url)
    policy = _policy(tmp_path / "p.yaml", edge.url, edge.url).read_text()
    policy = policy.replace("min_mean_logprob: -3.0", "min_mean_logprob: 0.0, min_margin: 1000")
    (tmp_path / "p.yaml").write_text(policy)
    with gateway_server(Settings(policy=tmp_path / "p.yaml", embedder=None, redis_url=redis_url)) as gw:
        reg = gw.gateway.registry
        body = {"model": "auto", "messages": [{"role": "user", "content": SURE}], "max_tokens": 48,
                "temperature": 0}
        r = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=120)
        assert r.status_code == 200, r.text
        assert r.headers["x-tiergate-cascade"] == "escalated" and r.headers["x-tiergate-tier"] == "cloud"
        answer = r.json()["choices"][0]["message"]["content"]
        assert r.json()["choices"][0]["finish_reason"] == "stop", answer  # a whole answer, so comparable

        wait_until(lambda: any(x["source"] == "agreement" for x in _records(client)), timeout_s=60,
                   what="the agreement outcome in Redis")
        cascade = next(x for x in _records(client) if x["source"] == "cascade")
        agreed = next(x for x in _records(client) if x["source"] == "agreement")
        assert cascade["label"] == 0  # the cascade escalated it ...
        assert (agreed["label"], agreed["reason"], agreed["edge_version"], agreed["rule"]) == \
            (1, "escalation", "smollm2", "cascade")  # ... yet the edge's draft was the same answer
        assert "prompt" not in agreed and "France" not in json.dumps(agreed)
        assert reg.get_sample_value("tiergate_router_outcomes_total", {"source": "agreement", "stood": "true"}) == 1
        assert reg.get_sample_value("tiergate_router_agreements_total",
                                    {"path": "escalation", "result": "agreed"}) == 1

    # Training prefers graded labels once there are enough: history graded as MMLU-fails, plus the real one.
    for old in _history(300):
        client.xadd(STREAM, {"r": json.dumps(old | {"source": "agreement", "reason": "escalation"})})
    out = tmp_path / "router.json"
    trained = CliRunner().invoke(classifier_app, ["train", "--from-outcomes", redis_url, "--out", str(out),
                                                  "--min-graded", "200"])
    assert trained.exit_code == 0, trained.output
    summary = json.loads(trained.output)
    assert (summary["labels"], summary["graded_records"], summary["outcomes"]) == ("graded", 301, 301)
    assert RouterArtifact.load(out).get("smollm2").meta["labels"] == "graded"
    client.close()


def test_a_kept_answer_sampled_for_verification_is_judged_against_the_cloud(edge, tmp_path, redis_url):
    """`verify: 1.0`: the cascade keeps the edge's answer (a threshold nothing fails), the client gets it at once,
    and the cloud tier (the same SmolLM2 node, greedy) is asked too, detached: the label is its agreement."""
    client = redis.Redis.from_url(redis_url)
    policy = _policy(tmp_path / "p.yaml", edge.url, edge.url).read_text()
    policy = policy.replace("min_mean_logprob: -3.0", "min_mean_logprob: -100.0").replace(
        "explore: 1.0", "explore: 1.0, verify: 1.0")
    (tmp_path / "p.yaml").write_text(policy)
    with gateway_server(Settings(policy=tmp_path / "p.yaml", embedder=None, redis_url=redis_url)) as gw:
        body = {"model": "auto", "messages": [{"role": "user", "content": SURE}], "max_tokens": 48,
                "temperature": 0}
        r = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=120)
        assert r.status_code == 200, r.text
        assert r.headers["x-tiergate-cascade"] == "kept" and r.headers["x-tiergate-tier"] == "edge"
        assert r.json()["choices"][0]["finish_reason"] == "stop"
        wait_until(lambda: any(x["source"] == "agreement" for x in _records(client)), timeout_s=60,
                   what="the verified answer's agreement outcome in Redis")
        verified = next(x for x in _records(client) if x["source"] == "agreement")
        assert (verified["label"], verified["reason"], verified["edge_version"]) == (1, "verify", "smollm2")
        assert gw.gateway.registry.get_sample_value("tiergate_router_agreements_total",
                                                    {"path": "verify", "result": "agreed"}) == 1
    client.close()
