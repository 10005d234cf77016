"""What tracing costs the gateway: the in-process overhead benchmark with tracing off, on, and (optionally) on
another checkout without tracing code at all, alternated round by round.

    .venv/bin/python -m bench.overhead.tracing [--rounds 3] [--base PATH] [--write-docs]

Each configuration runs `bench.overhead.inprocess` in its own process (its best batch of 300 requests: wall and
CPU ms per request, and the gateway's own time, `x-tiergate-overhead-ms`); "on" exports every span to a JSON-lines
file through the SDK's batch processor (`TIERGATE_TRACES_FILE`), which costs what an OTLP export costs minus the
network. The best of the rounds is reported per configuration, with each process's peak RSS. Results go to
bench/results/tracing-overhead.json and, with --write-docs, to docs/benchmarks.md ("## Tracing overhead").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.report import REPO, RESULTS, write_section

RESULT_FILE = RESULTS / "tracing-overhead.json"
SECTION = "## Tracing overhead (bench/overhead/tracing)"
_LINE = re.compile(r"best wall (?P<wall>[\d.]+) ms/request, best CPU (?P<cpu>[\d.]+) ms/request; .* p50 of the last "
                   r"batch (?P<own>[\d.]+) ms")


def run_once(tree: Path | None, traces: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIERGATE_OTLP", "OTEL_", "TIERGATE_TRACES"))}
    if traces is not None:
        env["TIERGATE_TRACES_FILE"] = str(traces)
    argv = ["inprocess"] + (["--tree", str(tree)] if tree else [])
    code = ("import resource, runpy, sys; sys.argv = " + repr(argv) + "; "
            "runpy.run_module('bench.overhead.inprocess', run_name='__main__'); "
            "print('peak_rss_kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=REPO).stdout
    m, rss = _LINE.search(out), re.search(r"peak_rss_kib (\d+)", out)
    if m is None or rss is None:
        raise RuntimeError(f"unexpected output from bench.overhead.inprocess: {out[-500:]}")
    return {"wall_ms": float(m["wall"]), "cpu_ms": float(m["cpu"]), "own_ms": float(m["own"]),
            "peak_rss_mib": round(int(rss[1]) / 1024, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--base", type=Path, help="a checkout without tracing, measured alongside")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    spans = Path(tempfile.mkdtemp(prefix="tg-tracing-")) / "spans.jsonl"
    configs: dict[str, tuple[Path | None, Path | None]] = {"off": (None, None), "on (file export)": (None, spans)}
    if args.base:
        configs = {"without tracing code": (args.base, None), **configs}
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    load = os.getloadavg()[0]
    for r in range(args.rounds):
        for name, (tree, traces) in configs.items():
            res = run_once(tree, traces)
            runs[name].append(res)
            print(f"round {r + 1} {name}: wall {res['wall_ms']} ms, CPU {res['cpu_ms']} ms, own {res['own_ms']} ms",
                  flush=True)
    best = {name: {k: min(x[k] for x in rs) for k in ("wall_ms", "cpu_ms", "own_ms")} | {
        "peak_rss_mib": max(x["peak_rss_mib"] for x in rs)} for name, rs in runs.items()}
    n_spans = sum(1 for _ in spans.open()) if spans.exists() else 0
    out = {"command": "python -m bench.overhead.tracing " + shlex.join(sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_average": round(load, 2),
           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "rounds": args.rounds, "best": best,
           "runs": runs, "spans_exported": n_spans}
    RESULT_FILE.parent.mkdir(parents=True, exist_ok=True)
    RESULT_FILE.write_text(json.dumps(out, indent=1) + "\n")
    rows = "\n".join(f"| {name} | {b['cpu_ms']:.3f} | {b['wall_ms']:.3f} | {b['own_ms']:.3f} | {b['peak_rss_mib']:.0f} |"
                     for name, b in best.items())
    off, on = best["off"], best["on (file export)"]
    text = f"""{SECTION}

`{out['command']}` (raw results: `bench/results/tracing-overhead.json`; {out['date']}, {out['machine']}, load average
{out['load_average']} at the start: a shared machine, so the best of {args.rounds} alternated rounds is compared).
`bench.overhead.inprocess` drives the gateway app back to back against an instant upstream, in one process; best
batch of 300 requests per round. "On" exports every span ({n_spans} in all) to a file through the SDK's batch
processor.

| tracing | CPU ms/request | wall ms/request | gateway's own time p50 (ms) | peak RSS (MiB) |
|---|---:|---:|---:|---:|
{rows}

Off, a request pays one flag test per would-be span (no middleware is installed at all). On, it pays
{on['cpu_ms'] - off['cpu_ms']:+.3f} ms of CPU per request over off for its spans and their export.
"""
    if args.write_docs:
        write_section(SECTION, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
