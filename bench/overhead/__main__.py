"""bench/overhead: the gateway's own cost, side by side with calling the upstream directly and with LiteLLM's proxy.

    .venv/bin/python -m bench.overhead [--duration 10] [--rounds 8] [--skip-litellm] [--cpu-latency-us N]
                                       [--guest-halt-poll-ns N]

One run starts an instant OpenAI-compatible upstream, then for each target (direct; passthrough, the floor: uvicorn +
Starlette + aiohttp relaying bytes with no logic at all; tiergate; LiteLLM) and each
mode (JSON, SSE): the maximum requests/s at concurrency 16 (wrk, one connection per client), the latency at a
fixed 200 requests/s (open loop), and the target's CPU seconds per request. Servers under test are pinned to
CPU 0, the upstream and the load generators to CPU 1, so they do not steal from each other.

Latency is what this shared VM makes noisy, so direct, passthrough and tiergate are all up at once and the
open-loop phase interleaves them: `--rounds` rounds, each sending `--duration / --rounds` seconds of traffic
to every target in turn (rotating the order). A target's p50/p99 are over all its rounds, and the added p50
is also given per round (median, min, max), so drift in the machine hits every target alike. LiteLLM cannot
take 200 requests/s, so its open-loop run is separate. `--cpu-latency-us N` holds a PM QoS request
(/dev/cpu_dma_latency, what tuned's latency-performance profile does) for the whole run, to measure how much
of the added latency is idle-CPU wake-up. `--guest-halt-poll-ns N` sets the KVM guest's halt-polling window
(/sys/module/haltpoll/parameters/guest_halt_poll_ns) for the run and restores it afterwards: this VM's kernel
command line sets it to 0, where Linux's default for guests is 200000, so every idle vCPU halts at once and each
wake-up is a VM exit. Prints a table and writes bench/results/overhead*.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from bench.procs import Server, cpu_seconds, free_port, peak_rss_mib
from bench.versions import LITELLM_SPEC

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
LITELLM_VENV = ROOT / ".venv-litellm"
KEY = "tg-bench-key"

POLICY = """\
# Bench policy: one edge tier whose only endpoint is the instant upstream.
version: 1
tiers:
  edge:
    kind: edge
    model: tiergate-edge
    endpoints: ["http://127.0.0.1:{port}"]
rules:
  - name: everything-to-edge
    tier: edge
"""

LUA = """\
counter = 0
request = function()
  counter = counter + 1
  local body = string.format('{"model":"MODEL","messages":[{"role":"user","content":"bench prompt %d: how do edge and cloud tiers share traffic?"}],"max_tokens":8,"temperature":0STREAM}', counter)
  return wrk.format("POST", "/v1/chat/completions", {["Content-Type"]="application/json", ["Authorization"]="Bearer KEY"}, body)
