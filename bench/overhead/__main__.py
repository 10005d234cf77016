"""bench/overhead: the gateway's own cost, side by side with calling the upstream directly, a bare relay and LiteLLM.

    .venv/bin/python -m bench.overhead [--duration 10] [--rounds 8] [--rate 200] [--variants semantic,2w]
                                       [--baseline-tree PATH] [--skip-litellm] [--cpu-latency-us N]
                                       [--guest-halt-poll-ns N] [--no-docs]

One run starts an instant OpenAI-compatible upstream and every target (bench/overhead/targets.py) at once, then
for each mode (JSON, SSE), see bench/overhead/measure.py:
1. the maximum requests/s at concurrency 16 (wrk) and each target's CPU per request (its whole process tree),
   `--repeats` passes over all targets in rotating order, the median reported;
2. the latency at `--rate` (200 requests/s), open loop, targets interleaved round by round; only targets whose
   maximum is at least twice that rate take part (LiteLLM's is not: at 200/s it would measure its queue);
3. the latency at LiteLLM's sustainable rate, half its measured maximum, for every target, LiteLLM included,
   interleaved the same way: the fair comparison of added latency.
`--cpu-latency-us N` holds a PM QoS request (/dev/cpu_dma_latency) and `--guest-halt-poll-ns N` sets the KVM guest's
halt polling for the run (this VM boots with 0, Linux's default is 200000), restored afterwards: how idle vCPUs
sleep moves every added latency here, and the run records what it ran under. Writes bench/results/overhead*.json
and, unless --no-docs or an idle knob is set, the "## Gateway overhead (bench/overhead)" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench.anchors import ensure_litellm
from bench.overhead.measure import fixed_rate, max_rate
from bench.overhead.render import render
from bench.overhead.targets import litellm_target, make_targets
from bench.procs import Server, free_port, peak_rss_mib, tree_peak_rss_mib
from bench.report import RESULTS, machine_facts, publish
from bench.versions import LITELLM
from tiergate.core.paths import tiergate_home

SECTION = "## Gateway overhead (bench/overhead)"


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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=int, default=10, help="seconds per measurement (split across rounds)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rate", type=float, default=200)
    ap.add_argument("--rounds", type=int, default=8, help="interleaved open-loop rounds (latency)")
    ap.add_argument("--repeats", type=int, default=3, help="passes of the max-rate phase (median reported)")
    ap.add_argument("--variants", default="semantic,2w", help="extra tiergate targets: semantic, 2w, costs, router (empty: none)")
    ap.add_argument("--baseline-tree", action="append", default=[], help="also run tiergate from this checkout "
                    "(e.g. a worktree of the commit before a change); may be given several times")
    ap.add_argument("--skip-litellm", action="store_true")
    ap.add_argument("--cpu-latency-us", type=int, default=None,
                    help="hold this PM QoS CPU latency (/dev/cpu_dma_latency) during the run; e.g. 0")
    ap.add_argument("--guest-halt-poll-ns", type=int, default=None,
                    help="KVM guests: poll this long before halting an idle vCPU during the run; Linux's default 200000")
    ap.add_argument("--out", default=None, help="result file (default: bench/results/overhead[-knobs].json)")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    args.variants = [v for v in args.variants.split(",") if v]
    if not shutil.which("wrk"):
        sys.exit("bench/overhead needs wrk: apt-get install wrk")
    before = machine_facts()
    with cpu_latency(args.cpu_latency_us), guest_halt_poll(args.guest_halt_poll_ns):
        during = machine_facts()
        report = run(args)
    report |= {"machine_before": before, "machine_during": during, "machine_after": machine_facts()}
    name = "overhead"
    if args.cpu_latency_us is not None:
        name += f"-cpu-latency-{args.cpu_latency_us}us"
    if args.guest_halt_poll_ns is not None:
        name += f"-halt-poll-{args.guest_halt_poll_ns}ns"
    out = Path(args.out) if args.out else RESULTS / f"{name}.json"
    publish(report, out, render, SECTION if not args.no_docs and name == "overhead" else None)


def run(args) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="tg-overhead-"))
    py = sys.executable
    up_port = free_port()
    upstream = Server("upstream", [py, "-m", "tests.support.instant_upstream", "--port", str(up_port)],
                      f"http://127.0.0.1:{up_port}/health", cpus={1}, log=tmp / "upstream.log").start()
    os.sched_setaffinity(0, {1})  # the open-loop client: beside the upstream, away from the servers under test
    embedder = tiergate_home() / "embedder"
    targets = make_targets(args, py, tmp, up_port, embedder if (embedder / "model.onnx").exists() else None)
    if not args.skip_litellm:
        targets.append(litellm_target(ensure_litellm(log=lambda m: print(m, file=sys.stderr)), tmp, up_port))
    try:
        for t in targets:
            if t.server:
                t.server.start(timeout_s=300)
        print("max rate (wrk, closed loop):", file=sys.stderr)
        max_rate(targets, args.duration, args.concurrency, args.repeats, tmp)
        modes = ("json", "sse")
        able = [t for t in targets if all(t.results[m]["max_rps"] >= 2 * args.rate for m in modes)]
        print(f"latency at {args.rate:g} req/s ({', '.join(t.name for t in able)}):", file=sys.stderr)
        fixed_rate(able, dict.fromkeys(modes, args.rate), args.duration, args.rounds, "at_rate")
        lite = next((t for t in targets if t.name == "litellm"), None)
        if lite is not None:
            rates = {m: round(lite.results[m]["max_rps"] / 2, 1) for m in modes}
            print(f"latency at LiteLLM's half maximum {rates} (all targets):", file=sys.stderr)
            fixed_rate(targets, rates, args.duration, args.rounds, "at_litellm_half")
        for t in targets:
            t.results["peak_rss_mib"] = tree_peak_rss_mib(t.server.pid) if t.server else None
    finally:
        for t in targets:
            if t.server:
                t.server.stop()
        upstream_rss = peak_rss_mib(upstream.pid)
        upstream.stop()
    return {"command": "python -m bench." + " ".join(["overhead", *sys.argv[1:]]), "args": vars(args),
            "litellm": LITELLM if not args.skip_litellm else None, "upstream_peak_rss_mib": upstream_rss,
            "targets": [{"target": t.name, "note": t.note, **t.results} for t in targets],
            "when": time.strftime("%Y-%m-%d %H:%M:%S")}


if __name__ == "__main__":
    main()
