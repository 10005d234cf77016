"""Chaos: an edge node (real llama.cpp, `edge-node serve`) is SIGKILLed while traffic streams through it.

Two nodes register with a real gateway (heartbeats); the cloud tier (an instant backend) is the fallback.
Node A is killed while at least one stream on it is mid-way. Streams that had begun on A must end with an
SSE error event then `data: [DONE]`; every request that had not reached its first byte, and every request
sent after the kill, must be answered by node B or the cloud; nothing hangs. Then a replacement node
registers and takes traffic — the gateway is never restarted.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.chaos.policies import edge_then_cloud
from tests.chaos.record import record
from tests.chaos.traffic import Traffic, summarize
from tests.support.edge import registered_node
from tests.support.instant_upstream import make_app
from tests.support.servers import aiohttp_server, gateway_server
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
KEYS = KeyRing.from_inline("chaos-key-1=chaos:normal")


def body(worker: int, seq: int) -> tuple[dict, str]:
    stream = seq % 5 != 4  # mostly streams, some plain JSON answers
    return ({"model": "auto", "messages": [{"role": "user", "content": f"Tell me a story, {worker} {seq}"}],
             "max_tokens": 32, "temperature": 1, "stream": stream}, "stream" if stream else "json")


def test_edge_node_killed_mid_traffic(tmp_path: Path, edge_model, edge_node_factory):
    with aiohttp_server(make_app(8, "ok", model="cloud-model")) as cloud:
        pol = edge_then_cloud(tmp_path / "policy.yaml", cloud.url, edge_model.tokenizer_json, first_byte_s=30, total_s=60)
        with gateway_server(Settings(policy=pol, embedder=None), keyring=KEYS, ready=False) as gw:


            a = registered_node(edge_node_factory, gw, "--model-name", "edge-a")
            registered_node(edge_node_factory, gw, "--model-name", "edge-b")
            with Traffic(gw.url, "chaos-key-1", body, workers=6, timeout_s=60) as traffic:
                for name in ("edge-a", "edge-b"):
                    traffic.wait_for(lambda o, n=name: o.kind == "complete" and o.model == n, 3, timeout_s=120,
                                     what=f"warm-up answers from {name}")
                traffic.wait_streaming_on("edge-a")
                killed_at = time.monotonic()
                a.proc.send_signal(signal.SIGKILL)
                a.proc.wait(10)
                traffic.wait_for(lambda o: o.started > killed_at and o.kind == "complete", 20, timeout_s=120,
                                 what="answers after the kill")
                # Recovery without a restart: a replacement node registers and serves.
                replacement_started = time.monotonic()
                registered_node(edge_node_factory, gw, "--model-name", "edge-c")
                registered_at = time.monotonic()
                traffic.wait_for(lambda o: o.started > registered_at and o.model == "edge-c" and
                                 o.kind == "complete", 3, timeout_s=120, what="answers from the replacement")
            outcomes = traffic.outcomes
        figures = summarize(outcomes, killed_at, lambda o: o.model in ("edge-b", "cloud-model"))
        before = [o for o in outcomes if o.started < killed_at]
        after = [o for o in outcomes if o.started >= killed_at]
        in_flight_on_a = [o for o in before if o.ended > killed_at and o.model == "edge-a" and o.first_chunk_at
                          and o.first_chunk_at < killed_at]
        first_c = [o.ended for o in after if o.model == "edge-c" and o.kind == "complete"]
        figures.update(
            in_flight_at_kill=sum(o.ended > killed_at for o in before),
            streams_mid_way_on_killed_node=len(in_flight_on_a),
            served_after_kill_by=dict(Counter(o.model for o in after if o.kind == "complete")),
            # from launching the replacement process to its first complete answer (start-up included)
            replacement_first_answer_s=round(min(first_c) - replacement_started, 3) if first_c else None,
        )
        record("edge_node_killed", figures)

    assert figures["lost"] == 0, [o for o in outcomes if o.kind == "lost"][:5]
    assert in_flight_on_a, "the kill did not catch a stream mid-way"
    # Streams mid-way on the killed node: an explicit SSE error, then [DONE].
    # (A stream may also complete in the instant between reading the clock and the signal landing.)
    assert all(o.kind == "complete" or (o.kind == "error_sse" and o.code.startswith("upstream_"))
               for o in in_flight_on_a), in_flight_on_a
    # Only requests already running on the killed node may fail; everything sent after the kill is answered.
    assert all(o.kind == "complete" for o in after), Counter(o.error_kind for o in after if o.kind != "complete")
    errors = [o for o in outcomes if o.kind != "complete"]
    assert all(o.started < killed_at < o.ended for o in errors)
    assert all(o.kind == "error_sse" or o.code.startswith("upstream_") for o in errors)
    assert "edge-a" not in figures["served_after_kill_by"]
    assert figures["recovery_s"] is not None and figures["replacement_first_answer_s"] is not None
