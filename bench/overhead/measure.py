"""How bench/overhead loads a target: wrk for the maximum rate, an open-loop client for latency at a fixed rate.

The maximum is closed loop (`--concurrency` connections, wrk on CPU 1). Latency is open loop: requests leave at a
fixed rate whether or not answers came back, so a target that cannot keep up shows queue growth, which is why a
target only joins a fixed-rate phase when its measured maximum is at least twice that rate. The targets of one
phase are interleaved round by round (rotating order), so drift in the machine hits all of them alike; each
round's p50 is kept, so the added latency can be given per round against direct's p50 of the same round.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from bench.overhead.targets import KEY, Target
from bench.procs import tree_cpu_seconds

__all__ = ["fixed_rate", "max_rate"]

LUA = """\
counter = 0
request = function()
  counter = counter + 1
  local body = string.format('{"model":"MODEL","messages":[{"role":"user","content":"bench prompt %d: how do edge and cloud tiers share traffic?"}],"max_tokens":8,"temperature":0STREAM}', counter)
  return wrk.format("POST", "/v1/chat/completions", {["Content-Type"]="application/json", ["Authorization"]="Bearer KEY"}, body)
end
"""


def _wrk(url: str, model: str, stream: bool, duration: int, conns: int, tmp: Path) -> dict[str, float]:
    script = tmp / f"load-{model}-{stream}.lua"
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


def max_rate(targets: list[Target], duration: int, conns: int, repeats: int, tmp: Path) -> None:
    """Max requests/s per mode and, for a server we started, its CPU (whole process tree) per request; `repeats`
    passes over all targets in rotating order, the median reported (with every pass's figures kept)."""
    for t in targets:
        for mode in ("json", "sse"):
            t.results[mode] = {"max_rps_runs": [], "cpu_ms_per_req_runs": [], "non2xx": 0}
    for rep in range(repeats):
        k = rep % len(targets)
        for t in targets[k:] + targets[:k]:
            url = t.base + "/v1/chat/completions"
            for stream in (False, True):
                m = t.results["sse" if stream else "json"]
                _wrk(url, t.model, stream, 2, conns, tmp)  # warm-up
                cpu0 = tree_cpu_seconds(t.server.pid) if t.server else 0.0
                w = _wrk(url, t.model, stream, duration, conns, tmp)
                cpu = tree_cpu_seconds(t.server.pid) - cpu0 if t.server else None
                m["max_rps_runs"].append(w["rps"])
                m["non2xx"] += w["non2xx"]
                if cpu is not None and w["requests"]:
                    m["cpu_ms_per_req_runs"].append(cpu / w["requests"] * 1000)
                print(f"  pass {rep + 1} {t.name:18s} {'sse' if stream else 'json'}: {w['rps']:8.0f} req/s max"
                      + (f", {m['cpu_ms_per_req_runs'][-1]:.3f} ms CPU/req" if m["cpu_ms_per_req_runs"] else ""),
                      file=sys.stderr)
    for t in targets:
        for mode in ("json", "sse"):
            m = t.results[mode]
            m["max_rps"] = statistics.median(m["max_rps_runs"])
            m["cpu_ms_per_req"] = statistics.median(m["cpu_ms_per_req_runs"]) if m["cpu_ms_per_req_runs"] else None


def quantiles(lat: list[float]) -> list[float]:
    return statistics.quantiles(sorted(lat), n=100) if len(lat) > 2 else [float("nan")] * 99


async def _open_loop(url: str, model: str, stream: bool, rate: float, duration: float) -> tuple[list[float], int]:
    lat: list[float] = []
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
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
        for i in range(int(rate * duration)):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    return lat, errors


def fixed_rate(targets: list[Target], rates: dict[str, float], duration: float, rounds: int, phase: str) -> None:
    """Open-loop latency at `rates[mode]`, targets interleaved; results go to t.results[mode][phase]."""
    for mode, rate in rates.items():
        stream = mode == "sse"
        pooled: dict[str, list[float]] = {t.name: [] for t in targets}
        per_round: dict[str, list[float]] = {t.name: [] for t in targets}
        errors = dict.fromkeys(pooled, 0)
        for r in range(rounds):
            k = r % len(targets)
            for t in targets[k:] + targets[:k]:
                lat, err = asyncio.run(_open_loop(t.base + "/v1/chat/completions", t.model, stream, rate,
                                                  duration / rounds))
                pooled[t.name] += lat
                per_round[t.name].append(quantiles(lat)[49] * 1000)
                errors[t.name] += err
        for t in targets:
            q = quantiles(pooled[t.name])
            t.results[mode][phase] = {"rate": rate, "p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000,
                                      "round_p50_ms": per_round[t.name], "errors": errors[t.name]}
            print(f"  {t.name:18s} {mode}: p50 {q[49] * 1000:.2f} ms / p99 {q[98] * 1000:.2f} ms at {rate:g}/s "
                  f"({phase}, {rounds} interleaved rounds)", file=sys.stderr)
