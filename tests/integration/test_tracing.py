"""One request's trace across tiers: a real `tiergate serve` and a real `edge-node serve`, each exporting its
spans to a file (TIERGATE_TRACES_FILE), the client's W3C `traceparent` continued by both.

The gateway's root span is the child of the client's span; auth, classify, policy, cache, dispatch (with one
`upstream` span per attempt) and relay are its children; the edge node's root span is the child of the gateway's
`upstream` span (the traceparent it sent), with queue wait, prefill and decode below it. The gateway's log lines
of the request carry the trace id. docs/operations.md shows this trace.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import write_policy
from tests.support.instant_upstream import make_app
from tests.support.servers import aiohttp_server, free_port
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


def _spans(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def render(spans: list[dict]) -> str:
    """The trace as an indented tree: service, span, duration, attributes."""
    by_parent: dict[str | None, list[dict]] = {}
    ids = {s["span_id"] for s in spans}
    for s in spans:
        by_parent.setdefault(s["parent_id"] if s["parent_id"] in ids else None, []).append(s)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for s in sorted(by_parent.get(parent, []), key=lambda s: s["start_ns"]):
            ms = (s["end_ns"] - s["start_ns"]) / 1e6
            attrs = " ".join(f"{k.removeprefix('tiergate.')}={v}" for k, v in sorted(s["attributes"].items()))
            lines.append(f"{'  ' * depth}{s['service']:<18} {s['name']:<26} {ms:8.2f} ms  {attrs}".rstrip())
            walk(s["span_id"], depth + 1)

    walk(None, 0)
    return "\n".join(lines)


def test_one_request_is_one_trace_through_the_gateway_and_the_edge_node(tmp_path: Path, edge_model,
                                                                          edge_node_factory):
    gw_spans, edge_spans = tmp_path / "gateway-spans.jsonl", tmp_path / "edge-spans.jsonl"
    with aiohttp_server(make_app(4, "ok", model="cloud-model")) as cloud:
        pol = write_policy(tmp_path / "policy.yaml", [], [cloud.url], cache=True)
        port = free_port()
        env = os.environ | {"TIERGATE_POLICY": str(pol), "TIERGATE_PORT": str(port), "TIERGATE_API_KEYS": "tk-12345=t",
                            "TIERGATE_TRACES_FILE": str(gw_spans), "TIERGATE_LOG_FORMAT": "json",
                            "TIERGATE_DRAIN_DELAY_S": "0"}
        log = (tmp_path / "gw.log").open("wb")
        gw = subprocess.Popen([sys.executable, "-m", "tiergate.gateway.cli", "serve"], env=env, stdout=log,
                              stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: _ok(base + "/healthz"), timeout_s=60, what="gateway up")
            node = edge_node_factory("--parallel", "2", "--ctx", "1024", "--gateway", base, "--model-name", "edge-a",
                                     env={"TIERGATE_TRACES_FILE": str(edge_spans)})
            wait_until(lambda: _ok(base + "/readyz"), timeout_s=60, what="edge node registered")
            r = httpx.post(base + "/v1/chat/completions", timeout=60, headers={
                "Authorization": "Bearer tk-12345", "traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"},
                json={"model": "auto", "stream": True, "max_tokens": 8, "temperature": 0,
                      "messages": [{"role": "user", "content": "Trace me through the tiers"}]})
            assert r.status_code == 200 and r.headers["x-tiergate-tier"] == "edge", r.text[:300]
            assert r.text.rstrip().endswith("data: [DONE]")
            wait_until(lambda: any(s["name"] == "decode" for s in _spans(edge_spans)), timeout_s=30,
                       what="the edge node's spans")
            wait_until(lambda: any(s["name"] == "relay" for s in _spans(gw_spans)), timeout_s=30,
                       what="the gateway's spans")
        finally:
            gw.send_signal(signal.SIGTERM)
            gw.wait(30)
            node_log = node.log() if "node" in locals() else ""
    spans = [s for s in _spans(gw_spans) + _spans(edge_spans) if s["trace_id"] == TRACE_ID]
    print("\n" + render(spans))
    (tmp_path / "trace.txt").write_text(render(spans) + "\n")

    gateway = {s["name"]: s for s in spans if s["service"] == "tiergate-gateway"}
    edge = {s["name"]: s for s in spans if s["service"] == "tiergate-edge-node"}
    root = gateway["POST /v1/chat/completions"]
    assert root["parent_id"] == CLIENT_SPAN and root["kind"] == "SERVER"  # the client's trace, continued
    for name in ("auth", "classify", "policy", "cache", "dispatch", "relay"):
        assert gateway[name]["parent_id"] == root["span_id"], name
    attempt = gateway["upstream"]
    assert attempt["parent_id"] == gateway["dispatch"]["span_id"] and attempt["attributes"]["tiergate.tier"] == "edge"
    assert gateway["policy"]["attributes"]["tiergate.rule"] == "default"
    edge_root = edge["POST /v1/chat/completions"]
    assert edge_root["parent_id"] == attempt["span_id"]  # the traceparent the gateway sent
    for name in ("queue wait", "prefill", "decode"):
        assert edge[name]["parent_id"] == edge_root["span_id"], name
    assert edge["queue wait"]["end_ns"] <= edge["prefill"]["start_ns"] + 1_000  # one after the other
    assert edge["prefill"]["end_ns"] <= edge["decode"]["start_ns"] + 1_000
    assert edge["decode"]["attributes"]["tiergate.completion_tokens"] == 8
    # The request's log lines carry the trace id, on both servers.
    gw_lines = [json.loads(line) for line in (tmp_path / "gw.log").read_text().splitlines() if line.startswith("{")]
    assert any(e.get("trace_id") == TRACE_ID and e.get("event") == "request" for e in gw_lines), gw_lines[-5:]
    assert any(json.loads(line).get("trace_id") == TRACE_ID for line in node_log.splitlines() if line.startswith("{"))


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
