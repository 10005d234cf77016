"""The docs section of bench/edge, from its result file only: every figure in it was measured or read by the run.

    .venv/bin/python -m bench.edge.render [bench/results/edge.json]    (rewrites the docs section from the file)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from bench.report import RESULTS, machine_line, write_section

__all__ = ["goals", "render"]

SERVERS = ("edge-node", "llama-server", "llama_cpp.server")
TOK_GOAL, TTFT_GOAL = 0.9, 1.2  # edge-node vs llama-server: >= 0.9x its tokens/s, TTFT p99 <= 1.2x its


def _f(x: float, nd: int = 0) -> str:
    return "-" if x != x else f"{x:,.{nd}f}"


def goals(model: dict) -> list[dict]:
    """Per concurrency: edge-node / llama-server tokens/s and TTFT p99, and whether the goals hold."""
    out = []
    for c, e in model["cells"]["edge-node"].items():
        ls = model["cells"]["llama-server"][c]
        tok = e["tok_s"] / ls["tok_s"] if ls["tok_s"] else float("nan")
        ttft = e["ttft_p99_ms"] / ls["ttft_p99_ms"] if ls["ttft_p99_ms"] else float("nan")
        cpu = e["cpu_ms_per_token"] / ls["cpu_ms_per_token"] if ls["cpu_ms_per_token"] else float("nan")
        out.append({"streams": int(c), "tok_ratio": tok, "ttft_p99_ratio": ttft, "cpu_ratio": cpu,
                    "met": tok >= TOK_GOAL and ttft <= TTFT_GOAL})
    return out


def _model(m: dict) -> list[str]:
    lines = [f"### {m['title']} (`{m['file']}`, {m['size_mib']} MiB)", "",
             "| streams | server | tokens/s: median (min..max) | vs llama-server | TTFT p50 / p99 ms "
             "| TPOT p50 / p99 ms | CPU ms/token | failed |",
             "|---:|---|---|---:|---|---|---:|---:|"]
    cells = m["cells"]
    for c in cells["edge-node"]:
        ref = cells["llama-server"][c]["tok_s"]
        for name in SERVERS:
            x = cells[name][c]
            lines.append(f"| {c} | {name} | {_f(x['tok_s'], 1)} ({_f(x['tok_s_min'], 1)}..{_f(x['tok_s_max'], 1)}) "
                         f"| {x['tok_s'] / ref:.2f}x | {_f(x['ttft_p50_ms'])} / {_f(x['ttft_p99_ms'])} "
                         f"| {_f(x['tpot_p50_ms'], 1)} / {_f(x['tpot_p99_ms'], 1)} | {x['cpu_ms_per_token']:.2f} "
                         f"| {x['failed']} of {x['requests']} |")
    rss = []
    for name in SERVERS:
        procs = m["peak_rss_mib"].get(name, {})
        rss.append(f"{name} {sum(procs.values()):,.0f} MiB" + (f" ({len(procs)} processes)" if len(procs) > 1 else ""))
    k = m["kernel_cpu_ms_per_token"]
    lines += ["", "Peak RSS (VmHWM, model loading included): " + ", ".join(rss) + ". Bare `llama_decode`, CPU ms per "
              "token on one thread (no sampling, no server): " + " | ".join(f"batch {b}: {v:.2f}" for b, v in k.items())
              + "."]
    if m.get("prompt_tokens_seen"):
        lines += ["", "Prompt tokens each server made of the same chat message (checked equal before measuring): "
                  + ", ".join(f"{k} {'-' if v is None else v}" for k, v in m["prompt_tokens_seen"].items()) + "."]
    g = goals(m)
    lines += ["", "edge-node vs llama-server: " + "; ".join(
        f"{x['streams']} stream{'s' if x['streams'] > 1 else ''}: {x['tok_ratio']:.2f}x tokens/s, "
        f"TTFT p99 {x['ttft_p99_ratio']:.2f}x, CPU per token {x['cpu_ratio']:.2f}x" for x in g)
        + f" — goal (>= {TOK_GOAL}x, <= {TTFT_GOAL}x) **{'met' if all(x['met'] for x in g) else 'not met'}"
        + ("" if all(x['met'] for x in g) else " at " + ", ".join(str(x['streams']) for x in g if not x['met'])
           + " streams") + "**."]
    return lines


def render(report: dict, out: Path) -> str:
    a = report["args"]
    b = report["versions"]["llama_server_build"]
    pressure = [rd["cpu_pressure_avg10"] for m in report["models"] for by in m["rounds"].values()
                for rs in by.values() for rd in rs if rd.get("cpu_pressure_avg10") is not None]
    rel = out.relative_to(out.parents[2]) if len(out.parents) > 2 else out
    lines = [
        f"Command: `.venv/bin/{report['command']}` "
        f"(raw results: `{rel}`; {report['wall_s'] / 60:.0f} min here; builds `llama-server` once, see "
        "`python -m bench.anchors`).", "",
        f"Three servers on the same GGUF file, up side by side: `edge-node serve` (ours), llama.cpp's `llama-server` "
        f"(built from the llama.cpp vendored in llama-cpp-python {report['versions']['llama_cpp_python']}'s source "
        f"package with `{' '.join(b['cmake_args'])}`, {b['compiler']}) with `-np {max(a['streams'])}` continuous "
        f"batching, and llama-cpp-python's `llama_cpp.server` (`--interrupt_requests false`; one request at a time). "
        f"All: one llama.cpp thread (`-t 1 -tb 1`), 512-token batches, {a['ctx']} tokens of context per slot, the "
        "model's chat template (Gemma's base model has none: llama.cpp's built-in `gemma` template for all three; "
        "llama-server needs `--no-jinja` to read that name as a built-in template). Each round: N streams, each sending "
        f"{a['requests']} streaming chat requests back to back, {a['tokens']} output tokens each (end-of-generation "
        "tokens banned by `logit_bias`, so every server does the same work; temperature 0.7, top_k 40, top_p 1, "
        "min_p 0.05, distinct prompts and seeds); the three servers take turns, order rotating, "
        f"{a['repeats']} repeats. Tokens/s: completion tokens (from the stream's usage; llama_cpp.server sends none, "
        "so it is credited max_tokens for a request that ended on length) / the round's wall time. TTFT: to the "
        "first chunk with content. TPOT: (last content chunk - first) / (tokens - 1) per request. p50/p99 over every "
        "request of every repeat. CPU: the server's user + system time per token.", "",
        machine_line(report["machine_before"], report["machine_after"])
        + (f" CPU pressure (PSI some avg10, the share of time runnable tasks waited for a core) after each round: "
           f"median {statistics.median(pressure):.0f}%, max {max(pressure):.0f}%." if pressure else ""), ""]
    for m in report["models"]:
        lines += _model(m) + [""]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS / "edge.json"
    write_section("## Edge node (bench/edge)", render(json.loads(path.read_text()), path.resolve()))
