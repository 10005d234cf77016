"""The cache through real gateways: two `tiergate serve` processes sharing one Redis 8 (cache, rate limits, edge
registry, feedback), the headers and /readyz, and answers that must never be stored (errors, cut streams)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import write_policy
from tests.support.instant_upstream import GATE, HITS, LAST_BODY, MODE, make_app
from tests.support.redis import flushed
from tests.support.registration import CLAIM
from tests.support.servers import aiohttp_server, free_port, gateway_server
from tests.support.waiting import wait_until
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

KEYS = """\
tenants:
  acme: {requests_per_minute: 100000}
  globex: {requests_per_minute: 100000}
  limited: {requests_per_minute: 4}
keys:
  - {tenant: acme, key: acme-key-123}
  - {tenant: globex, key: globex-key-123}
  - {tenant: limited, key: limited-key-123}
"""

POLICY = """\
version: 1
defaults:
  timeouts: {{connect_s: 1.0, first_byte_s: 10, between_chunks_s: 10, total_s: 30, queue_s: 5}}
  cache: {{enabled: true, semantic: true, threshold: 0.94, ttl_s: 3600, max_temperature: 0.3}}
tiers:
  edge:
    kind: edge
    model: tiergate-edge
    endpoints: []
  cloud:
    kind: cloud
    model: tiergate-cloud
    served_model: cloud-model
    endpoints: ["{cloud}"]
rules:
  - name: default
    tier: edge
    fallbacks: [cloud]
