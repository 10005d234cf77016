"""Chaos: Redis (cache entries, rate-limit counters, the edge-node registry) is killed and restarted under traffic.

A real gateway configured with `redis_url` in front of instant backends; the edge "node" registers itself with
heartbeats every 2 s like `edge-node serve` does. Redis is SIGKILLed mid-traffic and started again (empty, as
after a crash without persistence). No request may fail or hang: the cache is bypassed and limits fail open
while Redis is away, and once it is back the cache serves hits again and the registry repopulates — all
without restarting the gateway.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Self

import httpx
import pytest

from tests.chaos.record import record
from tests.chaos.traffic import Traffic, summarize
from tests.gateway.conftest import write_policy
from tests.support.instant_upstream import make_app
from tests.support.registration import CLAIM
from tests.support.servers import aiohttp_server, gateway_server
from tests.support.waiting import wait_until
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PROMPTS = [f"What is tier {i}?" for i in range(4)]


def keyring(tmp_path: Path) -> KeyRing:
    """A tenant with limits, so that every request also counts in Redis (and must fail open without it)."""
    keys = tmp_path / "keys.yaml"
    keys.write_text("tenants:\n  chaos: {requests_per_minute: 1000000, tokens_per_minute: 100000000}\n"
                    "keys:\n  - {tenant: chaos, key: chaos-key-123}\n")
    return KeyRing.from_file(keys)


class Heartbeats:
    """An edge node's registration loop (what edge_node.server.registration does), against an instant backend."""

    def __init__(self, gateway_url: str, node_url: str, interval_s: float = 2.0) -> None:
        self.gateway_url, self.node_url, self.interval_s = gateway_url, node_url, interval_s
        self.sent = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=2) as c:
            while not self._stop.is_set():
                try:
                    r = c.post(self.gateway_url + "/edge/v1/heartbeat", headers=CLAIM,
                               json={"node_id": "node-a", "url": self.node_url, "model": "edge-model", "slots": 16,
                                     "busy": 0, "queued": 0, "ctx": 2048})
                    self.sent[r.status_code] += 1
                except httpx.HTTPError as exc:
                    self.sent[type(exc).__name__] += 1
                self._stop.wait(self.interval_s)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def body(worker: int, seq: int) -> tuple[dict, str]:
    if seq % 2 == 0:  # the same few greedy questions again and again: cache hits once stored
        text = PROMPTS[(worker + seq) % len(PROMPTS)]
        return {"model": "auto", "messages": [{"role": "user", "content": text}], "max_tokens": 5, "temperature": 0,
                "stream": seq % 4 == 0}, "cacheable"
    return {"model": "auto", "messages": [{"role": "user", "content": f"unique {worker}-{seq}"}], "max_tokens": 5,
            "temperature": 1, "stream": seq % 3 == 0}, "unique"


def window(outcomes, lo: float, hi: float) -> dict:
    inside = [o for o in outcomes if lo <= o.started < hi]
    return {"requests": len(inside), "cache": dict(Counter(o.cache for o in inside)),
            "tier": dict(Counter(o.tier for o in inside)),
            "fallback_from_edge": sum(o.fallback_from == "edge" for o in inside)}


