"""bench/load: N concurrent streaming clients through a real `tiergate serve` process to real edge nodes.

    .venv/bin/python -m bench.load [--clients 500] [--duration 60] [--nodes 2] [--parallel 8] [--write-docs]

What runs (all on 127.0.0.1, each its own process):
- edge nodes: `python -m tiergate.edge_node serve` on the tiny demo model (2 layers, Q4_0, built once under
  .tiergate/bench/load-tiny/), `--parallel P --threads 1`, registering with the gateway by heartbeat;
- the gateway: `tiergate serve` (uvicorn + uvloop, the production entry point), policy written by this script;
- the load generator: this process, one asyncio event loop (uvloop when installed) with one aiohttp session.

Each client (started evenly over --ramp seconds) loops until the end of the run: stream a chat completion
(max_tokens --max-tokens, distinct prompt, temperature 1, no cache), read it to `data: [DONE]`, repeat. A 429
is an explicit refusal: the client waits its Retry-After, then goes on. When the run ends, requests in flight
are allowed to finish (each is bounded by --timeout) rather than cut, so nothing is counted lost by the harness.

Time to first token is measured to the first chunk with generated content (a role-only opening frame does not
count), and tokens are the answers' own usage counts (`stream_options.include_usage`), not chunks.

Verdict per request: complete (all chunks then [DONE]), error by kind (HTTP status + OpenAI `code`, or an SSE
error event + [DONE]), or lost (neither [DONE] nor an error: a hang past --timeout, a cut connection).
Reported: counts, p50/p99 time to first token and total latency, gateway RSS every --sample seconds (start,
peak, end), peak RSS of every process, the load generator's own CPU use and event-loop lag (how far the client
itself was from keeping up). Results go to bench/results/load.json and, with --write-docs, to the
"## Load (bench/load)" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import resource
import shlex
import shutil
import statistics
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import uvloop

from bench.procs import Server, cpu_seconds, free_port, peak_rss_mib
from bench.report import REPO, RESULTS, write_section
from tiergate.edge_node.model.demo_model import build_demo_model

DOCS = REPO / "docs" / "benchmarks.md"
SECTION = "## Load (bench/load)"
RESULT_FILE = RESULTS / "load.json"
WORK = REPO / ".tiergate" / "bench" / "load"
MODEL_DIR = REPO / ".tiergate" / "bench" / "load-tiny"
KEY = "load-key-123456"
WORDS = ["river", "stone", "cloud", "lantern", "harbor", "meadow", "signal", "copper", "garden", "winter", "orbit",
         "canyon", "violet", "engine", "forest", "ladder", "marble", "pepper", "silver", "thunder"]


# ---------------------------------------------------------------------------------------------- processes

def build_model() -> tuple[Path, Path]:
    gguf, tok = MODEL_DIR / "tiergate-demo-tiny-q4_0.gguf", MODEL_DIR / "tokenizer.json"
    if not (gguf.exists() and tok.exists()):
        print("building the tiny demo model (once) ...", flush=True)
        m = build_demo_model(MODEL_DIR, size="tiny", quant="q4_0", seed=0)
        gguf, tok = Path(m.gguf), Path(m.tokenizer_json)
    return gguf, tok


def write_policy(path: Path, tokenizer: Path, max_concurrency: int, queue_s: float) -> Path:
    """`max_concurrency` 0 leaves it out: the gateway then admits 2 x the nodes' slots at once."""
    mc = f"\n    max_concurrency: {max_concurrency}" if max_concurrency > 0 else ""
    path.write_text(f"""\
version: 1
defaults:
  timeouts: {{connect_s: 2, first_byte_s: 120, between_chunks_s: 30, total_s: 300, queue_s: {queue_s}}}
  cache: {{enabled: false}}
tiers:
  edge:
    kind: edge
    model: tiergate-edge
    tokenizer: {tokenizer}
    max_context: 256{mc}
rules:
  - name: default
    tier: edge
""")
    return path


