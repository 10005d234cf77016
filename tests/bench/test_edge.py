"""bench/edge's client and report: tokens from usage (or max_tokens on a finished-by-length stream without usage),
TTFT to the first content, and a docs section built from the result file alone. No timing thresholds."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from bench.edge.__main__ import summarise
from bench.edge.client import Req, body, run_round
from bench.edge.render import goals, render
from bench.edge.servers import MODELS, make_servers


def _sse(with_usage: bool):
    async def chat(request: Request) -> StreamingResponse:
        payload = await request.json()
        n = payload["max_tokens"]

        async def events():
            yield 'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n'
            for i in range(n // 2):  # two tokens per chunk: chunks are not tokens
                yield "data: " + json.dumps({"choices": [{"delta": {"content": f"t{i} "}}]}) + "\n\n"
            yield 'data: {"choices":[{"delta":{},"finish_reason":"length"}]}\n\n'
            if with_usage:
                yield f'data: {{"choices":[],"usage":{{"prompt_tokens":5,"completion_tokens":{n}}}}}\n\n'
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.fixture(params=[True, False], ids=["usage", "no-usage"])
def server(request):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(_sse(request.param), port=port, log_level="error"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    while not srv.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}", request.param
    srv.should_exit = True
    t.join(5)


def test_round_counts_tokens_not_chunks(server) -> None:
    url, usage = server
    reqs, wall = run_round(url, streams=3, per_stream=2, max_tokens=8, banned=[2], offset=0)
    assert len(reqs) == 6 and wall > 0
    for r in reqs:
        assert r.error is None and r.finish == "length"
        assert r.tokens == 8 and r.chunks == 4 and r.usage is usage
        assert r.ttft is not None and r.tpot is not None


def test_every_server_gets_the_same_body() -> None:
    b = body(3, 64, [0, 2])
    assert b["logit_bias"] == {"0": -100, "2": -100}
    assert b["stream_options"] == {"include_usage": True}
    assert body(3, 64, [0, 2]) == b and body(4, 64, [0, 2])["messages"] != b["messages"]


def _round(tokens: int, wall: float, ttfts: list[float]) -> dict:
    return {"wall_s": wall, "tokens": tokens, "cpu_s": wall / 2, "cpu_pressure_avg10": 5.0,
            "requests": [{"sent": 0.0, "first": t, "last": t + 1.0, "tokens": tokens // len(ttfts), "usage": True,
                          "chunks": 3, "finish": "length"} for t in ttfts]}


def test_report_is_built_from_the_result_file(tmp_path: Path) -> None:
    cells = {name: {c: summarise([_round(100 * c * k, 1.0, [0.1 * k] * c)]) for c in (1, 4)}
             for name, k in (("edge-node", 1), ("llama-server", 1), ("llama_cpp.server", 3))}
    model = {"model": "demo", "title": "a model", "file": "m.gguf", "size_mib": 1, "banned_tokens": [2],
             "kernel_cpu_ms_per_token": {1: 1.0, 4: 0.5}, "cells": cells,
             "peak_rss_mib": {"edge-node": {"python[1]": 100.0}, "llama-server": {"llama-server[2]": 50.0},
                              "llama_cpp.server": {"python[3]": 80.0}},
             "rounds": {"edge-node": {1: [_round(100, 1.0, [0.1])]}}}
    facts = {"cpu_model": "CPU", "cpu_flags": ["avx2"], "cpus": 2, "mem_total_gib": 24.0, "load_average": [1, 1, 1],
             "cpuidle_governor": "menu", "guest_halt_poll_ns": None, "kernel": "6", "python": "3.11"}
    report = {"command": "python -m bench.edge --models demo", "args": {"streams": [1, 4], "ctx": 512, "requests": 2,
              "tokens": 8, "repeats": 1}, "machine_before": facts, "machine_after": facts, "wall_s": 60,
              "versions": {"llama_cpp_python": "0.3.36", "llama_server_build": {"cmake_args": ["-DX=1"],
                                                                                  "compiler": "c++"}},
              "models": [model]}
    text = render(report, tmp_path / "bench" / "results" / "edge.json")
    assert "bench/results/edge.json" in text and "### a model" in text and "| 4 | edge-node |" in text
    assert "goal (>= 0.9x, <= 1.2x) **met**" in text
    assert [g["met"] for g in goals(model)] == [True, True]
    assert cells["edge-node"][4]["tokens"] == 400 and cells["edge-node"][4]["failed"] == 0
    assert Req(sent=0.0, first=1.0, last=3.0, tokens=5).tpot == 0.5


def test_llama_server_reads_a_named_template_as_a_built_in_one(tmp_path: Path) -> None:
    """With Jinja on (its default) llama-server takes `--chat-template gemma` as the template text itself, and every
    prompt becomes the word "gemma": the name must come after --no-jinja."""
    servers = make_servers(tmp_path / "m.gguf", MODELS["gemma"], tmp_path / "llama-server", tmp_path, 4, 512, tmp_path)
    args = next(s for s in servers if s.name == "llama-server").args
    i = args.index("--chat-template")
    assert args[i + 1] == "gemma" and "--no-jinja" in args[:i]
    smol = make_servers(tmp_path / "m.gguf", MODELS["smollm2"], tmp_path / "llama-server", tmp_path, 4, 512, tmp_path)
    assert "--chat-template" not in next(s for s in smol if s.name == "llama-server").args  # the GGUF's own template


def test_report_shows_the_prompt_tokens_each_server_made(tmp_path: Path) -> None:
    cells = {name: {1: summarise([_round(100, 1.0, [0.1])])} for name in ("edge-node", "llama-server",
                                                                         "llama_cpp.server")}
    model = {"model": "demo", "title": "a model", "file": "m.gguf", "size_mib": 1, "banned_tokens": [2],
             "kernel_cpu_ms_per_token": {1: 1.0}, "cells": cells, "peak_rss_mib": {},
             "rounds": {}, "prompt_tokens_seen": {"edge-node": 30, "llama-server": 30, "llama_cpp.server": None}}
    facts = {"cpu_model": "CPU", "cpu_flags": ["avx2"], "cpus": 2, "mem_total_gib": 24.0, "load_average": [1, 1, 1],
             "cpuidle_governor": "menu", "guest_halt_poll_ns": None, "kernel": "6", "python": "3.11"}
    report = {"command": "python -m bench.edge", "args": {"streams": [1], "ctx": 512, "requests": 2, "tokens": 8,
              "repeats": 1}, "machine_before": facts, "machine_after": facts, "wall_s": 60,
              "versions": {"llama_cpp_python": "0.3.36", "llama_server_build": {"cmake_args": [], "compiler": "c++"}},
              "models": [model]}
    text = render(report, tmp_path / "bench" / "results" / "edge.json")
    assert "same chat message (checked equal before measuring): edge-node 30, llama-server 30, llama_cpp.server -." \
        in text