end
"""


def ensure_litellm() -> Path | None:
    py = LITELLM_VENV / "bin" / "python"
    if not (LITELLM_VENV / "bin" / "litellm").exists():
        print(f"==> creating .venv-litellm with {LITELLM_SPEC} (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
        r = subprocess.run([str(py), "-m", "pip", "install", "-q", LITELLM_SPEC], check=False)
        if r.returncode != 0:
            return None
    return LITELLM_VENV / "bin" / "litellm"


def wrk(url: str, model: str, stream: bool, duration: int, conns: int, tmp: Path) -> dict[str, float]:
    script = tmp / f"load-{stream}.lua"
    script.write_text(LUA.replace("MODEL", model).replace("KEY", KEY)
                      .replace("STREAM", ',"stream":true' if stream else ""))
    out = subprocess.run(["taskset", "-c", "1", "wrk", "-t1", f"-c{conns}", f"-d{duration}s", "--latency", "-s",
                          str(script), url], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    total = int(re.search(r"(\d+) requests in", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors and int(errors.group(1)) > total // 100:
        raise RuntimeError(f"{url}: {errors.group(1)} of {total} answers were not 2xx; wrk said:\n{out}")
    return {"rps": rps, "requests": total, "non2xx": int(errors.group(1)) if errors else 0}


async def open_loop(url: str, model: str, stream: bool, rate: float, duration: float) -> dict[str, float]:
    """Send `rate` requests/s for `duration` s regardless of answers; latency = send to last byte."""
    lat, errors = await _open_loop(url, model, stream, rate, duration)
    q = _quantiles(lat)
    return {"p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000, "errors": errors, "sent": int(rate * duration)}


def _quantiles(lat: list[float]) -> list[float]:
    return statistics.quantiles(sorted(lat), n=100) if len(lat) > 2 else [float("nan")] * 99


async def _open_loop(url: str, model: str, stream: bool, rate: float, duration: float) -> tuple[list[float], int]:
    lat: list[float] = []
    errors = 0
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as s:
        async def one(i: int) -> None:
            nonlocal errors
            body = {"model": model, "max_tokens": 8, "temperature": 0, "stream": stream,
                    "messages": [{"role": "user", "content": f"open-loop prompt {i} {time.time_ns()}"}]}
            t0 = time.perf_counter()
            try:
                async with s.post(url, json=body, headers={"Authorization": f"Bearer {KEY}"}) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1
                        return
            except aiohttp.ClientError:
                errors += 1
                return
            lat.append(time.perf_counter() - t0)

        tasks = []
        start = time.perf_counter()
        n = int(rate * duration)
        for i in range(n):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    return lat, errors


def throughput(name: str, server: Server | None, base: str, model: str, args, tmp: Path) -> dict[str, object]:
    """Max requests/s (wrk) and, for a server we started, its CPU per request: one target at a time."""
    res: dict[str, object] = {"target": name}
    url = base + "/v1/chat/completions"
    for stream in (False, True):
        mode = "sse" if stream else "json"
        wrk(url, model, stream, 2, args.concurrency, tmp)  # warm-up
        cpu0 = cpu_seconds(server.pid) if server else 0.0
        w = wrk(url, model, stream, args.duration, args.concurrency, tmp)
        cpu1 = cpu_seconds(server.pid) if server else 0.0
        res[mode] = {"max_rps": w["rps"], "non2xx": w["non2xx"],
                     "cpu_ms_per_req": (cpu1 - cpu0) / w["requests"] * 1000 if server else None}
        print(f"  {name:11s} {mode}: {w['rps']:8.0f} req/s max"
              + (f", {res[mode]['cpu_ms_per_req']:.3f} ms CPU/req" if server else ""), file=sys.stderr)
    return res


def latency(targets: list[tuple[dict, str, str]], args) -> None:
    """Open-loop latency at `args.rate`, the targets interleaved round by round (see the module docstring);
    fills each target's result with p50/p99 over all rounds and its per-round p50s."""
    key50, key99 = f"p50_ms_at_{args.rate:g}rps", f"p99_ms_at_{args.rate:g}rps"
    slice_s = args.duration / args.rounds
    for stream in (False, True):
        mode = "sse" if stream else "json"
        pooled: dict[str, list[float]] = {res["target"]: [] for res, _, _ in targets}
        per_round: dict[str, list[float]] = {res["target"]: [] for res, _, _ in targets}
        errors: dict[str, int] = dict.fromkeys(pooled, 0)
        for r in range(args.rounds):
            for res, url, model in targets[r % len(targets):] + targets[:r % len(targets)]:
                lat, err = asyncio.run(_open_loop(url + "/v1/chat/completions", model, stream, args.rate, slice_s))
                pooled[res["target"]] += lat
                per_round[res["target"]].append(_quantiles(lat)[49] * 1000)
                errors[res["target"]] += err
        for res, _, _ in targets:
            q = _quantiles(pooled[res["target"]])
            res[mode].update({key50: q[49] * 1000, key99: q[98] * 1000, "round_p50_ms": per_round[res["target"]],
                              "open_loop_errors": errors[res["target"]]})
            print(f"  {res['target']:11s} {mode}: p50 {q[49] * 1000:.2f} ms / p99 {q[98] * 1000:.2f} ms at "
                  f"{args.rate:g}/s over {args.rounds} interleaved rounds", file=sys.stderr)


@contextlib.contextmanager
def cpu_latency(us: int | None) -> Iterator[None]:
    """Hold a PM QoS CPU latency request (the kernel then avoids idle states slower to leave than `us`)."""
    if us is None:
        yield
        return
    fd = os.open("/dev/cpu_dma_latency", os.O_RDWR)  # needs root; released when closed
    try:
        os.write(fd, struct.pack("i", us))
        yield
    finally:
        os.close(fd)


