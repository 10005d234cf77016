"""From answers to numbers: accuracy, signal quality, the cascade's economics and its cost, for one run.

Honest by construction:
- The questions are split in two halves, stratified by task, with the seed. Thresholds and the combined
  rule's parameters are chosen on the calibration half only; every overall number is measured on the
  evaluation half, every signal on the same requests, with bootstrap 95 % intervals (resampling requests).
- Per-task AUROCs use all of a task's questions (nothing is fitted there) and are point values: with
  50-150 questions, and sometimes very few wrong answers, they are rough.
- The main view counts an escalated request as answered right (the production cloud is a 70B model); the
  second view (`--stand-in`) scores the stand-in's own answers with the same checkers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict

import numpy as np

from bench.cascade.combine import Combination, choose
from bench.cascade.metrics import apgr, at_threshold, auroc, bootstrap_ci, kept_at_loss
from bench.cascade.runner import Answer
from bench.cascade.signals import DESIGN, FIRST_K

__all__ = ["LOSSES", "analyse", "split"]

LOSSES = (0.01, 0.05)
HOLD_SIGNALS = ("mean logprob", "min logprob", "mean margin")


def split(tasks: Sequence[str], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(calibration, evaluation) indices: each task's questions shuffled with the seed and halved."""
    rng = np.random.default_rng(seed)
    calib: list[int] = []
    evals: list[int] = []
    arr = np.asarray(tasks)
    for task in dict.fromkeys(tasks):
        idx = rng.permutation(np.nonzero(arr == task)[0])
        half = len(idx) // 2
        calib += idx[:half].tolist()
        evals += idx[half:].tolist()
    return np.sort(np.array(calib, int)), np.sort(np.array(evals, int))


def _r(x: float, nd: int = 4) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), nd)


def _pct(values: np.ndarray, q: float) -> float | None:
    return _r(float(np.percentile(values, q)), 4) if len(values) else None


def _signal_row(name: str, score: np.ndarray, raw: np.ndarray | None, right: np.ndarray, cloud: np.ndarray,
                idx: np.ndarray, reps: int, seed: int) -> dict:
    s, e, c = score[idx], right[idx], cloud[idx]
    row: dict = {"signal": name, "design": DESIGN.get(name, "prompt + hold"),
                 "auroc": _r(auroc(s, e)), "auroc_ci": [_r(v) for v in bootstrap_ci(
                     lambda b: auroc(s[b], e[b]), len(idx), reps, seed)],
                 "auroc_without_cut_rule": None if raw is None else _r(auroc(raw[idx], e)),
                 "apgr": _r(apgr(s, e, c))}
    for loss in LOSSES:
        key = f"kept_at_{round(loss * 100)}pct_loss"
        row[key] = _r(kept_at_loss(s, e, c, loss).kept)
        row[key + "_ci"] = [_r(v) for v in bootstrap_ci(
            lambda b, lo=loss: kept_at_loss(s[b], e[b], c[b], lo).kept, len(idx), reps, seed)]
    return row


def _thresholds(name: str, score: np.ndarray, right: np.ndarray, cloud: np.ndarray, calib: np.ndarray,
                evals: np.ndarray, chosen_out: dict[tuple[str, float], float]) -> list[dict]:
    rows = []
    for loss in LOSSES:
        chosen = kept_at_loss(score[calib], right[calib], cloud[calib], loss)
        chosen_out[(name, loss)] = chosen.threshold
        kept, realised = at_threshold(score[evals], right[evals], cloud[evals], chosen.threshold)
        rows.append({"signal": name, "loss_target": loss, "threshold": _r(chosen.threshold, 6),
                     "calibration_kept": _r(chosen.kept), "evaluation_kept": _r(kept),
                     "evaluation_loss": _r(realised)})
    return rows


def _cost(answers: Sequence[Answer], keep: np.ndarray | None, threshold: float, decide_s: np.ndarray,
          decide_tokens: np.ndarray, cpu_if_escalated: np.ndarray, skipped: np.ndarray, idx: np.ndarray) -> dict:
    """Edge CPU per request and the edge time an escalated request waits, for one design at one threshold.

    The wait is also given in generated tokens (after the prompt's prefill), which other work on the machine
    does not stretch."""
    cpu_full = np.array([a.cpu_s for a in answers])
    kept = np.ones(len(answers), bool) if keep is None else keep >= threshold
    esc = ~kept & ~skipped
    cpu = np.where(skipped, 0.0, np.where(kept, cpu_full, cpu_if_escalated))
    wait, tokens = decide_s[idx][esc[idx]], decide_tokens[idx][esc[idx]]
    return {"threshold": _r(threshold, 6) if keep is not None else None, "kept": _r(kept[idx].mean()),
            "escalated_after_edge": _r(esc[idx].mean()), "skipped_edge": _r(skipped[idx].mean()),
            "edge_cpu_s_per_request": _r(cpu[idx].mean()),
            "added_latency_escalated_p50_s": _pct(wait, 50), "added_latency_escalated_p90_s": _pct(wait, 90),
            "tokens_before_decision_escalated_mean": _r(tokens.mean(), 2) if len(tokens) else None}


