"""The docs section of bench/overhead, from its result file only: every figure, machine facts included, is the run's.

    .venv/bin/python -m bench.overhead.render [bench/results/overhead.json]    (rewrites the docs section from the file)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from bench.report import RESULTS, machine_line, write_section

__all__ = ["render"]

MODES = ("json", "sse")


def _r(a: float | None, b: float | None) -> float:
    """a / b, nan when either is missing (a target that answered nothing in a phase)."""
    return a / b if a is not None and b else float("nan")


def _c(x: float | None) -> float:
    return float("nan") if x is None else x


def _spread(m: dict) -> str:
    runs = m.get("cpu_ms_per_req_runs") or []
    med = _c(m.get("cpu_ms_per_req"))
    return f"{med:.3f} ({min(runs):.3f}..{max(runs):.3f})" if len(runs) > 1 else f"{med:.3f}"


def _added(t: dict, d: dict, mode: str, phase: str) -> tuple[str, str]:
    """Added p50 over direct (pooled), and per round: median (min..max)."""
    m, dm = t[mode].get(phase), d[mode].get(phase)
    if not m or not dm:
        return "-", "-"
    pooled = f"{m['p50_ms'] - dm['p50_ms']:+.2f}"
    if t["target"] == "direct":
        return pooled, "-"
    diffs = [a - b for a, b in zip(m["round_p50_ms"], dm["round_p50_ms"], strict=True)]
    return pooled, f"{statistics.median(diffs):+.2f} ({min(diffs):+.2f}..{max(diffs):+.2f})"


def _latency_table(report: dict, phase: str) -> list[str]:
    by = {t["target"]: t for t in report["targets"]}
    d = by["direct"]
    lines = ["| target | mode | rate req/s | p50 / p99 ms | added p50 ms vs direct | per round: median (min..max) "
             "| errors |", "|---|---|---:|---|---|---|---:|"]
    for t in report["targets"]:
        for mode in MODES:
            m = t[mode].get(phase)
            if not m:
                continue
            pooled, rounds = _added(t, d, mode, phase)
            lines.append(f"| {t['target']} | {mode} | {m['rate']:g} | {m['p50_ms']:.2f} / {m['p99_ms']:.2f} | {pooled} "
                         f"| {rounds} | {m['errors']} |")
    return lines


def render(report: dict, out: Path) -> str:
    a = report["args"]
    by = {t["target"]: t for t in report["targets"]}
    rel = out.relative_to(out.parents[2]) if len(out.parents) > 2 else out
    idle = report["machine_during"]
    spread = f"median of {a.get('repeats', 1)} passes" if a.get("repeats", 1) > 1 else "one pass"
    lines = [
        f"Command: `.venv/bin/{report['command']}` (raw results: `{rel}`; needs `wrk`"
        + (f"; creates `.venv-litellm` with LiteLLM {report['litellm']} on first use, see `python -m bench.anchors`"
           if report["litellm"] else "") + ").", "",
        "Every target up at once in front of the same instant upstream (`tests/support/instant_upstream.py`); servers under "
        "test on CPU 0 (the 2-worker gateway on both), upstream and load generators on CPU 1. Max req/s: wrk, "
        f"{a['concurrency']} connections, {a['duration']} s per target and mode, {spread} over all targets in rotating "
        "order (CPU ms/req: median, with min..max). Latency: open loop at a fixed rate, "
        f"{a['rounds']} rounds of {a['duration'] / a['rounds']:g} s per target, the targets interleaved (rotating "
        "order); a target takes part in a fixed-rate phase only if its maximum is at least twice the rate. CPU: the "
        "target's process tree, user + system, per request during the max-rate run.", "",
        machine_line(report["machine_before"], report["machine_after"])
        + f" During the run: guest_halt_poll_ns {idle['guest_halt_poll_ns']}"
        + (f", PM QoS CPU latency {a['cpu_latency_us']} us" if a.get("cpu_latency_us") is not None else "") + ".", "",
        "| target | mode | max req/s | CPU ms/req | peak RSS MiB | what it is |", "|---|---|---:|---:|---:|---|"]
    notes = {"direct": "the upstream itself", "passthrough": "uvicorn + Starlette + aiohttp relaying bytes",
             "tiergate": "auth, classification, policy, exact cache (miss + store), relay",
             "tiergate+semantic": "as tiergate, semantic cache on: each request embeds its prompt (miss path)",
             "tiergate-2w": "as tiergate, 2 uvicorn workers, both cores",
             "tiergate+costs": "as tiergate, every answer priced, budgeted (reserve, settle) and in the spend ledger",
             "tiergate+router": "as tiergate, the learned router's features and prediction before every decision",
             "litellm": f"LiteLLM {report['litellm']} proxy, 1 worker"}
    for t in report["targets"]:
        for mode in MODES:
            m = t[mode]
            cpu = f"{m['cpu_ms_per_req']:.3f}" if m["cpu_ms_per_req"] is not None else "-"
            if len(m.get("cpu_ms_per_req_runs", [])) > 1:
                cpu += f" ({min(m['cpu_ms_per_req_runs']):.3f}..{max(m['cpu_ms_per_req_runs']):.3f})"
            rss = f"{sum(t['peak_rss_mib'].values()):.0f}" if t.get("peak_rss_mib") else "-"
            lines.append(f"| {t['target']} | {mode} | {m['max_rps']:.0f} | {cpu} | {rss} | "
                         f"{notes.get(t['target'], t.get('note') or '')} |")
    lines += ["", f"Latency at {a['rate']:g} requests/s:", ""] + _latency_table(report, "at_rate")
    if "litellm" in by:
        lines += ["", "Latency at LiteLLM's sustainable rate (half its measured maximum), every target:", ""]
        lines += _latency_table(report, "at_litellm_half")
    facts = []
    if "litellm" in by and "tiergate" in by:
        facts.append("tiergate / LiteLLM max req/s: " + ", ".join(
            f"{_r(by['tiergate'][m]['max_rps'], by['litellm'][m]['max_rps']):.1f}x ({m})" for m in MODES)
            + "; CPU per request: " + ", ".join(
            f"{_r(by['litellm'][m]['cpu_ms_per_req'], by['tiergate'][m]['cpu_ms_per_req']):.0f}x less ({m})"
            for m in MODES))
    if "tiergate-2w" in by and "tiergate" in by:
        facts.append("2 workers / 1: " + ", ".join(
            f"{_r(by['tiergate-2w'][m]['max_rps'], by['tiergate'][m]['max_rps']):.2f}x req/s at "
            f"{_c(by['tiergate-2w'][m]['cpu_ms_per_req']):.3f} vs {_c(by['tiergate'][m]['cpu_ms_per_req']):.3f} ms CPU ({m})"
            for m in MODES))
    if "tiergate+semantic" in by and "tiergate" in by:
        facts.append("semantic cache on, miss path: " + ", ".join(
            f"{_c(by['tiergate+semantic'][m]['cpu_ms_per_req']) - _c(by['tiergate'][m]['cpu_ms_per_req']):+.3f} ms CPU "
            f"per request, {_r(by['tiergate+semantic'][m]['max_rps'], by['tiergate'][m]['max_rps']):.2f}x the req/s ({m})"
            for m in MODES))
    if "tiergate+costs" in by and "tiergate" in by:
        facts.append("cost bookkeeping (prices, budget reservation and settlement, spend ledger, savings split): "
                     + ", ".join(f"{_c(by['tiergate+costs'][m]['cpu_ms_per_req']) - _c(by['tiergate'][m]['cpu_ms_per_req']):+.3f}"
                                 f" ms CPU per request ({m})" for m in MODES))
    if "tiergate+router" in by and "tiergate" in by:
        facts.append("learned router (features and one prediction per request): "
                     + ", ".join(f"{_c(by['tiergate+router'][m]['cpu_ms_per_req']) - _c(by['tiergate'][m]['cpu_ms_per_req']):+.3f}"
                                 f" ms CPU per request ({m})" for m in MODES))
    if "passthrough" in by:  # what each gateway adds over relaying bytes: SSE relays more chunks than JSON
        facts.append("CPU ms per request added over the passthrough: " + "; ".join(
            f"{name} " + ", ".join(f"{_c(t[m]['cpu_ms_per_req']) - _c(by['passthrough'][m]['cpu_ms_per_req']):.3f} "
                                   f"({m})" for m in MODES)
            for name, t in by.items() if name.startswith("tiergate") and t.get(MODES[0], {}).get("cpu_ms_per_req")))
    for name, t in by.items():
        if name.startswith("tiergate@"):
            facts.append(f"{name} ({t['note']}) vs tiergate, CPU ms per request, median (min..max) of the passes: "
                         + "; ".join(f"{m} {_spread(t[m])} then, {_spread(by['tiergate'][m])} now "
                                     f"({_r(by['tiergate'][m]['cpu_ms_per_req'], t[m]['cpu_ms_per_req']) - 1:+.1%})"
                                     for m in MODES))
    lines += [""] + [f"- {f}" for f in facts] + ["", f"Upstream peak RSS {report['upstream_peak_rss_mib']:.0f} MiB."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS / "overhead.json"
    write_section("## Gateway overhead (bench/overhead)", render(json.loads(path.read_text()), path.resolve()))
