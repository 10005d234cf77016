"""Leave-one-source-out evaluation of the complexity score, with the design chosen inside each training set.

For every source S (mmlu_dev, arena_bench and the four AlpacaEval subsets): the design is chosen by
`complexity.select.select_design` on the other sources only (their own leave-one-source-out), the model is
trained on them exactly as `tiergate classifier train --select` trains, calibrated on them (their mixed
reference), and scores S. Beside it, on the same prompts: prompt length (more tokens escalate first), its
reverse, a seeded random score, the previous design (complexity/choice.py on every prompt) retrained on the
same sources, the previous shipped model (that design trained on all of mmlu_dev, so in-sample on MMLU) and
LiteLLM's rule-based router when available. Intervals: the held-out prompts resampled with replacement (the
trained scores fixed), the same resamples for every method, so "model - length" is paired; the mean over
sources resamples every source independently.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.router.subjects import subjects
from tiergate.complexity.apgr import apgr, apgr_resampled
from tiergate.complexity.choice import ChoiceExpert, ChoiceFeaturizer
from tiergate.complexity.features import CONTENT, LENGTH, OPTIONS, Featurizer, last_user_text
from tiergate.complexity.model import MIN_OPTIONS, Design
from tiergate.complexity.select import select_design
from tiergate.complexity.train import Labelled, expert_scores, fit, read_labelled

__all__ = ["DATA_FILES", "Evaluation", "Prepared", "ci", "mmlu_in_source", "prepare", "run_loso"]

DATA_FILES = ("mmlu_dev.jsonl", "alpaca_eval_dev.jsonl", "arena_bench_dev.jsonl")
MMLU = "mmlu_dev"
FOLDS = 5
FOLD_SEED = 0


@dataclass(frozen=True)
class Prepared:
    data: Labelled
    h: np.ndarray  # FEATURES of every prompt
    x_choice: np.ndarray  # CHOICE_FEATURES of every prompt (the previous design reads them for every prompt)
    options: np.ndarray  # prompts with lettered answer options (the expert's)
    names: list[str]  # sources in file order
    featurizer: Featurizer
    seconds: float

    @property
    def x_expert(self) -> np.ndarray:
        """CHOICE_FEATURES where the expert applies, nan elsewhere (the training input of `fit`)."""
        return np.where(self.options[:, None], self.x_choice, np.nan)


def prepare(data_dir: Path) -> Prepared:
    t0 = time.perf_counter()
    data = read_labelled([data_dir / f for f in DATA_FILES])
    feats = Featurizer()
    h = feats.matrix(data.conversations)
    choice = ChoiceFeaturizer.for_encoder(feats.encoder)
    x_choice = choice.matrix([last_user_text(c) for c in data.conversations])
    options = h[:, OPTIONS] >= MIN_OPTIONS
    names = list(dict.fromkeys(data.source.tolist()))
    return Prepared(data, h, x_choice, options, names, feats, time.perf_counter() - t0)


def ci(v: np.ndarray) -> list[float]:
    return [round(float(np.percentile(v, 2.5)), 4), round(float(np.percentile(v, 97.5)), 4)]


@dataclass
class Evaluation:
    scores: dict[str, np.ndarray]  # method -> score of every prompt (each source scored by its held-out model)
    complexity: np.ndarray  # the model's calibrated complexity under the held-out model
    folds: dict[str, Any]  # per held-out source: design chosen, inner APGR, trust


def run_loso(p: Prepared, litellm: np.ndarray | None, log: Any = print) -> Evaluation:
    d, h = p.data, p.h
    w, s, src = d.weak, d.strong, d.source
    length = h[:, LENGTH]
    scores = {"model": np.zeros(len(w)), "length": length.copy(), "reverse length": -length,
              "random": np.random.default_rng(0).random(len(w)), "previous design, retrained": np.zeros(len(w))}
    complexity = np.zeros(len(w))
    folds: dict[str, Any] = {}
    for k in p.names:
        t0 = time.perf_counter()
        tr, te = src != k, src == k
        design, info = select_design(h, w, s, src, rows=tr)
        m = fit(h[tr], w[tr], s[tr], src[tr], design, p.x_expert[tr], p.featurizer)
        raw = m.raw_batch(h[te], expert_scores(m.expert, p.x_expert[te]))
        scores["model"][te] = raw
        complexity[te] = m.calibrate(raw)
        trust = m.trust_batch(h[te])
        prev = ChoiceExpert.fit(p.x_choice[tr], w[tr], s[tr])
        scores["previous design, retrained"][te] = [prev.percentile(r) for r in p.x_choice[te].tolist()]
        folds[k] = {"design": design.__dict__, **info, "mean_trust": round(float(trust.mean()), 4),
                    "share_trust_0": round(float(np.mean(trust == 0)), 4),
                    "share_complexity_ge_0.7": round(float(np.mean(complexity[te] >= 0.7)), 4),
                    "expert": m.expert is not None}
        log(f"held out {k}: {design} mean trust {trust.mean():.2f} ({time.perf_counter() - t0:.0f} s)")
    mm = src == MMLU
    shipped_before = ChoiceExpert.fit(p.x_choice[mm], w[mm], s[mm])
    scores["previous shipped model"] = np.array([shipped_before.percentile(r) for r in p.x_choice.tolist()])
    if litellm is not None:
        scores["LiteLLM complexity router"] = litellm
    return Evaluation(scores, complexity, folds)


def table(p: Prepared, ev: Evaluation, boot: int, seed: int = 1) -> dict[str, Any]:
    """APGR with bootstrap intervals per source and method, the paired model - length, and the mean."""
    d = p.data
    rng = np.random.default_rng(seed)
    boots: dict[str, list[np.ndarray]] = {name: [] for name in ev.scores}
    out: dict[str, Any] = {"sources": {}}
    for k in p.names:
        te = np.nonzero(d.source == k)[0]
        counts = np.stack([np.bincount(rng.integers(0, len(te), len(te)), minlength=len(te)) for _ in range(boot)])
        w, s = d.weak[te], d.strong[te]
        row: dict[str, Any] = {"n": len(te), "weak_quality": round(float(w.mean()), 4),
                               "strong_quality": round(float(s.mean()), 4)}
        for name, sc in ev.scores.items():
            b = apgr_resampled(sc[te], w, s, counts)
            boots[name].append(b)
            row[name] = {"apgr": round(apgr(sc[te], w, s), 4), "ci": ci(b)}
        diff = boots["model"][-1] - boots["length"][-1]
        row["model - length"] = {"diff": round(row["model"]["apgr"] - row["length"]["apgr"], 4), "ci": ci(diff)}
        out["sources"][k] = row
    out["mean"] = {name: {"apgr": round(float(np.mean([out["sources"][k][name]["apgr"] for k in p.names])), 4),
                          "ci": ci(np.mean(boots[name], 0))} for name in ev.scores}
    mean_diff = np.mean(boots["model"], 0) - np.mean(boots["length"], 0)
    out["mean"]["model - length"] = {"diff": round(out["mean"]["model"]["apgr"] - out["mean"]["length"]["apgr"], 4),
                                     "ci": ci(mean_diff)}
    return out


def ablations(p: Prepared, design: Design) -> dict[str, dict[str, float]]:
    """Fixed designs, outer leave-one-source-out only (not nested): what each part of the design is worth."""
    d, h = p.data, p.h
    variants = {"as shipped": design, "without the invariance penalty": Design(**{**design.__dict__, "invariance": 0.0})}
    out: dict[str, dict[str, float]] = {}
    for label, des in variants.items():
        r, unguarded = {}, {}
        for k in p.names:
            tr, te = d.source != k, d.source == k
            m = fit(h[tr], d.weak[tr], d.strong[tr], d.source[tr], des)
            r[k] = round(apgr(m.raw_batch(h[te]), d.weak[te], d.strong[te]), 4)
            unguarded[k] = round(apgr(m.head.z(h[te][:, list(CONTENT)]), d.weak[te], d.strong[te]), 4)
        out[label] = {**r, "mean": round(float(np.mean(list(r.values()))), 4)}
        if label == "as shipped":
            out["without the shift guard"] = {**unguarded, "mean": round(float(np.mean(list(unguarded.values()))), 4)}
    return out


def _folds(subj: list[str], k: int) -> np.ndarray:
    """Fold of every prompt: subjects dealt round-robin into k folds after a seeded shuffle."""
    names = sorted(set(subj))
    order = np.random.RandomState(FOLD_SEED).permutation(len(names))
    fold_of = {names[j]: i % k for i, j in enumerate(order)}
    return np.array([fold_of[v] for v in subj])


def mmlu_in_source(p: Prepared, log: Any = print) -> dict[str, Any]:
    """MMLU cross-validated by subject (5 folds of 8 subjects): train on the other sources and the training
    subjects (nested design choice, expert included), score the held-out subjects. Optimistic next to the
    leave-one-source-out figures: the held-out subjects share MMLU's format with the training ones."""
    d, h = p.data, p.h
    mm = np.nonzero(d.source == MMLU)[0]
    subj = subjects([last_user_text(d.conversations[i]) for i in mm])
    fold = _folds(subj, FOLDS)
    model, generic, previous = np.zeros(len(mm)), np.zeros(len(mm)), np.zeros(len(mm))
    share = np.zeros(len(mm))
    for f in range(FOLDS):
        t0 = time.perf_counter()
        tr = np.ones(len(h), bool)
        te = mm[fold == f]
        tr[te] = False
        design, _ = select_design(h, d.weak, d.strong, d.source, rows=tr)
        m = fit(h[tr], d.weak[tr], d.strong[tr], d.source[tr], design, p.x_expert[tr], p.featurizer)
        raw = m.raw_batch(h[te], expert_scores(m.expert, p.x_expert[te]))
        model[fold == f] = m.calibrate(raw)
        share[fold == f] = m.calibrate(raw) >= 0.7
        generic[fold == f] = m.raw_batch(h[te])
        tm = tr.copy()
        tm[d.source != MMLU] = False
        prev = ChoiceExpert.fit(p.x_choice[tm], d.weak[tm], d.strong[tm])
        previous[fold == f] = [prev.percentile(r) for r in p.x_choice[te].tolist()]
        log(f"mmlu subjects fold {f}: {design} ({time.perf_counter() - t0:.0f} s)")
    w, s = d.weak[mm], d.strong[mm]
    return {"folds": FOLDS, "subjects": len(set(subj)),
            "model": round(apgr(model, w, s), 4), "generic head only": round(apgr(generic, w, s), 4),
            "previous design": round(apgr(previous, w, s), 4), "length": round(apgr(h[mm, LENGTH], w, s), 4),
            "share_complexity_ge_0.7": round(float(share.mean()), 4)}