def analyse(tasks: Sequence[str], right: np.ndarray, answers: Sequence[Answer], signals: Mapping[str, np.ndarray],
            raw_signals: Mapping[str, np.ndarray], prompt: Mapping[str, np.ndarray], seed: int, reps: int,
            first_k_cpu: Mapping[int, dict], stand_in_right: np.ndarray | None = None) -> dict:
    """Every number bench/cascade reports, as a JSON-ready dict."""
    right = np.asarray(right, np.float64)
    n = len(right)
    cloud = np.ones(n)
    calib, evals = split(tasks, seed)
    task_arr = np.asarray(tasks)
    cut = np.array([a.finish_reason == "length" for a in answers])
    every = {**signals, **prompt}

    conf_for_combo = {k: signals[k] for k in HOLD_SIGNALS}
    combo = choose(prompt, conf_for_combo, right, cloud, calib)
    combined = combo.score(prompt[combo.prompt_signal], signals[combo.confidence_signal])
    rows = [_signal_row(k, v, raw_signals.get(k), right, cloud, evals, reps, seed) for k, v in every.items()]
    rows.append(_signal_row("combined", combined, None, right, cloud, evals, reps, seed))

    thr: dict[tuple[str, float], float] = {}  # (signal, loss target) -> threshold chosen on calibration
    thresholds = [t for k in (*HOLD_SIGNALS, *(f"first-{k} mean logprob" for k in FIRST_K))
                  for t in _thresholds(k, signals[k], right, cloud, calib, evals, thr)]
    thresholds += _thresholds("combined", combined, right, cloud, calib, evals, thr)

    # Recommended: the hold signal with the best calibration APGR, at the 5 % target (and 1 %).
    best_hold = max(HOLD_SIGNALS, key=lambda k: apgr(signals[k][calib], right[calib], cloud[calib]))
    best_k = max(FIRST_K, key=lambda k: apgr(signals[f"first-{k} mean logprob"][calib], right[calib], cloud[calib]))
    recommended = {
        "hold_signal": best_hold,
        "first_k": best_k,
        "thresholds": {f"{s} @ {round(loss * 100)}% loss": _r(thr[(s, loss)], 6)
                       for s in (*HOLD_SIGNALS, f"first-{best_k} mean logprob") for loss in LOSSES},
        "combined": {**asdict(combo), "skip_below": _r(combo.skip_below),
                     "threshold_5pct": _r(thr[("combined", 0.05)], 6)},
    }

    per_task = {}
    for task in dict.fromkeys(tasks):
        m = task_arr == task
        per_task[task] = {
            "n": int(m.sum()), "edge_accuracy": _r(right[m].mean()), "cut_share": _r(cut[m].mean()),
            "prompt_tokens_mean": _r(-prompt["prompt tokens"][m].mean(), 1),
            "complexity_mean": _r(-prompt["complexity"][m].mean(), 3),
            "auroc": {k: _r(auroc(v[m], right[m])) for k, v in every.items()},
        }
        hs, rt = signals[best_hold][m], right[m]
        per_task[task]["auroc_best_hold_ci"] = [_r(v) for v in bootstrap_ci(
            lambda b, hs=hs, rt=rt: auroc(hs[b], rt[b]), int(m.sum()), reps, seed)]
        kept = signals[best_hold][m] >= thr[(best_hold, 0.05)]
        per_task[task]["kept_at_recommended"] = _r(kept.mean())
        per_task[task]["wrong_kept_at_recommended"] = _r((kept & (right[m] == 0)).mean())
        if stand_in_right is not None:
            per_task[task]["stand_in_accuracy"] = _r(stand_in_right[m].mean())

    # Cost, on the evaluation half, at the 5 % thresholds chosen on the calibration half.
    none = np.zeros(n, bool)
    done = np.array([a.done_s for a in answers])
    cpu_full = np.array([a.cpu_s for a in answers])

    def t_k(k: int) -> np.ndarray:
        return np.array([a.token_times[k - 1] if len(a.token_times) >= k else a.done_s for a in answers])

    k_time = t_k(best_k)
    n_tok = np.array([len(a.scores) for a in answers], np.float64)
    k_cpu_est = cpu_full * np.clip(k_time / np.maximum(done, 1e-9), 0, 1)  # CPU ~ wall at one request in flight
    skipped = combo.skipped(prompt[combo.prompt_signal])
    sk = skipped[evals]
    recommended["combined"]["evaluation_skipped"] = {
        "share": _r(sk.mean()), "edge_accuracy": _r(right[evals][sk].mean()) if sk.any() else None,
        "edge_cpu_s_mean": _r(cpu_full[evals][sk].mean()) if sk.any() else None,
        "others_edge_accuracy": _r(right[evals][~sk].mean()),
        "others_edge_cpu_s_mean": _r(cpu_full[evals][~sk].mean())}
    hold_sig = signals[best_hold]
    cost = {
        "edge only (no cascade)": _cost(answers, None, 0.0, done, n_tok, cpu_full, none, evals),
        f"hold ({best_hold})": _cost(answers, hold_sig, thr[(best_hold, 0.05)], done, n_tok, cpu_full, none, evals),
        f"first-{best_k} ({best_k}-token mean logprob)": _cost(
            answers, signals[f"first-{best_k} mean logprob"],
            thr[(f"first-{best_k} mean logprob", 0.05)], k_time, np.minimum(n_tok, best_k), k_cpu_est, none, evals),
        f"combined (skip on {combo.prompt_signal}, then {combo.confidence_signal})": _cost(
            answers, combined, thr[("combined", 0.05)], done, n_tok, cpu_full, skipped, evals),
    }
    timing = {"edge_ttft_p50_s": _pct(t_k(1), 50), "edge_ttft_p90_s": _pct(t_k(1), 90),
              **{f"time_to_{k}_tokens_p50_s": _pct(t_k(k), 50) for k in FIRST_K},
              **{f"time_to_{k}_tokens_p90_s": _pct(t_k(k), 90) for k in FIRST_K},
              "whole_answer_p50_s": _pct(done, 50), "whole_answer_p90_s": _pct(done, 90),
              "edge_cpu_s_per_request_mean": _r(cpu_full.mean()),
              "first_k_attempts_measured": {str(k): v for k, v in first_k_cpu.items()}}

    out = {
        "overall": {"n": n, "edge_accuracy": _r(right.mean()), "cut_share": _r(cut.mean()),
                    "n_calibration": len(calib), "n_evaluation": len(evals),
                    "evaluation_edge_accuracy": _r(right[evals].mean())},
        "tasks": per_task, "signals": rows, "thresholds": thresholds, "recommended": recommended,
        "cost": cost, "timing": timing, "combination_summary": combination_summary(combo),
    }
    if stand_in_right is not None:
        out["stand_in"] = _stand_in_view(every, combined, right, np.asarray(stand_in_right, np.float64), evals)
    return out