HALT_POLL = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")


@contextlib.contextmanager
def guest_halt_poll(ns: int | None) -> Iterator[None]:
    """Let idle vCPUs poll up to `ns` before halting (the cpuidle-haltpoll driver), then put the old value back."""
    if ns is None:
        yield
        return
    if not HALT_POLL.exists():
        sys.exit(f"--guest-halt-poll-ns: {HALT_POLL} does not exist (not a KVM guest with cpuidle-haltpoll)")
    old = HALT_POLL.read_text().strip()
    HALT_POLL.write_text(str(ns))  # needs root
    try:
        yield
    finally:
        HALT_POLL.write_text(old)


def main() -> None:
    ap = argparse.ArgumentParser(description="gateway overhead vs direct vs LiteLLM")
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rate", type=float, default=200)
    ap.add_argument("--rounds", type=int, default=8, help="interleaved open-loop rounds (latency)")
    ap.add_argument("--skip-litellm", action="store_true")
    ap.add_argument("--cpu-latency-us", type=int, default=None,
                    help="hold this PM QoS CPU latency (/dev/cpu_dma_latency) during the run; e.g. 0")
    ap.add_argument("--guest-halt-poll-ns", type=int, default=None,
                    help="KVM guests: poll this long before halting an idle vCPU during the run; Linux's default 200000")
    args = ap.parse_args()
    with cpu_latency(args.cpu_latency_us), guest_halt_poll(args.guest_halt_poll_ns):
        run(args)


def run(args) -> None:
    if not shutil.which("wrk"):
        sys.exit("bench/overhead needs wrk: apt-get install wrk")
    RESULTS.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="tg-overhead-"))
    py = sys.executable
    up_port, gw_port, ll_port = free_port(), free_port(), free_port()
    upstream = Server("upstream", [py, "-m", "bench.instant_upstream", "--port", str(up_port)],
                      f"http://127.0.0.1:{up_port}/health", cpus={1}, log=tmp / "upstream.log").start()
    os.sched_setaffinity(0, {1})  # the open-loop client: beside the upstream, away from the servers under test
    results = []
    try:
        pt_port = free_port()
        pt = Server("passthrough", [py, "-m", "bench.overhead.passthrough", "--port", str(pt_port), "--upstream",
                                    f"http://127.0.0.1:{up_port}"], f"http://127.0.0.1:{pt_port}/health", cpus={0},
                    log=tmp / "passthrough.log").start()
        (tmp / "policy.yaml").write_text(POLICY.format(port=up_port))
        gw = Server("tiergate", [str(Path(py).parent / "tiergate"), "serve", "--port", str(gw_port)],
                    f"http://127.0.0.1:{gw_port}/readyz", cpus={0}, log=tmp / "gateway.log",
                    env={"TIERGATE_POLICY": str(tmp / "policy.yaml"), "TIERGATE_API_KEYS": f"{KEY}=bench",
                         "TIERGATE_LOG_LEVEL": "warning", "TIERGATE_EMBEDDER": ""}).start()
        try:
            targets = [("direct", None, f"http://127.0.0.1:{up_port}", "instant"),
                       ("passthrough", pt, f"http://127.0.0.1:{pt_port}", "instant"),
                       ("tiergate", gw, f"http://127.0.0.1:{gw_port}", "auto")]
            for name, server, base, model in targets:
                results.append(throughput(name, server, base, model, args, tmp))
            latency([(res, base, model) for res, (_, _, base, model) in zip(results, targets, strict=True)], args)
            for res, (_, server, _, _) in zip(results, targets, strict=True):
                res["peak_rss_mib"] = peak_rss_mib(server.pid) if server else None
        finally:
            pt.stop()
            gw.stop()
        if not args.skip_litellm and (litellm := ensure_litellm()):
            cfg = tmp / "litellm.yaml"
            cfg.write_text(f"model_list:\n  - model_name: instant\n    litellm_params:\n      model: openai/instant\n"
                           f"      api_base: http://127.0.0.1:{up_port}/v1\n      api_key: x\n"
                           f"general_settings:\n  master_key: {KEY}\nlitellm_settings:\n  telemetry: false\n")
            ll = Server("litellm", [str(litellm), "--config", str(cfg), "--port", str(ll_port), "--num_workers", "1"],
                        f"http://127.0.0.1:{ll_port}/health/liveliness", cpus={0}, log=tmp / "litellm.log",
                        env={"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False"}).start(timeout_s=300)
            try:
                res = throughput("litellm", ll, f"http://127.0.0.1:{ll_port}", "instant", args, tmp)
                for mode, stream in (("json", False), ("sse", True)):  # alone: it cannot take the rate
                    ol = asyncio.run(open_loop(f"http://127.0.0.1:{ll_port}/v1/chat/completions", "instant", stream,
                                               args.rate, args.duration))
                    res[mode].update({f"p50_ms_at_{args.rate:g}rps": ol["p50_ms"],
                                      f"p99_ms_at_{args.rate:g}rps": ol["p99_ms"], "open_loop_errors": ol["errors"]})
                res["peak_rss_mib"] = peak_rss_mib(ll.pid)
                results.append(res)
            finally:
                ll.stop()
    finally:
        upstream_rss = peak_rss_mib(upstream.pid)
        upstream.stop()
    report = {"args": vars(args), "upstream_peak_rss_mib": upstream_rss, "results": results,
              "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    name = "overhead"
    if args.cpu_latency_us is not None:
        name += f"-cpu-latency-{args.cpu_latency_us}us"
    if args.guest_halt_poll_ns is not None:
        name += f"-halt-poll-{args.guest_halt_poll_ns}ns"
    report["idle"] = {"guest_halt_poll_ns": HALT_POLL.read_text().strip() if HALT_POLL.exists() else None,
                      "cpuidle_governor": _read("/sys/devices/system/cpu/cpuidle/current_governor_ro")}
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=2))
    print(table(report))