def tiergate_cmd() -> list[str]:
    script = Path(sys.executable).with_name("tiergate")
    return [str(script), "serve"] if script.exists() else [sys.executable, "-m", "tiergate.gateway.cli", "serve"]


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


# ------------------------------------------------------------------------------------------------ clients

@dataclass
class Result:
    started: float
    kind: str = "lost"  # complete | error | lost
    detail: str = ""
    ttft: float | None = None  # to the first chunk with generated content (not a role-only frame)
    total: float | None = None
    tokens: int = 0  # completion tokens, from the stream's usage chunk


@dataclass
class Run:
    results: list[Result] = field(default_factory=list)
    in_flight: int = 0
    peak_in_flight: int = 0
    lag_ms: list[float] = field(default_factory=list)
    rss: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, gateway RSS MiB)


def prompt(rng: random.Random) -> str:
    return "Write about " + " ".join(rng.choice(WORDS) for _ in range(8)) + "."


def _has_content(chunk: dict) -> bool:
    """Generated text or a tool call in any choice: what a time to first token is measured to."""
    for c in chunk.get("choices") or ():
        d = c.get("delta") or {}
        if c.get("text") or d.get("content") or d.get("tool_calls"):
            return True
    return False


async def one_request(session: aiohttp.ClientSession, url: str, body: dict, timeout_s: float, run: Run) -> Result:
    res = Result(time.perf_counter())
    run.in_flight += 1
    run.peak_in_flight = max(run.peak_in_flight, run.in_flight)
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, json=body) as r:
                if r.status != 200:
                    raw = await r.read()
                    try:
                        err = json.loads(raw)["error"]
                        res.kind, res.detail = "error", f"http_{r.status}:{err.get('code') or err.get('type')}"
                    except (ValueError, KeyError, TypeError):
                        res.kind, res.detail = "lost", f"http_{r.status}:not_an_openai_error"
                    if r.status == 429:
                        res.detail += f"|retry_after={r.headers.get('retry-after', '1')}"
                    return res
                done, error = False, None
                async for line in r.content:
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        break
                    if payload.startswith(b'{"error"'):
                        error = json.loads(payload)["error"]
                        continue
                    chunk = json.loads(payload)
                    if res.ttft is None and _has_content(chunk):
                        res.ttft = time.perf_counter() - res.started
                    if chunk.get("usage"):
                        res.tokens = int(chunk["usage"].get("completion_tokens") or 0)
                if not done:
                    res.kind, res.detail = "lost", "stream_cut_without_done"
                elif error is not None:
                    res.kind, res.detail = "error", f"sse:{error.get('code') or error.get('type')}"
                elif res.ttft is not None or res.tokens:
                    res.kind = "complete"
                else:
                    res.kind, res.detail = "lost", "empty_stream"
    except TimeoutError:
        res.kind, res.detail = "lost", "client_timeout"
    except (aiohttp.ClientError, ConnectionError) as exc:
        res.kind, res.detail = "lost", f"client_{type(exc).__name__}"
    finally:
        run.in_flight -= 1
        res.total = time.perf_counter() - res.started
    return res


async def client(i: int, session: aiohttp.ClientSession, url: str, args, run: Run, start_at: float,
                 stop_at: float) -> None:
    await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
    rng = random.Random(i)
    while time.perf_counter() < stop_at:
        body = {"model": "auto", "stream": True, "stream_options": {"include_usage": True},
                "max_tokens": args.max_tokens, "temperature": 1,
                "messages": [{"role": "user", "content": prompt(rng)}]}
        res = await one_request(session, url, body, args.timeout, run)
        run.results.append(res)
        if "retry_after=" in res.detail:
            await asyncio.sleep(min(float(res.detail.rsplit("=", 1)[1]), max(0.0, stop_at - time.perf_counter())))
        elif res.kind != "complete":
            await asyncio.sleep(0.5)  # do not spin on a failing gateway


