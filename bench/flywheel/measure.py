"""Scoring one edge model through the gateway: accuracy, the cascade's keep share at a loss target, costs.

Questions go to the gateway as the `probe` tenant, whose rule sends them to the edge tier alone, streamed,
greedy, with token log-probabilities (bench/cascade/runner.py's `ask`, the same request bench/cascade sends a
node). The cascade is then computed as bench/cascade computes it: the keep score is the answer's mean token
log-probability (an answer cut at max_tokens always escalates), the questions are halved by family with the seed,
the threshold for each loss target is chosen on one half (`kept_at_loss`) and the keep share and loss are read on
the other (`at_threshold`), with the cloud counted right. Thresholds are the measured model's own: each round's
adapter gets its thresholds from its own answers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from bench.cascade.analysis import LOSSES, split
from bench.cascade.metrics import at_threshold, kept_at_loss
from bench.cascade.runner import Answer, ask
from bench.cascade.signals import answer_signals
from bench.cascade.tasks import Item
from bench.families import Question
from bench.procs import cpu_seconds

__all__ = ["Measured", "cascade_numbers", "measure"]


@dataclass
class Measured:
    answers: list[Answer]
    right: np.ndarray
    edge_cpu_s: float  # both nodes' CPU seconds over the whole measurement
    wall_s: float


def measure(url: str, key: str, questions: Sequence[Question | Item], node_pids: Sequence[int], max_tokens: int,
            concurrency: int = 2) -> Measured:
    """Every question through the gateway (edge only), in order; the nodes' CPU time is read around the run."""
    headers = {"Authorization": f"Bearer {key}"}
    cpu0 = sum(cpu_seconds(p) for p in node_pids)
    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        answers = list(pool.map(lambda q: ask(url, q.prompt, max_tokens, None, "auto", headers=headers), questions))
    wall = time.monotonic() - t0
    cpu = sum(cpu_seconds(p) for p in node_pids) - cpu0
    right = np.array([q.check(a.text) for q, a in zip(questions, answers, strict=True)], np.float64)
    return Measured(answers, right, cpu, wall)


def _r(x: float, nd: int = 4) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), nd)


def cascade_numbers(tasks: Sequence[str], m: Measured, seed: int) -> dict:
    """Accuracy by family, and per loss target: threshold (calibration half), kept and loss (evaluation half),
    quality against all-cloud, edge CPU-seconds and cloud calls per 1,000 requests."""
    score = answer_signals(m.answers)["mean logprob"]
    cloud = np.ones(len(m.right))
    calib, evals = split(tasks, seed)
    per_request_cpu = m.edge_cpu_s / max(len(m.answers), 1)
    arr = np.asarray(tasks)
    out: dict = {
        "n": len(m.right), "accuracy": _r(m.right.mean()),
        "accuracy_by_family": {t: _r(m.right[arr == t].mean()) for t in dict.fromkeys(tasks)},
        "edge_cpu_s_per_request": _r(per_request_cpu), "wall_s": round(m.wall_s, 1),
        "cut_at_max_tokens": _r(np.mean([a.finish_reason == "length" for a in m.answers])),
        "mean_completion_tokens": _r(np.mean([a.completion_tokens for a in m.answers]), 2),
        "cascade": {},
    }
    for loss in LOSSES:
        chosen = kept_at_loss(score[calib], m.right[calib], cloud[calib], loss)
        kept, realised = at_threshold(score[evals], m.right[evals], cloud[evals], chosen.threshold)
        # The hold cascade asks the edge for every request; an escalated one costs its edge answer and a cloud call.
        out["cascade"][f"{round(loss * 100)}pct"] = {
            "threshold": _r(chosen.threshold, 6), "calibration_kept": _r(chosen.kept), "kept": _r(kept),
            "loss": _r(realised), "quality_vs_all_cloud": _r(1.0 - realised),
            "edge_cpu_s_per_1000": _r(1000 * per_request_cpu, 1), "cloud_calls_per_1000": round(1000 * (1 - kept)),
        }
    return out