def _stand_in_view(every: Mapping[str, np.ndarray], combined: np.ndarray, right: np.ndarray, stand_in: np.ndarray,
                   evals: np.ndarray) -> dict:
    """Kept shares and APGR when escalated answers are the stand-in's own, scored the same way."""
    e, c = right[evals], stand_in[evals]
    rows = []
    gap = abs(c.mean() - e.mean())
    for name, score in {**every, "combined": combined}.items():
        s = score[evals]
        # PGR divides by the quality gap: with a gap of a few points it is noise, so it is not reported.
        rows.append({"signal": name, "apgr": _r(apgr(s, e, c)) if gap >= 0.05 else None,
                     **{f"kept_at_{round(lo * 100)}pct_loss": _r(kept_at_loss(s, e, c, lo).kept) for lo in LOSSES}})
    return {"accuracy": _r(stand_in.mean()), "evaluation_accuracy": _r(c.mean()),
            "agreement_with_edge": _r((stand_in == right).mean()), "signals": rows}


def combination_summary(c: Combination) -> str:
    if c.skip_share == 0:
        return f"{c.confidence_signal} alone: skipping any prompt lowered the calibration APGR"
    return (f"skip the edge for the {c.skip_share:.0%} of prompts with the highest {c.prompt_signal}, then "
            f"{c.confidence_signal}")
