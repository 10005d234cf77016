"""bench/fuzz: the long run of the byte-level fuzzing, against real processes, one command.

    .venv/bin/python -m bench.fuzz [--cases 2000] [--seed 1] [--concurrency 4] [--write-docs]

What runs (all on 127.0.0.1, each its own process): two instant OpenAI backends (`tests.support.instant_upstream`, so that
what is fuzzed is the gateway, not a model), `tiergate serve` (the production entry point: uvicorn, uvloop,
httptools) in front of them, a second `tiergate serve` for edge registration (the nodes fuzzed heartbeats register
must not receive the other cases' completions), and `edge-node serve` on the tiny demo model (llama.cpp).

Each surface gets --cases cases (`tests/support/fuzz_cases.py`, drawn from --seed: the same seed sends the same bytes),
--concurrency at a time, each judged by `tests/support/fuzz_client.py`: answered, 5xx, hang (no answer within --timeout)
or closed (no status line). After each surface, one normal request must still be answered. Results go to
bench/results/fuzz.json and, with --write-docs, to the "## Byte-level fuzzing (bench/fuzz)" section of
docs/reliability.md. The suite runs the same cases with seed 0, fewer of them (tests/fuzz/test_byte_fuzz.py).
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
import urllib.request
from collections import Counter
from pathlib import Path

from bench.procs import Server, free_port, peak_rss_mib
from bench.report import REPO, RESULTS, write_section
from tests.support.fuzz_cases import MUTATORS, SURFACES, Target, generate
from tests.support.fuzz_client import UVICORN_400, Result, send

DOCS = REPO / "docs" / "reliability.md"
SECTION = "## Byte-level fuzzing (bench/fuzz)"
RESULT_FILE = RESULTS / "fuzz.json"
WORK = REPO / ".tiergate" / "bench" / "fuzz"
MODEL_DIR = REPO / ".tiergate" / "bench" / "load-tiny"
API_KEY, ADMIN_KEY, EDGE_TOKEN = "fuzz-api-key-1", "fuzz-admin-key-1", "fuzz-edge-token-1"


def build_model() -> Path:
    gguf = MODEL_DIR / "tiergate-demo-tiny-q4_0.gguf"
    if not gguf.exists():
        from tiergate.edge_node.model.demo_model import (
            build_demo_model,  # start-up time: llama.cpp only when the model is missing
        )

        print("building the tiny demo model (once) ...", flush=True)
        gguf = Path(build_demo_model(MODEL_DIR, size="tiny", quant="q4_0", seed=0).gguf)
    return gguf


def write_policy(path: Path, edge: str, cloud: str) -> Path:
    path.write_text(f"""\
version: 1
defaults:
  timeouts: {{connect_s: 2, first_byte_s: 30, between_chunks_s: 30, total_s: 60, queue_s: 5}}
  cache: {{enabled: true, semantic: false}}
tiers:
  edge:
    kind: edge
    model: tiergate-edge
    endpoints: ["{edge}"]
  cloud:
    kind: cloud
    model: tiergate-cloud
    served_model: instant
    endpoints: ["{cloud}"]
rules:
  - name: explicit-cloud
    when: {{model: [tiergate-cloud]}}
    tier: cloud
  - name: default
    tier: edge
    fallbacks: [cloud]
""")
    return path


def start_all(work: Path, model: Path) -> dict[str, Server]:
    py = sys.executable
    procs: dict[str, Server] = {}
    for name in ("edge-backend", "cloud-backend"):
        port = free_port()
        procs[name] = Server(name, [py, "-m", "tests.support.instant_upstream", "--port", str(port)],
                             f"http://127.0.0.1:{port}/health", log=work / f"{name}.log").start()
    policy = write_policy(work / "policy.yaml", procs["edge-backend"].health_url.removesuffix("/health"),
                          procs["cloud-backend"].health_url.removesuffix("/health"))
    env = {"TIERGATE_POLICY": str(policy), "TIERGATE_API_KEYS": f"{API_KEY}=fuzz:normal",
           "TIERGATE_ADMIN_KEY": ADMIN_KEY, "TIERGATE_EDGE_TOKEN": EDGE_TOKEN, "TIERGATE_LOG_LEVEL": "warning"}
    for name in ("gateway", "gateway-registration"):
        port = free_port()
        procs[name] = Server(name, [py, "-m", "tiergate.gateway.cli", "serve", "--port", str(port)],
                             f"http://127.0.0.1:{port}/readyz", env=env | {"TIERGATE_PORT": str(port)},
                             log=work / f"{name}.log").start()
    port = free_port()
    procs["edge-node"] = Server("edge-node", [py, "-m", "tiergate.edge_node", "serve", "--model", str(model), "--port", str(port),
                                              "--parallel", "4", "--ctx", "1024", "--threads", "1",
                                              "--log-level", "warning"],
                                f"http://127.0.0.1:{port}/health", log=work / "edge-node.log").start()
    return procs


def port_of(server: Server) -> int:
    return int(server.health_url.split(":")[2].split("/")[0])


def normal_request(base: str, path: str, body: dict, headers: dict[str, str]) -> bool:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status == 200 and bool(json.loads(r.read())["choices"])
    except (OSError, ValueError, KeyError):
        return False


async def fuzz(surface: str, port: int, target: Target, args) -> tuple[list[Result], float]:
    cases = generate(surface, target, args.seed, args.cases)
    gate = asyncio.Semaphore(args.concurrency)

    async def one(case) -> Result:
        async with gate:
            return await send(case, "127.0.0.1", port, args.timeout)

    started = time.perf_counter()
    results = await asyncio.gather(*(one(c) for c in cases))
    return list(results), time.perf_counter() - started


def summarize(surface: str, results: list[Result], seconds: float, still_serves: bool) -> dict:
    verdicts = Counter(r.verdict for r in results)
    bad = [r for r in results if r.verdict != "answered" or r.shape == "incomplete"
           or (r.status is not None and r.status >= 400 and r.shape != "openai" and r.excerpt != UVICORN_400)]
    return {
        "surface": surface, "cases": len(results), "seconds": round(seconds, 1),
        "answered": verdicts["answered"], "5xx": verdicts["5xx"], "hangs": verdicts["hang"],
        "closed": verdicts["closed"], "statuses": dict(sorted(Counter(str(r.status) for r in results).items())),
        "uvicorn_400": sum(1 for r in results if r.excerpt == UVICORN_400),
        "by_mutator": {m: dict(Counter(str(r.status) for r in results if r.case.mutator == m)) for m in MUTATORS},
        "failures": [{"verdict": r.verdict, "status": r.status, "case": r.case.describe()[:400],
                      "answer": r.excerpt[:200].decode("utf-8", "replace")} for r in bad[:20]],
        "failures_total": len(bad), "still_serves": still_serves,
        "p99_s": round(sorted(r.seconds for r in results)[int(0.99 * (len(results) - 1))], 4) if results else None,
    }


def docs_table(out: dict) -> str:
    rows = "\n".join(
        f"| {s['surface']} | {s['cases']} | {s['answered']} | **{s['5xx']}** | **{s['hangs']}** | {s['closed']} | "
        f"{', '.join(f'{k}×{v}' for k, v in s['statuses'].items())} | {s['uvicorn_400']} | "
        f"{'yes' if s['still_serves'] else '**no**'} | {s['seconds']} |" for s in out["surfaces"])
    rss = ", ".join(f"{k} {v:.0f} MiB" for k, v in out["peak_rss_mib"].items())
    return f"""{SECTION}

