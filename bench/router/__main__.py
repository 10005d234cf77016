"""Router benchmark: how the complexity score ranks kinds of prompts it never saw, what it costs, where it sends.

    .venv/bin/python -m bench.router [--boot 2000] [--skip-litellm] [--write-docs] [--write-traffic FILE]
    .venv/bin/python -m bench.router --from-json bench/results/router.json [--write-docs]

On ../shared/data/routing/ (mmlu_dev, alpaca_eval_dev's four subsets, arena_bench_dev: six sources), in one run:
- leave-one-source-out APGR per source with bootstrap 95 % intervals, the design chosen inside each training
  set (bench/router/loso.py), beside prompt length, its reverse, random, the previous design retrained, the
  previous shipped model and LiteLLM's rule-based router (its own virtualenv, `.venv-litellm`, pinned in
  bench/versions.py);
- ablations of the shipped design (outer folds only), MMLU cross-validated by subject (optimistic);
- the cloud share per source: of the default policy on all prompts with the shipped model (what
  `tiergate policy simulate` reports), and of complexity >= 0.7 on each source under its held-out model;
- classification latency in a fresh process holding what the gateway holds (bench/router/latency.py).
Every number printed is computed in the run, or read from the JSON it wrote (`--from-json`, named in the
output). Raw results: bench/results/router.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import REPO, RESULTS, write_section
from bench.router import latency, loso, traffic
from bench.router.report import HEADING, markdown
from bench.versions import LITELLM as LITELLM_VERSION
from bench.versions import LITELLM_SPEC
from tiergate.complexity.features import last_user_text
from tiergate.complexity.model import DEFAULT_MODEL_FILE, ComplexityModel
from tiergate.complexity.select import GRID
from tiergate.complexity.train import one_blas_thread


def _shared_routing_data() -> Path:
    """../shared/data/routing beside the checkout; from a git worktree, beside the main checkout."""
    here = REPO.parent / "shared" / "data" / "routing"
    if here.is_dir():
        return here
    common = subprocess.run(["git", "rev-parse", "--git-common-dir"], cwd=REPO, capture_output=True, text=True)
    main_checkout = Path(REPO, common.stdout.strip()).resolve().parent if common.returncode == 0 else REPO
    return main_checkout.parent / "shared" / "data" / "routing"


DATA = _shared_routing_data()
RESULT_FILE = RESULTS / "router.json"
DOCS = REPO / "docs" / "benchmarks.md"
LITELLM_VENV = REPO / ".venv-litellm"


def _litellm_python() -> Path:
    """The shared LiteLLM virtualenv, created or brought to the pinned version."""
    py = LITELLM_VENV / "bin" / "python"
    if not py.exists():
        print(f"creating {LITELLM_VENV} with {LITELLM_SPEC} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
    probe = subprocess.run([str(py), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or probe.stdout.strip() != LITELLM_VERSION:
        subprocess.run([str(py), "-m", "pip", "install", "-q", LITELLM_SPEC], check=True)
    return py


def litellm_scores(prompts: list[str]) -> dict[str, Any]:
    py = _litellm_python()
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "prompts.json", Path(tmp) / "scores.json"
        src.write_text(json.dumps(prompts))
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
        subprocess.run([str(py), str(Path(__file__).parent / "litellm_score.py"), str(src), str(dst)], check=True,
                       env=env, stdout=subprocess.DEVNULL)
        return json.loads(dst.read_text())


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 3)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    p = loso.prepare(args.data)
    d = p.data
    _log(f"featurized {len(d.weak)} prompts in {p.seconds:.1f} s")
    prompts = [last_user_text(c) for c in d.conversations]
    lite = None if args.skip_litellm else litellm_scores(prompts)
    ev = loso.run_loso(p, np.array(lite["scores"]) if lite else None, _log)
    result: dict[str, Any] = {
        "command": "python -m bench.router" + (" --skip-litellm" if args.skip_litellm else ""),
        "data": {"dir": "../shared/data/routing", "files": d.files,
                 "sources": {k: int(np.sum(d.source == k)) for k in p.names}},
        "protocol": {"bootstrap_resamples": args.boot, "designs_per_selection": len(GRID),
                     "selection": "leave-one-source-out over the training sources only (complexity/select.py)",
                     "mmlu_subject_folds": loso.FOLDS},
        "loso": {**loso.table(p, ev, args.boot), "folds": ev.folds},
    }
    shipped = ComplexityModel.load_default()
    result["ablations"] = loso.ablations(p, shipped.design)
    result["mmlu_in_source"] = loso.mmlu_in_source(p, _log)
    sim = traffic.simulate_default(d, write=args.write_traffic)
    result["cloud_share"] = {
        "default_policy_mixed_traffic": sim,
        "held_out_complexity_ge_0.7": {k: ev.folds[k]["share_complexity_ge_0.7"] for k in p.names}}
    result["shipped_model"] = {"file": str(DEFAULT_MODEL_FILE.relative_to(REPO)),
                               "sha256": hashlib.sha256(DEFAULT_MODEL_FILE.read_bytes()).hexdigest(),
                               "design": shipped.design.__dict__, "trained_on": shipped.meta.get("trained_on"),
                               "selection": shipped.meta.get("selection")}
    rng = np.random.default_rng(2)
    sample = sorted(rng.choice(len(prompts), min(args.latency_prompts, len(prompts)), replace=False).tolist())
    lat = latency.measure([prompts[i] for i in sample])
    result["latency"] = {
        "prompts": len(lat["features_ms"]), "features_p50_ms": _pct(lat["features_ms"], 50),
        "features_p90_ms": _pct(lat["features_ms"], 90), "features_p99_ms": _pct(lat["features_ms"], 99),
        "features_cpu_p50_ms": _pct(lat["features_cpu_ms"], 50), "features_cpu_p99_ms": _pct(lat["features_cpu_ms"], 99),
        "complexity_p50_ms": _pct(lat["complexity_ms"], 50), "complexity_p99_ms": _pct(lat["complexity_ms"], 99),
        "peak_rss_mib": round(lat["peak_rss_mib"], 1), "torch_imported": lat["torch_imported"],
        "sklearn_imported": lat["sklearn_imported"]}
    if lite:
        result["latency"] |= {"litellm_version": lite["version"], "litellm_p50_ms": _pct(lite["latency_ms"], 50),
                              "litellm_p99_ms": _pct(lite["latency_ms"], 99)}
    result["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    result["load_average"] = round(os.getloadavg()[0], 2)  # at the end: what else shared the machine
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description="tiergate router benchmark")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--boot", type=int, default=2000, help="bootstrap resamples")
    ap.add_argument("--latency-prompts", type=int, default=2000)
    ap.add_argument("--skip-litellm", action="store_true")
    ap.add_argument("--json", type=Path, default=RESULT_FILE, help="where to write the raw results")
    ap.add_argument("--from-json", type=Path, help="re-render an earlier run's results, no measuring")
    ap.add_argument("--write-traffic", type=Path, help="also write the mixed traffic (JSON lines with `source`)")
    ap.add_argument("--write-docs", action="store_true", help=f"replace the '{HEADING}' section of {DOCS}")
    args = ap.parse_args()
    if args.from_json:
        r, source = json.loads(args.from_json.read_text()), args.from_json
    else:
        with one_blas_thread():  # the numbers of `tiergate classifier train`, whatever OMP_NUM_THREADS says
            r = run(args)
        source = args.json
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(r, indent=1) + "\n")
    section = markdown(r, source.resolve().relative_to(REPO) if source.resolve().is_relative_to(REPO) else source)
    print(section)
    if args.write_docs:
        write_section(HEADING, section, DOCS)
        print(f"updated {DOCS}", file=sys.stderr)


if __name__ == "__main__":
    main()
