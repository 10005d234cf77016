"""bench/overhead and bench/cloud write their docs sections from the result file alone (structure only)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.cloud.__main__ import summarise
from bench.cloud.render import goals
from bench.cloud.render import render as render_cloud
from bench.overhead.render import render as render_overhead
from bench.report import machine_facts

FACTS = machine_facts()


def _mode(rps: float, cpu: float | None, p50: float, rate: float = 200) -> dict:
    phase = {"rate": rate, "p50_ms": p50, "p99_ms": 2 * p50, "round_p50_ms": [p50, p50 + 0.1], "errors": 0}
    return {"max_rps": rps, "cpu_ms_per_req": cpu, "non2xx": 0, "at_rate": phase,
            "at_litellm_half": phase | {"rate": 40}}


def test_overhead_report(tmp_path: Path) -> None:
    targets = [{"target": name, "note": note, "json": _mode(rps, cpu, p50), "sse": _mode(rps / 2, cpu, p50),
                "peak_rss_mib": rss}
               for name, note, rps, cpu, p50, rss in (
                   ("direct", "", 9000, None, 0.4, None), ("tiergate", "", 3000, 0.3, 1.0, {"tiergate[1]": 150.0}),
                   ("tiergate@abc", "the gateway from /x", 2900, 0.31, 1.1, {"tiergate[2]": 140.0}),
                   ("tiergate+semantic", "", 190, 5.0, 9.0, {"tiergate[3]": 250.0}),
                   ("tiergate-2w", "", 4000, 0.35, 1.0, {"tiergate[4]": 150.0, "tiergate[5]": 150.0}),
                   ("litellm", "", 90, 10.0, 20.0, {"litellm[6]": 400.0}))]
    targets[3]["json"].pop("at_rate")  # cannot take twice the rate: not in that phase
    report = {"command": "python -m bench.overhead", "args": {"concurrency": 16, "duration": 10, "rounds": 8,
              "rate": 200, "cpu_latency_us": None}, "litellm": "1.0", "upstream_peak_rss_mib": 40.0,
              "targets": targets, "machine_before": FACTS, "machine_during": FACTS, "machine_after": FACTS}
    text = render_overhead(json.loads(json.dumps(report)), tmp_path / "bench" / "results" / "overhead.json")
    assert "bench/results/overhead.json" in text and "LiteLLM's sustainable rate" in text
    assert "tiergate / LiteLLM max req/s: 33.3x (json)" in text
    assert "tiergate@abc (the gateway from /x) vs tiergate, CPU ms per request" in text
    assert "| tiergate+semantic | json | 200 |" not in text and "| tiergate+semantic | sse | 200 |" in text


def _run(hits: list[float], done: list[float], load: list[float]) -> dict:
    return {"elapsed_s": 10.0, "requests": [{"ttft_s": 0.1, "tokens": 16, "total_s": 0.2}] * 9 + [{"error": "HTTP 500"}],
            "servers": [{"queries": 100.0, "hits": h, "done": d, "mean_load": ld}
                        for h, d, ld in zip(hits, done, load, strict=True)]}


def test_cloud_report(tmp_path: Path) -> None:
    rows = {"round-robin": summarise([_run([20, 20], [5, 5], [4, 4])]),
            "vllm-router-cache-aware": summarise([_run([30, 30], [6, 4], [5, 3])]),
            "tiergate-prefix": summarise([_run([40, 40], [5, 5], [4.5, 3.5]), _run([40, 42], [5, 5], [4, 4])]),
            "unbounded-affinity": summarise([_run([42, 42], [8, 2], [6, 2])])}
    assert rows["tiergate-prefix"]["failed"] == 2 and rows["tiergate-prefix"]["requests"] == 20
    g = goals(rows)
    assert g["met"] and round(g["vs_router"], 2) == 1.35
    report = {"command": "python -m bench.cloud", "args": {"kv_blocks": 192, "concurrency": 8, "requests": 10,
              "rounds": 2, "rows": list(rows)}, "vllm_router": "0.1.17", "model": "tiny-llama",
              "machine_before": FACTS, "machine_after": FACTS, "wall_s": 600,
              "pools": [{"servers": 2, "regimes": {"even32": rows}, "rounds": {"even32": {}},
                         "peak_rss_mib": {"vllm 0": {"a[1]": 1000.0}, "vllm 1": {"a[2]": 1100.0}}}],
              "skipped": [{"servers": 4, "need_mib": 9000, "available_mib": 5000}]}
    report["pools"][0]["rounds"] = {"even32": {"tiergate-prefix": [{"front_peak_rss_mib": {"t[3]": 120.0}}]}}
    text = render_cloud(report, tmp_path / "bench" / "results" / "cloud.json")
    assert "tiergate 120 MiB" in text
    assert "| failed |" in text and "2 of 20" in text and "**met**" in text
    assert "**4 servers: not run**" in text
