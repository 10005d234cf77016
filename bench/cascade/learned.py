"""bench/cascade/learned: the learned router in front of the cascade, replayed on bench/cascade's recorded answers.

    .venv/bin/python -m bench.cascade.learned [--results bench/results/cascade.json] [--out ...]

No model runs here: bench/cascade's result file holds every edge answer it got (right or wrong by the exact
checkers, the cascade's keep score, the edge's wall time to the whole answer and its CPU seconds), and its
questions are rebuilt from the same seed, so each design is scored on the same answers. Its split is reused: the
router is trained on the calibration half's outcomes only, and every parameter (the router's cut-off, the cascade's
threshold) is chosen there; every number below is on the evaluation half.

Designs, each at 1 % and 5 % quality loss (escalated requests count as answered right, as in bench/cascade):
- cascade only: mean logprob (hold), as shipped;
- router then cascade: requests whose predicted P(edge stands) <= the cut-off go straight to the cloud, the rest
  cascade; the cut-off and the cascade threshold are chosen together on the calibration half. Two label sources:
  *cascade labels*: what the gateway records (the cascade's verdict at the cascade-only 5 % threshold), and
  *graded labels*: the exact checker's right/wrong (what feedback would give);
- router only: the router's P decides alone (no edge answer is judged);
- length, complexity: the prompt's token count or complexity score alone, as bench/cascade's prompt rows.

Reported per design: share kept on the edge, edge attempts wasted (escalated after an edge attempt), the added
latency (p50, p90) of every request that ends in the cloud (escalated after an edge attempt: its edge time; sent
straight there: 0), edge CPU-seconds per request, APGR, and the share of MMLU sent straight to the cloud. Also the
router's own inference cost (features and prediction, the work the gateway adds per request: median of 5 passes).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np

from bench.cascade.analysis import split
from bench.cascade.metrics import apgr, at_threshold, kept_at_loss
from bench.cascade.tasks import make_items
from bench.report import RESULTS
from tiergate.complexity.edge_router import router_features
from tiergate.complexity.router_train import Outcomes, fit_router

LOSSES = (0.01, 0.05)
CUTOFFS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5)
FOLDS = 5


def _load(path: Path) -> dict:
    report = json.loads(path.read_text())
    s = report["settings"]
    items = {it.id: it for it in make_items(s["counts"], s["seed"])}
    rows = report["items"]
    missing = [r["id"] for r in rows if r["id"] not in items]
    if missing:
        raise SystemExit(f"{len(missing)} recorded questions are not rebuilt from the seed (e.g. {missing[0]})")
    feats = [router_features(prompt_tokens=r["prompt_tokens"], complexity=r["complexity"],
                             max_tokens=s["max_tokens"], temperature=0.0, stream=True, text=items[r["id"]].prompt)
             for r in rows]

    def score(r: dict) -> float:
        v = r["signals"]["mean logprob"]
        return -math.inf if v is None else float(v)

    return {"report": report, "rows": rows, "features": feats, "x": np.array([f.vector() for f in feats]),
            "tasks": [r["task"] for r in rows], "right": np.array([r["right"] for r in rows], float),
            "conf": np.array([score(r) for r in rows]), "done_s": np.array([r["done_s"] for r in rows]),
            "cpu_s": np.array([r["cpu_s"] for r in rows]),
            "tokens": np.array([r["prompt_tokens"] for r in rows], float),
            "complexity": np.array([r["complexity"] for r in rows], float)}


def _fit_predict(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray) -> np.ndarray:
    model = fit_router(Outcomes(x_train, y_train, 0, {}), "smollm2")
    z = x_test @ model.weights + model.bias
    return 1 / (1 + np.exp(-(model.platt_a * z + model.platt_b)))


def _cross_fitted(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Out-of-fold predictions on the calibration half (choosing a cut-off on in-sample ones would flatter it)."""
    out = np.zeros(len(y))
    folds = np.arange(len(y)) % FOLDS
    for k in range(FOLDS):
        out[folds == k] = _fit_predict(x[folds != k], y[folds != k], x[folds == k])
    return out


def _outcome(keep: np.ndarray, attempted: np.ndarray, d: dict, idx: np.ndarray) -> dict:
    """What a design did on the requests `idx`: keep (answered by the edge), attempted (the edge was asked)."""
    right, cloud = d["right"][idx], np.ones(len(idx))
    escalated = attempted & ~keep
    to_cloud = ~keep
    added = np.where(escalated, d["done_s"][idx], 0.0)[to_cloud]
    mmlu = np.array([d["tasks"][i] == "mmlu" for i in idx])
    straight = to_cloud & ~attempted
    return {"kept": round(float(keep.mean()), 4),
            "loss": round(float(((cloud - right) * keep).sum() / len(idx)), 4),
            "wasted_edge_attempts": round(float(escalated.mean()), 4),
            "straight_to_cloud": round(float(straight.mean()), 4),
            "added_latency_cloud_p50_s": round(float(np.percentile(added, 50)), 3) if added.size else None,
            "added_latency_cloud_p90_s": round(float(np.percentile(added, 90)), 3) if added.size else None,
            "edge_cpu_s_per_request": round(float((d["cpu_s"][idx] * attempted).mean()), 4),
            "mmlu_straight_to_cloud": round(float(straight[mmlu].mean()), 4) if mmlu.any() else None}