async def monitor(run: Run, gateway_pid: int, t0: float, stop: asyncio.Event, every_s: float) -> None:
    next_rss = 0.0
    while not stop.is_set():
        before = time.perf_counter()
        await asyncio.sleep(0.1)
        run.lag_ms.append((time.perf_counter() - before - 0.1) * 1000)
        now = time.perf_counter() - t0
        if now >= next_rss:
            run.rss.append((round(now, 1), round(rss_mib(gateway_pid), 1)))
            next_rss = now + every_s


async def drive(args, url: str, gateway_pid: int) -> tuple[Run, float]:
    run = Run()
    conn = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    t0 = time.perf_counter()
    stop_at = t0 + args.ramp + args.duration
    stop = asyncio.Event()
    async with aiohttp.ClientSession(connector=conn, timeout=timeout, headers={"Authorization": f"Bearer {KEY}"}) as s:
        mon = asyncio.create_task(monitor(run, gateway_pid, t0, stop, args.sample))
        await asyncio.gather(*(client(i, s, url, args, run, t0 + args.ramp * i / args.clients, stop_at)
                               for i in range(args.clients)))
        wall = time.perf_counter() - t0
        await asyncio.sleep(args.sample)  # one more memory sample after the load is gone
        stop.set()
        await mon
    return run, wall


# ----------------------------------------------------------------------------------------------- reporting

def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(p / 100 * (len(values) - 1))))
    return values[k]


def ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 1)


