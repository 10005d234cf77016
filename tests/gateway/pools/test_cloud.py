"""CloudPool against small in-process fake vLLM servers: health, load, bad endpoints, breaker, DNS discovery."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from tests.support.servers import aiohttp_server, free_port
from tiergate.core.pool import Pool
from tiergate.core.wire import ChatRequest, Message
from tiergate.gateway.pools.cloud import CloudPool, CloudPoolSettings
from tiergate.gateway.pools.metrics import CloudMetrics
from tiergate.gateway.pools.selection import affinity_key

MODEL = "tiergate-cloud"


@dataclass
class FakeVllm:
    """Serves /health, /metrics and /v1/models like vLLM, from mutable fields."""

    model: str = MODEL
    max_model_len: int | None = None
    health_status: int = 200
    delay_s: float = 0.0
    running: int = 0
    waiting: int = 0
    kv: float = 0.0
    cache_info: str | None = None  # the labels of vllm:cache_config_info, when it is served
    counters: dict[str, float] = field(default_factory=lambda: {
        "prefix_cache_queries": 0, "prefix_cache_hits": 0, "generation_tokens": 0,
        "spec_decode_num_drafts": 0, "spec_decode_num_draft_tokens": 0, "spec_decode_num_accepted_tokens": 0})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", self.models)
        return app

    async def health(self, _r: web.Request) -> web.Response:
        await asyncio.sleep(self.delay_s)
        return web.Response(status=self.health_status)

    async def metrics(self, _r: web.Request) -> web.Response:
        labels = f'engine="0",model_name="{self.model}"'
        lines = [
            "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{labels}}} {self.running}",
            "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{labels}}} {self.waiting}",
            "# TYPE vllm:kv_cache_usage_perc gauge", f"vllm:kv_cache_usage_perc{{{labels}}} {self.kv}",
        ]
        for name, value in self.counters.items():
            lines += [f"# TYPE vllm:{name}_total counter", f"vllm:{name}_total{{{labels}}} {value}"]
        if self.cache_info is not None:
            lines += ["# TYPE vllm:cache_config_info gauge", f"vllm:cache_config_info{{{self.cache_info}}} 1.0"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def models(self, _r: web.Request) -> web.Response:
        entry = {"id": self.model, "object": "model"}
        if self.max_model_len is not None:
            entry["max_model_len"] = self.max_model_len
        return web.json_response({"object": "list", "data": [entry]})


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def req(system: str = "You are terse. " * 30, user: str = "hi") -> ChatRequest:
    return ChatRequest(model=MODEL, messages=[Message(role="system", content=system), Message(role="user", content=user)])


REGISTRY = CollectorRegistry()
METRICS = CloudMetrics(REGISTRY)


def pool_for(*urls: str, clock: Clock | None = None, **settings) -> CloudPool:
    settings.setdefault("poll_interval_s", 3600)  # tests drive polling with refresh()
    settings.setdefault("poll_timeout_s", 30.0)  # a busy machine is not a slow server: tests that want one say so
    options = {"clock": clock} if clock is not None else {}
    return CloudPool(CloudPoolSettings("cloud", MODEL, urls, **settings), metrics=METRICS, **options)


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_load_comes_from_metrics_and_feeds_least_load_selection() -> None:
    a, b = FakeVllm(running=6, waiting=2, kv=0.1), FakeVllm(running=1, kv=0.05)
    with aiohttp_server(a.app()) as sa, aiohttp_server(b.app()) as sb:
        async def scenario():
            pool = pool_for(sa.url, sb.url, strategy="least_load", slots=16)
            await pool.start()
            try:
                eps = {e.base_url: e for e in pool.endpoints()}
                first = pool.candidates(req(), None)[0].base_url
                return eps[sa.url], eps[sb.url], first, pool.snapshot(), isinstance(pool, Pool)
            finally:
                await pool.stop()

        ep_a, ep_b, first, snap, is_pool = asyncio.run(scenario())
    assert is_pool
    assert ep_a.reported_load == pytest.approx(8 / 16) and ep_b.reported_load == pytest.approx(1 / 16)
    assert ep_a.extra["running"] == 6 and ep_a.extra["waiting"] == 2 and ep_a.extra["kv_cache_usage"] == 0.1
    assert first == sb.url
    assert snap.routable == 2 and snap.waiting == 2 and snap.mean_load == pytest.approx((8 / 16 + 1 / 16) / 2)
    assert sample("tiergate_cloud_endpoint_healthy", tier="cloud", endpoint=ep_a.id) == 1
    assert sample("tiergate_cloud_endpoint_requests_waiting", tier="cloud", endpoint=ep_a.id) == 2


def test_kv_cache_pressure_counts_as_load() -> None:
    fake = FakeVllm(running=1, kv=0.9)
    with aiohttp_server(fake.app()) as s:
        async def scenario():
            pool = pool_for(s.url, slots=256)
            await pool.start()
            await pool.stop()
            return pool.endpoints()[0].load()

        assert asyncio.run(scenario()) == pytest.approx(0.9)


@pytest.mark.parametrize(
    ("fake", "status_start", "kind"),
    [
        (FakeVllm(model="llama-8b"), "wrong model: serves ['llama-8b'], tier 'cloud' expects 'tiergate-cloud'", "wrong_model"),
        (FakeVllm(health_status=503), "/health answered HTTP 503", "http_status"),
        (FakeVllm(delay_s=3.0), "no answer within 0.3s", "timeout"),
    ],
)
def test_bad_endpoints_are_unhealthy_with_a_clear_log_line(fake: FakeVllm, status_start: str, kind: str) -> None:
    good = FakeVllm()
    with aiohttp_server(good.app()) as sg, aiohttp_server(fake.app()) as sb:
        async def scenario():
            pool = pool_for(sg.url, sb.url, poll_timeout_s=0.3)
            with capture_logs() as logs:
                await pool.start()
            try:
                bad = next(e for e in pool.endpoints() if e.base_url == sb.url)
                return bad, [e.base_url for e in pool.candidates(req(), None)], logs, pool.healthy()
            finally:
                await pool.stop()

        bad, candidates, logs, healthy = asyncio.run(scenario())
    assert bad.extra["status"].startswith(status_start)
    assert candidates == [sg.url] and healthy
    line = next(entry for entry in logs if entry["event"] == "cloud endpoint unhealthy")
    assert line["log_level"] == "warning" and line["endpoint"] == bad.id and line["reason"].startswith(status_start)
    assert sample("tiergate_cloud_poll_failures_total", tier="cloud", endpoint=bad.id, kind=kind) >= 1


def test_non_vllm_services_are_recognised() -> None:
    async def ok(_r):
        return web.Response(text="ok")

    async def other_metrics(_r):
        return web.Response(text="# TYPE up gauge\nup 1\n")

    async def html(_r):
        return web.Response(text="<html>not metrics{{{</html>")

    plain = web.Application()
    plain.router.add_get("/health", ok)
    plain.router.add_get("/metrics", other_metrics)
    nginx = web.Application()
    nginx.router.add_get("/health", ok)
    nginx.router.add_get("/metrics", html)
    with aiohttp_server(plain) as s1, aiohttp_server(nginx) as s2:
        async def scenario():
            pool = pool_for(s1.url, s2.url, f"http://127.0.0.1:{free_port()}")
            await pool.start()
            await pool.stop()
            return [e.extra["status"] for e in pool.endpoints()], pool.healthy()

        statuses, healthy = asyncio.run(scenario())
    assert not healthy
    assert statuses[0] == "not a vLLM server: /metrics has no vllm:num_requests_running"
    assert statuses[1].startswith("not a vLLM server")
    assert statuses[2].startswith("unreachable: ClientConnectorError")


def test_endpoint_recovers_and_model_is_rechecked_after_an_outage() -> None:
    fake = FakeVllm()
    with aiohttp_server(fake.app()) as s:
        async def scenario():
            pool = pool_for(s.url)
            await pool.start()
            try:
                states = [pool.healthy()]
                fake.health_status = 500
                await pool.refresh()
                states.append(pool.healthy())
                fake.health_status, fake.model = 200, "swapped-model"  # came back serving something else
                await pool.refresh()
                states.append(pool.healthy())
                fake.model = MODEL
                await pool.refresh()
                states.append(pool.healthy())
                return states
            finally:
                await pool.stop()

        assert asyncio.run(scenario()) == [True, False, False, True]


def test_a_busy_server_must_be_slow_several_polls_in_a_row_to_drop_out() -> None:
    fake = FakeVllm()
    with aiohttp_server(fake.app()) as s:
        async def scenario():
            pool = pool_for(s.url, poll_timeout_s=0.3, slow_polls_unhealthy=3)
            await pool.start()
            try:
                fake.delay_s = 1.0
                states = []
                for _ in range(3):
                    await pool.refresh()
                    states.append(pool.healthy())
                status = pool.endpoints()[0].extra["status"]
                fake.delay_s = 0.0
                await pool.refresh()
                states.append(pool.healthy())
                return states, status
            finally:
                await pool.stop()

        states, status = asyncio.run(scenario())
    assert states == [True, True, False, True]
    assert status == "no answer within 0.3s in 3 polls (slow or hung)"


def test_breaker_opens_after_failures_then_a_single_probe_closes_it() -> None:
    a, b = FakeVllm(), FakeVllm()
    clock = Clock()
    with aiohttp_server(a.app()) as sa, aiohttp_server(b.app()) as sb:
        async def scenario():
            pool = pool_for(sa.url, sb.url, breaker_threshold=2, breaker_open_s=30, clock=clock)
            await pool.start()
            try:
                ep_a = next(e for e in pool.endpoints() if e.base_url == sa.url)
                pool.report(ep_a, False)
                still_in = ep_a in pool.candidates(req(), None)
                with capture_logs() as logs:
                    pool.report(ep_a, False)
                excluded = [pool.candidates(req(user=str(i)), None) for i in range(5)]
                clock.t += 30
                probe = pool.candidates(req(), None)
                during_probe = pool.candidates(req(), None)
                pool.report(ep_a, True)
                closed = pool.candidates(req(), None)
                return ep_a, still_in, logs, excluded, probe, during_probe, closed
            finally:
                await pool.stop()

        ep_a, still_in, logs, excluded, probe, during_probe, closed = asyncio.run(scenario())
    assert still_in
    assert any(e["event"] == "cloud endpoint circuit open" and e["consecutive_failures"] == 2 for e in logs)
    assert all(ep_a not in order and len(order) == 1 for order in excluded)
    assert probe[0] is ep_a, "the half-open trial goes first"
    assert ep_a not in during_probe
    assert ep_a in closed and ep_a.extra["breaker"] == "closed"
    assert sample("tiergate_cloud_breaker_opened_total", tier="cloud", endpoint=ep_a.id) >= 1
    assert sample("tiergate_cloud_selections_total", tier="cloud", strategy="prefix", reason="probe") >= 1


def test_dns_discovery_adds_and_drops_servers_and_survives_resolver_failure() -> None:
    fake = FakeVllm()
    with aiohttp_server(fake.app()) as s:
        answers: list[list[str] | Exception] = [["127.0.0.1", "127.0.0.2"], OSError("SERVFAIL"), ["127.0.0.1"]]

        async def resolver(host: str, port: int) -> list[str]:
            assert (host, port) == ("vllm.tiergate.svc.cluster.local", s.port)
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

        async def scenario():
            settings = CloudPoolSettings("cloud-dns", MODEL, ("http://10.9.9.9:8000",),
                                         dns="vllm.tiergate.svc.cluster.local", port=s.port, poll_interval_s=3600,
                                         poll_timeout_s=0.5)
            pool = CloudPool(settings, resolver=resolver)
            await pool.start()
            try:
                first = sorted(e.id for e in pool.endpoints())
                routable_first = [e.id for e in pool.candidates(req(), None)]
                with capture_logs() as logs:
                    await pool.refresh()  # resolver fails: keep what we know
                kept = sorted(e.id for e in pool.endpoints())
                await pool.refresh()
                last = sorted(e.id for e in pool.endpoints())
                return first, routable_first, logs, kept, last
            finally:
                await pool.stop()

        first, routable_first, logs, kept, last = asyncio.run(scenario())
    local, other = f"127.0.0.1:{s.port}", f"127.0.0.2:{s.port}"
    assert first == sorted(["10.9.9.9:8000", local, other])
    assert routable_first == [local]  # the static 10.9.9.9 and 127.0.0.2 answer nothing
    assert any(e["event"] == "cloud dns resolution failed; keeping known endpoints" for e in logs)
    assert kept == first
    assert last == sorted(["10.9.9.9:8000", local]), "the static endpoint stays; the vanished pod goes"
    assert sample("tiergate_cloud_endpoint_healthy", tier="cloud-dns", endpoint=other) is None


def test_spec_decode_and_prefix_cache_rates_over_the_window() -> None:
    fake = FakeVllm()
    clock = Clock()
    with aiohttp_server(fake.app()) as s:
        async def scenario():
            pool = pool_for(s.url, clock=clock)
            await pool.start()
            try:
                fake.counters.update(prefix_cache_queries=1000, prefix_cache_hits=600, generation_tokens=500,
                                     spec_decode_num_drafts=100, spec_decode_num_draft_tokens=300,
                                     spec_decode_num_accepted_tokens=150)
                clock.t += 10
                await pool.refresh()
                return pool.endpoints()[0], pool.snapshot()
            finally:
                await pool.stop()

        ep, snap = asyncio.run(scenario())
    assert ep.extra["spec_acceptance_rate"] == pytest.approx(0.5)
    assert ep.extra["spec_mean_accepted_length"] == pytest.approx(2.5)
    assert ep.extra["prefix_cache_hit_rate"] == pytest.approx(0.6)
    assert snap.spec_acceptance_rate == pytest.approx(0.5)
    assert sample("tiergate_cloud_spec_decode_acceptance_rate", tier="cloud", endpoint=ep.id) == pytest.approx(0.5)


def test_a_pool_needs_endpoints_or_a_dns_name() -> None:
    with pytest.raises(ValueError, match="static endpoints, a DNS name, or both"):
        CloudPoolSettings("cloud", MODEL, ())


def test_a_server_serving_less_context_than_the_tier_promises_is_warned_about() -> None:
    small, big = FakeVllm(max_model_len=2048), FakeVllm(max_model_len=8192)
    with aiohttp_server(small.app()) as ss, aiohttp_server(big.app()) as sb:
        async def scenario():
            pool = pool_for(ss.url, sb.url, max_context=4096)
            with capture_logs() as logs:
                await pool.start()
                await pool.refresh()  # the context is read with the model check, and warned about once
                await pool.stop()
            return {e.base_url: e for e in pool.endpoints()}, logs

        eps, logs = asyncio.run(scenario())
    assert eps[ss.url].extra["ctx"] == 2048 and eps[sb.url].extra["ctx"] == 8192
    warned = [e for e in logs if e["event"] == "tier_context_larger_than_server"]
    assert [(e["endpoint"], e["server_context"], e["max_context"]) for e in warned] == [(eps[ss.url].id, 2048, 4096)]


def test_the_prefix_memory_follows_each_servers_cache_size_and_restarts() -> None:
    """Sized from vllm:cache_config_info (blocks x block size); a server whose counters went back restarted,
    so what it held is forgotten; one that does not report its size gets nothing remembered."""
    sized = FakeVllm(cache_info='engine="0",block_size="32",num_gpu_blocks="100"')
    unsized = FakeVllm()
    sized.counters["prefix_cache_queries"] = 500
    with aiohttp_server(sized.app()) as sa, aiohttp_server(unsized.app()) as sb:
        async def scenario() -> tuple[list[str], int, float | None, list[str]]:
            pool = pool_for(sa.url, sb.url)
            await pool.start()
            try:
                eps = {e.base_url: e for e in pool.endpoints()}
                for i in range(6):  # six prefixes of ~200 tokens each, on whichever server they rank first
                    system = f"tenant {i} " * 100
                    pool.candidates(req(system=system), None)
                held = [e.base_url for i in range(6) for e in pool.selector.memory.holders(
                    affinity_key(req(system=f"tenant {i} " * 100), 256), list(eps.values()))]
                await pool.refresh()
                keys = sample("tiergate_cloud_prefix_memory_keys", tier="cloud", endpoint=eps[sa.url].id)
                tokens = pool.selector.memory.size(eps[sa.url].id)[1]
                sized.counters["prefix_cache_queries"] = 0  # restarted
                await pool.refresh()
                after = [e.base_url for i in range(6) for e in pool.selector.memory.holders(
                    affinity_key(req(system=f"tenant {i} " * 100), 256), list(eps.values()))]
                return held, tokens, keys, after
            finally:
                await pool.stop()

        held, tokens, keys, after = asyncio.run(scenario())
    assert held and set(held) == {sa.url}  # never the server of unknown size
    assert 0 < tokens <= 3200 and keys == len(held)
    assert after == []