def _read(path: str) -> str | None:
    with contextlib.suppress(OSError):
        return Path(path).read_text().strip()
    return None


def table(report: dict) -> str:
    rate = report["args"]["rate"]
    by = {r["target"]: r for r in report["results"]}
    header = (f"| target | mode | max req/s (c={report['args']['concurrency']}) | p50 / p99 ms at {rate:g} req/s | "
              f"added p50 ms vs direct | per round: median (min..max) | CPU ms/req | peak RSS MiB |")
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        for mode in ("json", "sse"):
            m = r[mode]
            d = by["direct"][mode]
            p50 = m[f"p50_ms_at_{rate:g}rps"]
            added = p50 - d[f"p50_ms_at_{rate:g}rps"]
            rounds = "-"
            if "round_p50_ms" in m and r["target"] != "direct":
                diffs = [a - b for a, b in zip(m["round_p50_ms"], d["round_p50_ms"], strict=True)]
                rounds = f"{statistics.median(diffs):+.2f} ({min(diffs):+.2f}..{max(diffs):+.2f})"
            cpu = f"{m['cpu_ms_per_req']:.3f}" if m["cpu_ms_per_req"] is not None else "-"
            rss = f"{r['peak_rss_mib']:.0f}" if r["peak_rss_mib"] else "-"
            lines.append(f"| {r['target']} | {mode} | {m['max_rps']:.0f} | {p50:.2f} / {m[f'p99_ms_at_{rate:g}rps']:.2f} "
                         f"| {added:+.2f} | {rounds} | {cpu} | {rss} |")
    if "tiergate" in by and "litellm" in by:
        for mode in ("json", "sse"):
            ratio = by["tiergate"][mode]["max_rps"] / max(by["litellm"][mode]["max_rps"], 1e-9)
            lines.append(f"\ntiergate / LiteLLM max req/s ({mode}): {ratio:.1f}x")
    if "tiergate" in by and "passthrough" in by:
        for mode in ("json", "sse"):
            t, p = by["tiergate"][mode], by["passthrough"][mode]
            key = f"p50_ms_at_{rate:g}rps"
            lines.append(f"\ntiergate vs the bare passthrough ({mode}): {t['max_rps'] / max(p['max_rps'], 1e-9):.2f}x "
                         f"its req/s, {t[key] - p[key]:+.2f} ms p50 at {rate:g} req/s")
    lines.append(f"\nupstream peak RSS: {report['upstream_peak_rss_mib']:.0f} MiB")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