"""


def ask(url: str, text: str, key: str = "acme-key-123", *, stream: bool = False, rid: str | None = None,
        max_tokens: int = 6) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} | ({"x-request-id": rid} if rid else {})
    return httpx.post(url + "/v1/chat/completions", headers=headers, timeout=30, json={
        "model": "auto", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
        "temperature": 0, "stream": stream})


def feedback(url: str, rid: str, key: str = "acme-key-123") -> httpx.Response:
    return httpx.post(url + "/v1/cache/feedback", headers={"authorization": f"Bearer {key}"}, timeout=30,
                      json={"request_id": rid})


@contextmanager
def serve(tmp_path: Path, name: str, env: dict[str, str]) -> Iterator[str]:
    """`tiergate serve` in its own process (its own Python, event loop and cache) until the block ends."""
    port = free_port()
    log = (tmp_path / f"{name}.log").open("wb")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "tiergate"), "serve"], stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=os.environ | env | {"TIERGATE_PORT": str(port), "TIERGATE_LOG_FORMAT": "console"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: proc.poll() is None and _ready(url), timeout_s=120, interval_s=0.1,
                   what=f"{name} to be ready (see {tmp_path / (name + '.log')})")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_two_gateway_processes_share_one_redis_8(tmp_path: Path, redis8_server, embedder_dir):
    url = flushed(redis8_server)
    with ExitStack() as es:
        edge = es.enter_context(aiohttp_server(make_app(4, "ok", model="edge-model")))
        cloud = es.enter_context(aiohttp_server(make_app(4, "ok", model="cloud-model")))
        (tmp_path / "policy.yaml").write_text(POLICY.format(cloud=cloud.url))
        (tmp_path / "keys.yaml").write_text(KEYS)
        env = {"TIERGATE_POLICY": str(tmp_path / "policy.yaml"), "TIERGATE_API_KEYS_FILE": str(tmp_path / "keys.yaml"),
               "TIERGATE_REDIS_URL": url, "TIERGATE_EMBEDDER": str(embedder_dir)}
        one = es.enter_context(serve(tmp_path, "one", env))
        two = es.enter_context(serve(tmp_path, "two", env | {"TIERGATE_CACHE_VSET_SEARCH": "threaded"}))  # both paths

        for gw in (one, two):  # which store serves, in /readyz
            cache = httpx.get(gw + "/readyz", timeout=5).json()["cache"]
            assert cache["store"] == "redis-vectorset" and cache["up"] is True and cache["vector_sets"] is True

        # The edge registry: a node heard by gateway one is used by gateway two.
        beat = httpx.post(one + "/edge/v1/heartbeat", timeout=5, headers=CLAIM, json={
            "node_id": "node-a", "url": edge.url, "model": "edge-model", "slots": 4, "busy": 0, "queued": 0,
            "ctx": 2048})
        assert beat.status_code == 200, beat.text
        asked = iter(range(10_000))  # a new question each time: a cached answer would say tier "cache"
        wait_until(lambda: ask(two, f"Which tier answers question {next(asked)}?").headers["x-tiergate-tier"] == "edge",
                   timeout_s=30, what="gateway two to route to the edge node gateway one registered")

        # The cache: stored by one, hit (exact and semantic) by two.
        first = ask(one, "How do I invest my money wisely?")
        assert first.status_code == 200 and first.headers["x-tiergate-cache"] == "miss"
        assert ask(two, "How do I invest my money wisely?").headers["x-tiergate-cache"] == "hit-exact"
        para = ask(two, "How can I invest my money wisely?", rid="para-1")
        assert para.headers["x-tiergate-cache"] == "hit-semantic" and para.headers["x-request-id"] == "para-1"
        sim = float(para.headers["x-tiergate-cache-similarity"])
        assert 0.94 <= sim < 1.0 and para.headers["x-tiergate-similarity"] == para.headers["x-tiergate-cache-similarity"]
        assert para.json()["choices"][0]["message"]["content"] == first.json()["choices"][0]["message"]["content"]
        other = ask(two, "How can I invest my money wisely?", "globex-key-123")
        assert other.headers["x-tiergate-cache"] == "miss"  # never across tenants

        # Feedback: only the tenant that got the answer can report it, through either gateway.
        wait_until(lambda: feedback(one, "para-1", "globex-key-123").status_code == 404 and
                   feedback(one, "para-1").status_code == 200, timeout_s=30,
                   what="the hit's record to be written (after its response) and reported")
        assert feedback(one, "never-seen").status_code == 404
        again = feedback(two, "para-1").json()
        assert again["already_reported"] is True and again["invalidated"] == 0
        assert ask(one, "How do I invest my money wisely?").headers["x-tiergate-cache"] == "miss"  # invalidated

        # Rate limits: 4 a minute for `limited`, counted across both gateways.
        codes = [ask((one, two)[i % 2], f"limited question {i}", "limited-key-123").status_code for i in range(6)]
        assert codes == [200, 200, 200, 200, 429, 429]

        metrics = httpx.get(two + "/metrics", timeout=5).text
        assert 'tiergate_cache_store{store="redis-vectorset"} 1.0' in metrics
        assert 'tiergate_cache_feedback_total{result="applied"}' in metrics or \
            'tiergate_cache_feedback_total{result="applied"}' in httpx.get(one + "/metrics", timeout=5).text


@pytest.mark.parametrize("version", ["redis7", "redis8"])
def test_error_answers_and_cut_streams_are_never_stored(tmp_path: Path, version, request):
    url = flushed(request.getfixturevalue(f"{version}_server"))
    keys = KeyRing.from_inline("acme-key-123=acme:normal")
    with aiohttp_server(make_app(6, "error500", model="edge-model")) as edge:
        pol = write_policy(tmp_path / "policy.yaml", [edge.url], [edge.url], fallback=False, cache=True)
        with gateway_server(Settings(policy=pol, embedder=None, redis_url=url), keyring=keys) as gw:
            def miss_then(text: str, stream: bool) -> httpx.Response:
                return ask(gw.url, text, stream=stream)

            failed = miss_then("An error answer?", False)
            assert failed.status_code == 502
            edge.app[MODE] = "cut"  # the backend dies in the middle of a stream
            cut = miss_then("A cut stream?", True)
            assert cut.status_code == 200 and "upstream_" in cut.text and "[DONE]" in cut.text
            edge.app[MODE] = "ok"
            for text in ("An error answer?", "A cut stream?"):  # neither was stored: both miss again
                again = ask(gw.url, text)
                assert again.status_code == 200 and again.headers["x-tiergate-cache"] == "miss", text
            wait_until(lambda: ask(gw.url, "A cut stream?").headers["x-tiergate-cache"] == "hit-exact",
                       what="the complete answer to be stored (after its response)")
            stores = gw.gateway.registry.get_sample_value("tiergate_cache_stores_total", {"result": "stored"})
            assert stores == 2  # the two complete answers, nothing else


def test_a_shadow_check_serves_the_hit_and_sends_the_request_to_the_tier_too(tmp_path: Path, redis8_server,
                                                                             embedder_dir):
    url = flushed(redis8_server)
    q, para = "How do I invest my money wisely?", "How can I invest my money wisely?"
    pairs = tmp_path / "pairs.jsonl"  # labelled evidence that pairs like this one are right: a certified cutoff
    pairs.write_text("".join(json.dumps({"a": q, "b": para, "duplicate": True}) + "\n" for _ in range(400)))
    seeded = subprocess.run([str(Path(sys.executable).parent / "tiergate"), "cache", "seed-bound", str(pairs),
                             "--tenant", "acme", "--redis", url, "--embedder", str(embedder_dir)],
                            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert seeded.returncode == 0, seeded.stderr
    assert json.loads(seeded.stdout)["cutoffs"]["0.1"]["0.7"] is not None  # they share every content word
    with ExitStack() as es:
        cloud = es.enter_context(aiohttp_server(make_app(4, "ok", model="cloud-model", echo=True)))
        # The rule sends to the cloud, the one tier with a backend here: an answer from a fallback tier stands for a
        # tier the decision did not choose and is not stored (cache.keys.Route).
        policy = POLICY.format(cloud=cloud.url).replace(
            "max_temperature: 0.3}", "max_temperature: 0.3, max_false_hit_rate: 0.1, verify_rate: 1.0, "
                                     "verify_mode: shadow}").replace("tier: edge\n    fallbacks: [cloud]", "tier: cloud")
        assert "tier: cloud\n" in policy
        (tmp_path / "policy.yaml").write_text(policy)
        (tmp_path / "keys.yaml").write_text(KEYS)
        gw = es.enter_context(serve(tmp_path, "gw", {
            "TIERGATE_POLICY": str(tmp_path / "policy.yaml"), "TIERGATE_API_KEYS_FILE": str(tmp_path / "keys.yaml"),
            "TIERGATE_REDIS_URL": url, "TIERGATE_EMBEDDER": str(embedder_dir), "TIERGATE_CACHE_SHADOW_CONCURRENCY": "1"}))

        first = ask(gw, q)
        assert first.headers["x-tiergate-cache"] == "miss" and cloud.app[HITS] == 1
        cached = first.json()["choices"][0]["message"]["content"]
        wait_until(lambda: ask(gw, q).headers["x-tiergate-cache"] == "hit-exact", what="the answer to be stored")

        def metric(name: str) -> str:
            return next((line for line in httpx.get(gw + "/metrics", timeout=5).text.splitlines()
                         if line.startswith(name)), "")

        cloud.app[MODE] = "error500"  # the check cannot get an answer: the client never notices
        hit = ask(gw, para)
        assert hit.status_code == 200 and hit.headers["x-tiergate-cache"] == "hit-semantic", hit.text
        wait_until(lambda: metric('tiergate_cache_shadow_checks_total{result="failed"}').endswith(" 1.0"),
                   what="the failed shadow check to be counted")
        cloud.app[MODE] = "gated"  # the tier holds the next check until the test lets it answer
        hit = ask(gw, para, stream=True)  # sampled for a check again (verify_rate 1.0): served from the cache anyway
        assert hit.status_code == 200 and hit.headers["x-tiergate-cache"] == "hit-semantic", hit.text
        chunks = [json.loads(line[6:]) for line in hit.text.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == cached
        wait_until(lambda: cloud.app[HITS] == 3, what="the shadow check to reach the tier")
        busy = ask(gw, para)  # its check finds no room (one at a time here): dropped, the client served all the same
        assert busy.status_code == 200 and busy.headers["x-tiergate-cache"] == "hit-semantic"
        wait_until(lambda: metric('tiergate_cache_shadow_checks_total{result="dropped"}').endswith(" 1.0"),
                   what="the check that found no room to be counted (after the response)")
        cloud.app[GATE].set()
        wait_until(lambda: metric('tiergate_cache_shadow_checks_total{result="checked"}').endswith(" 1.0"),
                   what="the shadow check to get the tier's answer and compare it")
        assert cloud.app[HITS] == 3  # the paraphrase went to the tier as well, as JSON; the dropped check did not
        sent = json.loads(cloud.app[LAST_BODY])
        assert sent["messages"][-1]["content"] == para and "stream" not in sent and "stream_options" not in sent
        labels = [line for line in httpx.get(gw + "/metrics", timeout=5).text.splitlines()
                  if line.startswith("tiergate_cache_verifications_total{")]
        assert len(labels) == 1 and 'source="verify"' in labels[0] and labels[0].endswith(" 1.0")  # right or wrong
        assert ask(gw, para).headers["x-tiergate-cache"] == "hit-exact"  # the tier's answer was stored for it