def report(args, run: Run, wall: float, procs: dict[str, Server], gen_cpu_s: float, cmd: str) -> dict:
    res = run.results
    kinds = Counter(r.kind for r in res)
    errors = Counter(r.detail.split("|")[0] for r in res if r.kind == "error")
    lost = Counter(r.detail for r in res if r.kind == "lost")
    ok = [r for r in res if r.kind == "complete"]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    total = [r.total for r in ok if r.total is not None]
    rss = [v for _, v in run.rss]
    load_window = [v for t, v in run.rss if args.ramp <= t <= args.ramp + args.duration]
    peaks = {name: round(peak_rss_mib(s.pid), 1) for name, s in procs.items()}
    peaks["load generator"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    cpu = {name: round(cpu_seconds(s.pid), 1) for name, s in procs.items()}
    cpu["load generator"] = round(gen_cpu_s, 1)
    tokens = sum(r.tokens for r in ok)
    return {
        "command": cmd,
        "args": vars(args),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
                   f"load average at start {args._load_at_start}",
        "wall_s": round(wall, 1),
        "requests": {"sent": len(res), "completed": kinds["complete"], "errored": kinds["error"],
                     "errors_by_kind": dict(errors), "lost": kinds["lost"], "lost_by_reason": dict(lost)},
        "throughput": {"completed_per_s": round(kinds["complete"] / wall, 1),
                       "tokens_per_s": round(tokens / wall, 1),
                       "tokens_per_answer": round(tokens / len(ok), 2) if ok else None},
        "ttft_ms": {"p50": ms(pct(ttft, 50)), "p99": ms(pct(ttft, 99)), "max": ms(max(ttft) if ttft else None)},
        "latency_ms": {"p50": ms(pct(total, 50)), "p99": ms(pct(total, 99)), "max": ms(max(total) if total else None)},
        "peak_in_flight": run.peak_in_flight,
        "gateway_rss_mib": {"start": rss[0] if rss else None, "peak": max(rss) if rss else None,
                            "end": rss[-1] if rss else None,
                            "load_window_min": min(load_window) if load_window else None,
                            "load_window_max": max(load_window) if load_window else None,
                            "series": run.rss},
        "peak_rss_mib": peaks,
        "cpu_s": cpu,
        "load_generator": {"cpu_utilization": round(gen_cpu_s / wall, 2),
                           "loop_lag_ms_p50": round(statistics.median(run.lag_ms), 1) if run.lag_ms else None,
                           "loop_lag_ms_p99": round(pct(run.lag_ms, 99), 1) if run.lag_ms else None},
    }


def markdown(r: dict) -> str:
    a, q = r["args"], r["requests"]
    errs = ", ".join(f"{k}: {v}" for k, v in sorted(q["errors_by_kind"].items())) or "none"
    lost = ", ".join(f"{k}: {v}" for k, v in sorted(q["lost_by_reason"].items())) or "none"
    g = r["gateway_rss_mib"]
    lg = r["load_generator"]
    peaks = ", ".join(f"{k} {v:.0f} MiB" for k, v in r["peak_rss_mib"].items())
    cpu = ", ".join(f"{k} {v:.0f} s" for k, v in r["cpu_s"].items())
    series = " ".join(f"{v:.0f}" for _, v in g["series"])
    return f"""\
Command: `{r['command']}`

Set-up: {a['nodes']} edge nodes (`edge-node serve`, tiny demo model: 2 layers, 256 wide, Q4_0; `--parallel {a['parallel']} --threads 1`),
registered with one `tiergate serve` process (uvicorn + uvloop; policy: one edge tier, {_mc(a)},
`queue_s: {a['queue_s']:g}`, cache off), and one load-generator process (aiohttp, one event loop), all on this machine's
2 shared cores. {a['clients']} clients, started evenly over {a['ramp']:g} s, each streaming chat completions
(`max_tokens: {a['max_tokens']}`, temperature 1, distinct prompts) back to back for {a['duration']:g} s after the ramp; requests in
flight at the end were allowed to finish (client timeout {a['timeout']:g} s). Machine: {r['machine']}.

| requests sent | completed | errored | lost | completed/s | tokens/s (usage) | tokens per answer | peak in flight |
|---:|---:|---:|---:|---:|---:|---:|---:|
| {q['sent']} | {q['completed']} | {q['errored']} | **{q['lost']}** | {r['throughput']['completed_per_s']} | {r['throughput']['tokens_per_s']} | {r['throughput']['tokens_per_answer']} | {r['peak_in_flight']} |

Errors by kind: {errs}. Lost by reason: {lost}.

| | p50 | p99 | max |
|---|---:|---:|---:|
| time to first content token (ms) | {r['ttft_ms']['p50']} | {r['ttft_ms']['p99']} | {r['ttft_ms']['max']} |
| total latency (ms) | {r['latency_ms']['p50']} | {r['latency_ms']['p99']} | {r['latency_ms']['max']} |

Both include the wait in the gateway's admission queue and in the nodes' queues: with {a['clients']} clients and
{a['nodes'] * a['parallel']} decoding slots in all, most of a request's life is waiting its turn, so these figures measure the
machine's capacity under this load, not the gateway's overhead (see "Gateway overhead (bench/overhead)" for that).

Gateway RSS (MiB): start {g['start']}, peak {g['peak']}, end {g['end']}; during the steady window
{g['load_window_min']}–{g['load_window_max']}. Samples every {a['sample']:g} s: {series}.

Peak RSS: {peaks}. CPU time: {cpu}.

Client-side limits: the load generator used {lg['cpu_utilization']:.0%} of a core; its event loop lagged p50
{lg['loop_lag_ms_p50']} ms, p99 {lg['loop_lag_ms_p99']} ms (a 100 ms timer's overshoot), so its own delay in reading chunks
is at most of that order; it shares the 2 cores with the gateway and the nodes.
"""


def _mc(a: dict) -> str:
    if a["max_concurrency"] > 0:
        return f"`max_concurrency: {a['max_concurrency']}`"
    return f"no `max_concurrency` (default: 2 x {a['nodes'] * a['parallel']} slots in flight)"


def write_docs(body: str) -> None:
    write_section(SECTION, body, DOCS)


# -------------------------------------------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=500)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of load after the ramp")
    ap.add_argument("--ramp", type=float, default=10.0, help="seconds over which clients start")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=8, help="slots per edge node")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--max-concurrency", type=int, default=256,
                    help="the edge tier's max_concurrency (requests the gateway lets through at once); "
                         "0: not set, the gateway's default of 2 x the nodes' slots")
    ap.add_argument("--queue-s", type=float, default=120.0, help="longest wait in the gateway's admission queue")
    ap.add_argument("--timeout", type=float, default=300.0, help="client timeout per request")
    ap.add_argument("--sample", type=float, default=3.0, help="seconds between gateway RSS samples")
    ap.add_argument("--write-docs", action="store_true", help="write the section in docs/benchmarks.md")
    ap.add_argument("--docs-only", action="store_true",
                    help="only render the docs section again from bench/results/load.json (no run)")
    args = ap.parse_args()
    if args.docs_only:
        write_docs(markdown(json.loads(RESULT_FILE.read_text())))
        print(f"wrote the {SECTION!r} section of {DOCS} from {RESULT_FILE}")
        return
    args._load_at_start = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    cmd = ".venv/bin/python -m bench.load " + " ".join(shlex.quote(a) for a in sys.argv[1:])

    gguf, tok = build_model()
    if WORK.exists():
        shutil.rmtree(WORK)
    WORK.mkdir(parents=True)
    pol = write_policy(WORK / "policy.yaml", tok, args.max_concurrency, args.queue_s)
    port = free_port()
    gw_url = f"http://127.0.0.1:{port}"
    env = {"TIERGATE_POLICY": str(pol), "TIERGATE_PORT": str(port), "TIERGATE_API_KEYS": f"{KEY}=load:normal",
           "TIERGATE_EMBEDDER": "", "TIERGATE_LOG_FORMAT": "json", "TIERGATE_REDIS_URL": ""}
    procs: dict[str, Server] = {}
    try:
        procs["gateway"] = Server("gateway", tiergate_cmd(), gw_url + "/healthz", env=env,
                                  log=WORK / "gateway.log").start(60)
        for i in range(args.nodes):
            p = free_port()
            procs[f"edge node {i + 1}"] = Server(
                f"edge-{i + 1}", [sys.executable, "-m", "tiergate.edge_node", "serve", "--model", str(gguf), "--host", "127.0.0.1",
                                  "--port", str(p), "--parallel", str(args.parallel), "--ctx", "256", "--threads", "1",
                                  "--gateway", gw_url, "--model-name", f"edge-{i + 1}", "--log-format", "json"],
                f"http://127.0.0.1:{p}/health", env={"HF_HUB_OFFLINE": "1"}, log=WORK / f"edge-{i + 1}.log").start(180)
        deadline = time.monotonic() + 60
        while True:  # every node registered
            with urllib.request.urlopen(gw_url + "/readyz", timeout=5) as r:
                if r.status == 200 and len(_edge_endpoints(gw_url)) == args.nodes:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("edge nodes did not register with the gateway")
            time.sleep(0.5)
        uvloop.install()
        print(f"load: {args.clients} clients, ramp {args.ramp:g}s, {args.duration:g}s ...", flush=True)
        cpu0 = time.process_time()
        run, wall = asyncio.run(drive(args, gw_url + "/v1/chat/completions", procs["gateway"].pid))
        result = report(args, run, wall, procs, time.process_time() - cpu0, cmd)
    finally:
        for s in procs.values():
            s.stop()
    RESULT_FILE.parent.mkdir(parents=True, exist_ok=True)
    RESULT_FILE.write_text(json.dumps(result, indent=2) + "\n")
    body = markdown(result)
    print(body)
    if args.write_docs:
        write_docs(body)
        print(f"wrote the {SECTION!r} section of {DOCS}")


def _edge_endpoints(gw_url: str) -> list:
    req = urllib.request.Request(gw_url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        data = json.loads(r.read())["data"]
    edge = [m for m in data if m.get("tier") == "edge"]
    return edge[0]["backend_models"] if edge else []


if __name__ == "__main__":
    main()