`{out['command']}` (raw results: `bench/results/fuzz.json`; run of {out['date']} on {out['machine']}, load average
{out['load_average']} at the start). Each surface gets {out['cases_per_surface']} cases drawn from seed {out['seed']}
(the same seed sends the same bytes), {out['concurrency']} at a time, each a valid request of the surface mutated by
one of {len(MUTATORS)} mutators in turn ({', '.join(MUTATORS)}), sent as raw bytes over a socket; a hang is no answer
within {out['timeout_s']:g} s. "uvicorn 400" counts requests that are not HTTP at all (a control character in a header,
a raw byte in the path): uvicorn answers those itself with a plain-text 400 before any of our code runs. Every other
error was an OpenAI error object (Anthropic's, with the same `error.message` and `error.type`, on /v1/messages).
"Still serves" is a normal completion answered 200 after the surface's run.

| surface | cases | answered | 5xx | hangs | closed unanswered | statuses | uvicorn 400 | still serves | seconds |
|---|---:|---:|---:|---:|---:|---|---:|---|---:|
{rows}

Peak RSS: {rss}. The suite runs the same generator with seed 0 (`tests/fuzz/test_byte_fuzz.py`: 192 gateway-API,
136 gateway-surfaces (Anthropic Messages and Responses), 68 admin, 68 registration and 136 edge-node cases, a few
seconds).
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2000, help="cases per surface")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds without an answer that make a hang")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    model = build_model()
    load = os.getloadavg()[0]
    procs = start_all(WORK, model)
    try:
        gw, reg, edge = procs["gateway"], procs["gateway-registration"], procs["edge-node"]
        node_url = procs["edge-backend"].health_url.removesuffix("/health")
        target = Target(API_KEY, ADMIN_KEY, EDGE_TOKEN, node_url)
        where = {"gateway-api": gw, "gateway-surfaces": gw, "gateway-admin": gw, "edge-registration": reg, "edge-node": edge}
        surfaces = []
        for surface in SURFACES:
            server = where[surface]
            results, seconds = asyncio.run(fuzz(surface, port_of(server), target, args))
            base = server.health_url.rsplit("/", 1)[0]
            if surface == "edge-node":
                ok = normal_request(base, "/v1/chat/completions",
                                    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, {})
            else:
                ok = normal_request(base, "/v1/chat/completions",
                                    {"model": "auto", "messages": [{"role": "user", "content": "hi"}]},
                                    {"authorization": f"Bearer {API_KEY}"})
            s = summarize(surface, results, seconds, ok)
            surfaces.append(s)
            print(f"{surface}: {s['cases']} cases, {s['answered']} answered, 5xx {s['5xx']}, hangs {s['hangs']}, "
                  f"closed {s['closed']}, statuses {s['statuses']}, still serves: {ok} ({seconds:.1f} s)", flush=True)
            for f in s["failures"]:
                print("  ", f, flush=True)
        rss = {name: peak_rss_mib(p.pid) for name, p in procs.items()}
    finally:
        for p in procs.values():
            p.stop()
    out = {"command": "python -m bench.fuzz " + shlex.join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                                time.gmtime()),
           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "load_average": round(load, 2),
           "seed": args.seed, "cases_per_surface": args.cases, "concurrency": args.concurrency,
           "timeout_s": args.timeout, "surfaces": surfaces, "peak_rss_mib": {k: round(v, 1) for k, v in rss.items()}}
    RESULT_FILE.parent.mkdir(parents=True, exist_ok=True)
    RESULT_FILE.write_text(json.dumps(out, indent=1) + "\n")
    print(f"results: {RESULT_FILE}")
    if args.write_docs:
        write_section(SECTION, docs_table(out), DOCS)
        print(f"wrote the table to {DOCS}")
    failed = sum(s["failures_total"] for s in surfaces) + sum(not s["still_serves"] for s in surfaces)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