def test_redis_restart_during_traffic(tmp_path: Path, redis_server, redis_url):
    with aiohttp_server(make_app(5, "ok", model="edge-model")) as edge, \
            aiohttp_server(make_app(5, "ok", model="cloud-model")) as cloud:
        pol = write_policy(tmp_path / "policy.yaml", [], [cloud.url], cache=True)
        settings = Settings(policy=pol, embedder=None, redis_url=redis_url)
        with gateway_server(settings, keyring=keyring(tmp_path), ready=False) as gw, \
                Heartbeats(gw.url, edge.url) as beats:
            pool = gw.gateway.tiers["edge"].pool
            wait_until(lambda: any(e.id == "node-a" for e in pool.endpoints()), what="edge registration")
            with Traffic(gw.url, "chaos-key-123", body, workers=4, timeout_s=30, pause_s=0.01) as traffic:
                traffic.wait_for(lambda o: o.cache == "hit-exact", 8, what="cache hits before the fault")
                down_at = time.monotonic()
                redis_server.stop()
                traffic.wait_for(lambda o: o.started > down_at + 0.5, 40, what="requests while Redis is down")
                time.sleep(max(0.0, down_at + 3.0 - time.monotonic()))
                up_at = time.monotonic()
                redis_server.start()
                traffic.wait_for(lambda o: o.started > up_at and o.cache == "hit-exact", 8, timeout_s=60,
                                 what="cache hits after Redis is back")
                traffic.wait_for(lambda o: o.started > up_at + 3 and o.tier == "edge", 10, timeout_s=30,
                                 what="edge answers after Redis is back")
            outcomes = traffic.outcomes
            registered_again = any(e.id == "node-a" for e in pool.endpoints())
            ready = httpx.get(gw.url + "/readyz", timeout=5).status_code
        figures = summarize(outcomes, up_at, lambda o: o.cache == "hit-exact")
        figures.update(
            outage_s=round(up_at - down_at, 3), before=window(outcomes, 0, down_at),
            during=window(outcomes, down_at, up_at), after=window(outcomes, up_at, float("inf")),
            first_edge_answer_after_restart_s=_first(outcomes, up_at, lambda o: o.tier == "edge"),
            heartbeats=dict(beats.sent))
        figures["recovery_s"] = figures.pop("recovery_s")  # fault = Redis back; path = a cache hit again
        record("redis_restart", figures)

    assert figures["lost"] == 0, [o for o in outcomes if o.kind == "lost"][:5]
    assert figures["errors"] == 0, figures["errors_by_kind"]
    assert figures["during"]["requests"] > 0
    assert figures["during"]["cache"].get("hit-exact", 0) == 0  # nothing is served from a Redis that is down
    assert figures["recovery_s"] is not None  # hits again, without a gateway restart
    assert registered_again and ready == 200


def _first(outcomes, after: float, pred) -> float | None:
    t = [o.ended for o in outcomes if o.started >= after and o.kind == "complete" and pred(o)]
    return round(min(t) - after, 3) if t else None


# ---- found by this chaos test, now fixed (docs/reliability.md, closed bug 6) -------------------------------------

def test_cache_header_says_bypass_while_redis_is_down(tmp_path: Path, redis_server, redis_url):
    with aiohttp_server(make_app(3, "ok", model="edge-model")) as edge, \
            aiohttp_server(make_app(3, "ok", model="cloud-model")) as cloud:
        pol = write_policy(tmp_path / "policy.yaml", [edge.url], [cloud.url], cache=True)
        with gateway_server(Settings(policy=pol, embedder=None, redis_url=redis_url), keyring=keyring(tmp_path)) as gw:
            redis_server.stop()
            try:
                req = {"model": "auto", "messages": [{"role": "user", "content": "cacheable"}], "max_tokens": 3,
                       "temperature": 0}
                auth = {"Authorization": "Bearer chaos-key-123"}
                for _ in range(2):  # the first one notices that Redis is gone
                    r = httpx.post(gw.url + "/v1/chat/completions", json=req, headers=auth, timeout=10)
                    assert r.status_code == 200
                assert r.headers["x-tiergate-cache"] == "bypass"
            finally:
                redis_server.start()


def test_redis_restart_does_not_unregister_live_edge_nodes(tmp_path: Path, redis_server, redis_url):
    with aiohttp_server(make_app(3, "ok", model="edge-model")) as edge, \
            aiohttp_server(make_app(3, "ok", model="cloud-model")) as cloud:
        pol = write_policy(tmp_path / "policy.yaml", [], [cloud.url], fallback=False, cache=False)
        with gateway_server(Settings(policy=pol, embedder=None, redis_url=redis_url), keyring=keyring(tmp_path),
                            ready=False) as gw:
            r = httpx.post(gw.url + "/edge/v1/heartbeat", timeout=5, headers=CLAIM, json={
                "node_id": "node-a", "url": edge.url, "model": "edge-model", "slots": 4})
            assert r.status_code == 200
            pool = gw.gateway.tiers["edge"].pool
            redis_server.stop()
            redis_server.start()  # empty: no persistence, like a crash
            # Two refreshes from the empty Redis (the first may have begun before the restart), while the node's
            # last heartbeat is still well within the TTL (10 s): it must still be registered.
            after = pool.refreshes
            wait_until(lambda: pool.refreshes >= after + 2, timeout_s=8, what="the registry refreshed from empty Redis")
            r = httpx.post(gw.url + "/v1/chat/completions", headers={"Authorization": "Bearer chaos-key-123"},
                           json={"model": "auto", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
                           timeout=10)
            assert r.status_code == 200, r.text
