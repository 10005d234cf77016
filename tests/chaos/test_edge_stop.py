"""Chaos: an edge node (real llama.cpp, `edge-node serve`) is SIGSTOPped under traffic, then SIGCONTed.

A stopped process accepts connections (the kernel does) and answers nothing, not even `/health`: the hung backend
of docs/reliability.md, bug 15. Two nodes register with a real gateway; the cloud tier (an instant backend) is
the fallback. The policy gives a request 300 s to its first token and 600 s in all, far beyond the clients'
90 s: only the failover can answer a request stuck on the stopped node in time. The gateway's health checks find
the node hung (2 failed polls), and every request waiting on it for its answer to begin, JSON or stream, is
retried on the other node or the cloud. Streams that had begun on it end with an SSE error once the between-chunks
time passes. After SIGCONT the node answers its health checks again and takes traffic; no restart anywhere.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.chaos.policies import edge_then_cloud
from tests.chaos.record import record
from tests.chaos.traffic import Traffic, summarize
from tests.support.edge import parse_metrics, registered_node
from tests.support.instant_upstream import make_app
from tests.support.servers import aiohttp_server, gateway_server
from tests.support.waiting import wait_until
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
KEYS = KeyRing.from_inline("chaos-key-1=chaos:normal")


def body(worker: int, seq: int) -> tuple[dict, str]:
    stream = seq % 2 == 0  # half JSON: the requests a hung backend used to hold for `total_s`
    return ({"model": "auto", "messages": [{"role": "user", "content": f"Tell me a story, {worker} {seq}"}],
             "max_tokens": 32, "temperature": 1, "stream": stream}, "stream" if stream else "json")


def _lost(gw) -> float:
    metrics = parse_metrics(httpx.get(gw.url + "/metrics", timeout=10).text)
    return metrics.get(("tiergate_upstream_errors_total", (("kind", "lost"), ("tier", "edge"))), 0.0)


def test_edge_node_stopped_and_resumed_under_traffic(tmp_path: Path, edge_model, edge_node_factory):
    with aiohttp_server(make_app(8, "ok", model="cloud-model")) as cloud:
        pol = edge_then_cloud(tmp_path / "policy.yaml", cloud.url, edge_model.tokenizer_json, first_byte_s=300, total_s=600)
        with gateway_server(Settings(policy=pol, embedder=None), keyring=KEYS, ready=False) as gw:
            pool = gw.gateway.tiers["edge"].pool


            a = registered_node(edge_node_factory, gw, "--model-name", "edge-a")
            registered_node(edge_node_factory, gw, "--model-name", "edge-b")
            ep_a = next(e for e in pool.endpoints() if e.base_url == a.url)
            with Traffic(gw.url, "chaos-key-1", body, workers=6, timeout_s=90) as traffic:
                for name in ("edge-a", "edge-b"):
                    traffic.wait_for(lambda o, n=name: o.kind == "complete" and o.model == n, 3, timeout_s=120,
                                     what=f"warm-up answers from {name}")
                stopped_at = time.monotonic()
                a.proc.send_signal(signal.SIGSTOP)
                try:
                    # Requests pile up on the stopped node until its health checks fail...
                    wait_until(lambda: ep_a.inflight >= 2, timeout_s=60, interval_s=0.01,
                               what="requests stuck on the stopped node")
                    stuck = ep_a.inflight
                    # ... then the gateway declares it lost and they go elsewhere.
                    wait_until(lambda: _lost(gw) >= 1, timeout_s=60, interval_s=0.05, what="the node declared lost")
                    lost_at = time.monotonic()
                    wait_until(lambda: ep_a.inflight == 0, timeout_s=60, interval_s=0.05,
                               what="nothing left waiting on the stopped node")
                    traffic.wait_for(lambda o: o.started > stopped_at and o.kind == "complete" and not o.stream,
                                     10, timeout_s=120, what="JSON answers after the stop")
                finally:
                    resumed_at = time.monotonic()
                    a.proc.send_signal(signal.SIGCONT)
                traffic.wait_for(lambda o: o.started > resumed_at and o.kind == "complete" and o.model == "edge-a",
                                 3, timeout_s=120, what="answers from the resumed node")
            outcomes = traffic.outcomes
            retried = _lost(gw)
    before = [o for o in outcomes if o.started < stopped_at]
    after = [o for o in outcomes if o.started >= stopped_at]
    back = [o.ended for o in outcomes if o.started > resumed_at and o.model == "edge-a" and o.kind == "complete"]
    figures = summarize(outcomes, stopped_at, lambda o: o.model in ("edge-b", "cloud-model"))
    figures.update(
        stuck_on_stopped_node=stuck, retried_when_lost=int(retried),
        lost_detected_s=round(lost_at - stopped_at, 3), stopped_for_s=round(resumed_at - stopped_at, 3),
        json_after_stop=sum(not o.stream for o in after), json_after_stop_completed=sum(
            not o.stream and o.kind == "complete" for o in after),
        max_latency_after_stop_s=round(max(o.ended - o.started for o in after), 3),
        served_while_stopped_by=dict(Counter(o.model for o in after if o.kind == "complete" and o.ended < resumed_at)),
        resumed_node_first_answer_s=round(min(back) - resumed_at, 3) if back else None,
    )
    record("edge_node_stopped", figures)

    assert figures["lost"] == 0, [o for o in outcomes if o.kind == "lost"][:5]
    assert retried >= 1
    # Everything sent after the stop is answered: the stuck ones by the failover, within the clients' 90 s
    # (the policy alone would have held them 300 s for a stream's first token, 600 s for a JSON answer).
    assert all(o.kind == "complete" for o in after), Counter(o.error_kind for o in after if o.kind != "complete")
    # Only streams that had begun on the stopped node may fail, explicitly (an SSE error after the
    # between-chunks time); a JSON request in flight at the stop was retried.
    errors = [o for o in outcomes if o.kind != "complete"]
    assert all(o.started < stopped_at < o.ended and o.kind == "error_sse" and o.stream for o in errors), errors
    assert all(o.kind == "complete" for o in before if not o.stream)
    assert back, "the resumed node got no traffic"