def _composite(conf: np.ndarray, p: np.ndarray, cut: float) -> np.ndarray:
    return np.where(p > cut, conf, -np.inf)


def run(path: Path) -> dict:
    d = _load(path)
    seed = d["report"]["settings"]["seed"]
    calib, evals = split(d["tasks"], seed)
    right, conf, x = d["right"], d["conf"], d["x"]
    ones = np.ones(len(right))
    designs: dict[str, dict] = {}

    # cascade only
    t5 = kept_at_loss(conf[calib], right[calib], ones[calib], 0.05).threshold
    for loss in LOSSES:
        t = kept_at_loss(conf[calib], right[calib], ones[calib], loss).threshold
        keep = conf[evals] >= t
        designs[f"cascade only @ {loss:.0%}"] = {"threshold": round(t, 4), **_outcome(
            keep, np.ones(len(evals), bool), d, evals), "apgr": round(apgr(conf[evals], right[evals],
                                                                           ones[evals]), 4)}

    labels = {"cascade labels": (conf >= t5).astype(float), "graded labels": right}
    for name, y in labels.items():
        p_cal = _cross_fitted(x[calib], y[calib])
        p_eval = _fit_predict(x[calib], y[calib], x[evals])
        for loss in LOSSES:
            best = None
            for cut in CUTOFFS:
                chosen = kept_at_loss(_composite(conf[calib], p_cal, cut), right[calib], ones[calib], loss)
                attempts = float((p_cal > cut).mean())
                key = (round(chosen.kept, 4), -attempts)
                if best is None or key > best[0]:
                    best = (key, cut, chosen.threshold)
            assert best is not None
            _, cut, t = best
            keep = (p_eval > cut) & (conf[evals] >= t)
            designs[f"router then cascade ({name}) @ {loss:.0%}"] = {
                "cutoff": cut, "threshold": round(t, 4), **_outcome(keep, p_eval > cut, d, evals),
                "apgr": round(apgr(_composite(conf[evals], p_eval, cut), right[evals], ones[evals]), 4)}
            t_r = kept_at_loss(p_cal, right[calib], ones[calib], loss).threshold
            keep_r = p_eval >= t_r
            designs[f"router only ({name}) @ {loss:.0%}"] = {
                "threshold": round(t_r, 4), **_outcome(keep_r, keep_r, d, evals),
                "apgr": round(apgr(p_eval, right[evals], ones[evals]), 4)}

    for name, score in (("length", -d["tokens"]), ("complexity", -d["complexity"])):
        for loss in LOSSES:
            t = kept_at_loss(score[calib], right[calib], ones[calib], loss).threshold
            keep = score[evals] >= t
            kept, _ = at_threshold(score[evals], right[evals], ones[evals], t)
            designs[f"{name} only @ {loss:.0%}"] = {"threshold": round(t, 4), **_outcome(keep, keep, d, evals),
                                                    "apgr": round(apgr(score[evals], right[evals], ones[evals]), 4)}

    return {"command": "python -m bench.cascade.learned", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "source": str(path), "n_calibration": len(calib), "n_evaluation": len(evals),
            "mmlu_calibration_outcomes": int(sum(d["tasks"][i] == "mmlu" for i in calib)),
            "designs": designs, "router_inference_ms": _inference_ms(d)}


def _inference_ms(d: dict) -> dict:
    """What the gateway adds per request: the features of the prompt and one prediction (median of 5 passes)."""
    model = fit_router(Outcomes(d["x"], d["right"], 0, {}), "smollm2")
    rows, report = d["rows"], d["report"]
    items = {it.id: it for it in make_items(report["settings"]["counts"], report["settings"]["seed"])}
    prompts = [(items[r["id"]].prompt, r["prompt_tokens"], r["complexity"]) for r in rows]
    passes = []
    for _ in range(5):
        start = time.process_time()
        for text, tokens, cx in prompts:
            model.predict(router_features(prompt_tokens=tokens, complexity=cx, max_tokens=16, temperature=0.0,
                                          stream=True, text=text))
        passes.append((time.process_time() - start) * 1000 / len(prompts))
    return {"median_cpu_ms_per_request": round(statistics.median(passes), 4),
            "passes_ms": [round(p, 4) for p in passes], "requests_per_pass": len(prompts)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS / "cascade.json")
    ap.add_argument("--out", type=Path, default=RESULTS / "cascade-learned-router.json")
    args = ap.parse_args()
    out = run(args.results)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for name, row in out["designs"].items():
        print(f"{name:48s} " + " ".join(f"{k}={v}" for k, v in row.items()))
    print("router inference:", out["router_inference_ms"])


if __name__ == "__main__":
    main()
