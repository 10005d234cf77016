"""Nested subject cross-validation of how the complexity model's design was chosen (slow: ~15 min, one core).

    .venv/bin/python -m bench.router.nested [--outer five|loso|both]

The shipped design (rank average of a "gain" and a "strong-weak" member, with the `verdict_options` feature)
was picked among a handful of designs by the same subject cross-validation bench/router reports, which
flatters it. This repeats that choice INSIDE each outer fold: for every outer fold (5 folds of 8 subjects,
or leave-one-subject-out), each candidate is scored by a 4-fold by-subject cross-validation on the outer
training subjects only; the winner is refitted on them and scores the held-out subjects (as a percentile of
its training prompts, as the gateway scores). The pooled APGR is an honest estimate of design + selection.

Candidates: {one gain ensemble, strong minus weak ensembles, rank average of both} x {24 features without
`verdict_options`, all features}, all with DEFAULT_PARAMS.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np

from bench.router.__main__ import DATA, FOLDS, _folds
from bench.router.subjects import subjects

Fitter = Callable[[np.ndarray, np.ndarray, np.ndarray], Callable[[np.ndarray], np.ndarray]]


def _pct(train_raw: np.ndarray, raw: np.ndarray) -> np.ndarray:
    s = np.sort(train_raw)
    return (np.searchsorted(s, raw, "left") + np.searchsorted(s, raw, "right")) / (2 * len(s))


def _trees(x: np.ndarray, y: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    from policies.complexity_train import fit_trees

    t = fit_trees(x, y)
    return lambda z: np.array([t.predict(r) for r in z])


def _gain(x: np.ndarray, w: np.ndarray, s: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    f = _trees(x, s - w)
    base = f(x)
    return lambda z: _pct(base, f(z))


def _sep(x: np.ndarray, w: np.ndarray, s: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    fs, fw = _trees(x, s), _trees(x, w)
    base = fs(x) - fw(x)
    return lambda z: _pct(base, fs(z) - fw(z))


def _avg(x: np.ndarray, w: np.ndarray, s: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    from policies.complexity_train import fit

    m = fit(x, w, s)
    return lambda z: np.array([m.calibrate(m.combined(r)) for r in z])


def candidates(n_features: int) -> dict[str, tuple[np.ndarray, Fitter]]:
    all_cols = np.arange(n_features)
    base_cols = all_cols[:-1]  # verdict_options is the last feature
    return {f"{name}, {label}": (cols, fn) for label, cols in (("24 features", base_cols), ("all", all_cols))
            for name, fn in (("gain", _gain), ("strong-weak", _sep), ("average", _avg))}


def _cv(x, w, s, fold, fitter) -> np.ndarray:  # type: ignore[no-untyped-def]
    out = np.zeros(len(w))
    for f in np.unique(fold):
        te = fold == f
        out[te] = fitter(x[~te], w[~te], s[~te])(x[te])
    return out


def nested(x: np.ndarray, w: np.ndarray, s: np.ndarray, subj: np.ndarray, outer: np.ndarray, label: str) -> float:
    from policies.complexity_train import apgr

    cands = candidates(x.shape[1])
    out = np.zeros(len(w))
    picks: list[str] = []
    for f in np.unique(outer):
        te = outer == f
        idx = np.nonzero(~te)[0]
        names = sorted(set(subj[idx]))
        order = np.random.RandomState(int(f)).permutation(len(names))
        fold_of = {names[j]: i % 4 for i, j in enumerate(order)}
        inner = np.array([fold_of[v] for v in subj[idx]])
        scores = {k: apgr(_cv(x[idx][:, cols], w[idx], s[idx], inner, fn), w[idx], s[idx])
                  for k, (cols, fn) in cands.items()}
        best = max(scores, key=lambda k: scores[k])
        picks.append(best)
        cols, fn = cands[best]
        out[te] = fn(x[~te][:, cols], w[~te], s[~te])(x[te][:, cols])
        print(f"{label} fold {f}: picked {best!r}", {k: round(v, 4) for k, v in scores.items()}, flush=True)
    result = apgr(out, w, s)
    print(f"{label}: nested APGR {result:.4f}; picks { {p: picks.count(p) for p in sorted(set(picks))} }")
    return result


def main() -> None:
    from gateway.complexity import Featurizer
    from policies.complexity_train import read_labelled

    ap = argparse.ArgumentParser(description="nested subject cross-validation of the complexity model's design")
    ap.add_argument("--outer", choices=("five", "loso", "both"), default="both")
    args = ap.parse_args()
    data = read_labelled(DATA)
    subj = np.array(subjects(data.prompts))
    x = Featurizer().matrix(data.prompts)
    if args.outer in ("five", "both"):
        nested(x, data.weak, data.strong, subj, _folds(list(subj), FOLDS), "5-fold by subject")
    if args.outer in ("loso", "both"):
        loso = np.array([sorted(set(subj)).index(v) for v in subj])
        nested(x, data.weak, data.strong, subj, loso, "leave-one-subject-out")


if __name__ == "__main__":
    main()
