"""bench/edge: edge-node against llama.cpp's own llama-server and llama-cpp-python's server, same GGUF files, one run.

    .venv/bin/python -m bench.edge [--models smollm2,gemma] [--tokens 128] [--requests 2] [--repeats 3]
                                   [--streams 1,4,8,16] [--no-docs]

For each model the three servers (bench/edge/servers.py) are up at once; at 1, 4, 8 and 16 concurrent streams
(each sending `--requests` streaming chat requests back to back, `--tokens` output tokens each, see
bench/edge/client.py) every server gets one round in turn, the order rotating, `--repeats` times, so the
machine's drift and other jobs' load hit all three alike. Reported per model, server and concurrency: aggregate
tokens/s (completion tokens from usage / the round's wall time; median over repeats, with min..max), time to the
first content token p50/p99 and time per output token p50/p99 (over every request of every repeat), server
CPU-seconds per token, failed requests, and each server's peak RSS. Also bare `llama_decode`'s CPU cost per token
(bench/edge/ceiling.py) and the machine as read at start and end. Writes bench/results/edge.json and the
"## Edge node (bench/edge)" section of docs/benchmarks.md (unless --no-docs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

from bench.anchors import ensure_llama_cpp_server, ensure_llama_server
from bench.edge.ceiling import kernel_ceiling
from bench.edge.client import Req, prompt, run_round
from bench.edge.render import render
from bench.edge.servers import MODELS, banned_tokens, base_url, make_servers, prompt_tokens, resolve_model
from bench.procs import tree_cpu_seconds, tree_peak_rss_mib
from bench.report import RESULTS, cpu_pressure, machine_facts, pct, publish
from bench.versions import LLAMA_CPP_PYTHON

SECTION = "## Edge node (bench/edge)"


def _compact(r: Req) -> dict:
    """A request for the result file: times rounded to 0.1 ms, empty fields left out (the file stays small)."""
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(r).items()
            if v is not None}


def summarise(rounds: list[dict]) -> dict:
    """One (model, server, streams) cell from its repeats."""
    reqs = [Req(**r) for rd in rounds for r in rd["requests"]]
    ok = [r for r in reqs if r.error is None]
    tok_s = [rd["tokens"] / rd["wall_s"] for rd in rounds]
    tokens = sum(rd["tokens"] for rd in rounds)
    ms = [t * 1e3 for t in (r.ttft for r in ok) if t is not None]
    tp = [t * 1e3 for t in (r.tpot for r in ok) if t is not None]
    return {"tok_s": statistics.median(tok_s), "tok_s_min": min(tok_s), "tok_s_max": max(tok_s),
            "ttft_p50_ms": pct(ms, 50), "ttft_p99_ms": pct(ms, 99), "tpot_p50_ms": pct(tp, 50),
            "tpot_p99_ms": pct(tp, 99), "cpu_ms_per_token": sum(rd["cpu_s"] for rd in rounds) / max(tokens, 1) * 1e3,
            "requests": len(reqs), "failed": len(reqs) - len(ok), "tokens": tokens,
            "tokens_from_usage": all(r.usage for r in ok), "not_length": sum(r.finish != "length" for r in ok)}


def bench_model(key: str, args, llama_server, lcp_bin, logs) -> dict:
    spec = MODELS[key]
    model = resolve_model(key)
    banned = banned_tokens(model)
    print(f"== {spec.title}: {model} ({model.stat().st_size / 2**20:.0f} MiB), banned EOG tokens {banned}",
          file=sys.stderr)
    ceiling = kernel_ceiling(model)
    servers = make_servers(model, spec, llama_server, lcp_bin, max(args.streams), args.ctx, logs)
    rounds: dict[str, dict[int, list[dict]]] = {s.name: {c: [] for c in args.streams} for s in servers}
    rss: dict[str, dict[str, float]] = {}
    try:
        for s in servers:
            s.start(timeout_s=300)
            run_round(base_url(s), 1, 1, 8, banned, offset=10_000)  # warm-up: first-request costs off the clock
        seen = {s.name: prompt_tokens(s, prompt(0)) for s in servers}
        if len({n for n in seen.values() if n is not None}) > 1:
            raise SystemExit(f"the servers make different prompts of the same message: {seen} prompt tokens")
        n = 0
        for rep in range(args.repeats):
            for ci, c in enumerate(args.streams):
                k = (rep + ci) % len(servers)  # who goes first rotates
                for s in servers[k:] + servers[:k]:
                    cpu0 = tree_cpu_seconds(s.pid)
                    reqs, wall = run_round(base_url(s), c, args.requests, args.tokens, banned, offset=n)
                    cpu = tree_cpu_seconds(s.pid) - cpu0
                    n += c * args.requests
                    tokens = sum(r.tokens for r in reqs if r.error is None)
                    rounds[s.name][c].append({"repeat": rep, "wall_s": wall, "tokens": tokens, "cpu_s": cpu,
                                              "cpu_pressure_avg10": cpu_pressure(),
                                              "requests": [_compact(r) for r in reqs]})
                    bad = sum(r.error is not None for r in reqs)
                    print(f"  {key} rep {rep + 1}/{args.repeats} streams {c:2d} {s.name:16s} "
                          f"{tokens / wall:7.1f} tok/s, cpu {cpu / max(tokens, 1) * 1e3:5.2f} ms/token"
                          + (f", {bad} FAILED: {next(r.error for r in reqs if r.error)}" if bad else ""),
                          file=sys.stderr)
        for s in servers:
            rss[s.name] = tree_peak_rss_mib(s.pid)
    finally:
        for s in servers:
            s.stop()
    return {"model": key, "title": spec.title, "file": model.name, "size_mib": round(model.stat().st_size / 2**20),
            "banned_tokens": banned, "prompt_tokens_seen": seen, "kernel_cpu_ms_per_token": ceiling, "peak_rss_mib": rss,
            "cells": {name: {c: summarise(rs) for c, rs in by.items()} for name, by in rounds.items()},
            "rounds": rounds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2,gemma", help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--tokens", type=int, default=128, help="output tokens per request")
    ap.add_argument("--requests", type=int, default=2, help="requests each stream sends back to back per round")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--streams", default="1,4,8,16", help="concurrency levels")
    ap.add_argument("--ctx", type=int, default=1024, help="context per slot, all servers")
    ap.add_argument("--out", default=str(RESULTS / "edge.json"))
    ap.add_argument("--no-docs", action="store_true", help="do not touch docs/benchmarks.md")
    args = ap.parse_args()
    args.streams = [int(x) for x in args.streams.split(",")]
    models = [m for m in args.models.split(",") if m]
    if unknown := [m for m in models if m not in MODELS]:
        ap.error(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}")
    def log(m: str) -> None:
        print(m, file=sys.stderr)

    llama_server = ensure_llama_server(log=log)
    lcp_bin = ensure_llama_cpp_server(log=log)
    build = json.loads((llama_server.parent / "build.json").read_text())
    t0 = time.monotonic()
    before = machine_facts()
    logs = RESULTS / "edge-logs"
    logs.mkdir(parents=True, exist_ok=True)
    results = [bench_model(m, args, llama_server, lcp_bin, logs) for m in models]
    report = {"command": "python -m bench." + " ".join(["edge", *sys.argv[1:]]), "args": vars(args),
              "machine_before": before, "machine_after": machine_facts(), "wall_s": round(time.monotonic() - t0),
              "versions": {"llama_cpp_python": LLAMA_CPP_PYTHON, "llama_server_build": build}, "models": results}
    publish(report, Path(args.out), render, None if args.no_docs else SECTION)
    if not args.no_docs:
        print(f"wrote docs/benchmarks.md ({SECTION})", file=sys.stderr)


if __name__ == "__main__":
    main()
