"""Choose the semantic cache's threshold and guards on the calibration half of the labelled pairs.

    .venv/bin/python -m bench.cache.calibrate [--pairs FILE] [--min-precision 0.90]

Rule: with the guards on (all five by default: each targets a false-hit kind reported from the field, whether
or not these pairs contain many of them), take the lowest threshold on a 0.005 grid whose precision on the
calibration half is at least --min-precision (the highest recall that keeps precision). `--search-guards`
also tries every subset of guards. The held-out half is scored once, for the chosen settings only, so its
numbers are an honest estimate. Each guard's effect (removed alone) is printed too. The result is what
`cache.settings` ships.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.cache.pairs import DEFAULT_PAIRS, Pairs, load_pairs, split
from tiergate.cache.guards import GUARDS, Signature, overlap, signature, veto
from tiergate.cache.settings import DEFAULT_GUARDS


@dataclass(frozen=True)
class Score:
    precision: float
    recall: float
    hits: int


def score(hit: np.ndarray, duplicate: np.ndarray) -> Score:
    tp = int((hit & duplicate).sum())
    n = int(hit.sum())
    return Score(tp / n if n else 1.0, tp / max(int(duplicate.sum()), 1), n)


def signatures(pairs: Pairs) -> dict[str, Signature]:
    """Every question's signature, once (a question appears in several pairs)."""
    return {t: signature(t) for t in set(pairs.a) | set(pairs.b)}


def vetoes(pairs: Pairs, sigs: dict[str, Signature] | None = None) -> dict[str, np.ndarray]:
    """For each guard alone: which pairs it vetoes (guards are independent, so subsets are unions)."""
    sigs = sigs if sigs is not None else signatures(pairs)
    out = {g: np.zeros(len(pairs.a), bool) for g in GUARDS}
    for i, (a, b) in enumerate(zip(pairs.a, pairs.b, strict=True)):
        for g in GUARDS:
            out[g][i] = veto(sigs[a], sigs[b], (g,)) is not None
    return out


@dataclass(frozen=True)
class Labelled:
    """The labelled pairs with what the shipped guards make of them, computed once for every use."""

    pairs: Pairs
    sigs: dict[str, Signature]  # every question's signature
    vetoed: np.ndarray  # per pair: one of the default guards vetoes it
    overlap: np.ndarray  # per pair: `cache.guards.overlap` of its two questions


def labelled(pairs: Pairs | None = None) -> Labelled:
    pairs = pairs if pairs is not None else load_pairs()
    sigs = signatures(pairs)
    per_guard = vetoes(pairs, sigs)
    vetoed = np.zeros(len(pairs.a), bool)
    for g in DEFAULT_GUARDS:
        vetoed |= per_guard[g]
    shared = np.array([overlap(sigs[a], sigs[b]) for a, b in zip(pairs.a, pairs.b, strict=True)])
    return Labelled(pairs, sigs, vetoed, shared)


def calibrate(pairs: Pairs, cal: np.ndarray, min_precision: float, subsets: list[tuple[str, ...]],
              all_vetoes: dict[str, np.ndarray] | None = None) -> tuple[float, tuple[str, ...], Score]:
    """`all_vetoes`: `vetoes(pairs)` when the caller has it already."""
    cos = pairs.cosine[cal]
    dup = pairs.duplicate[cal]
    per_guard = {g: v[cal] for g, v in (all_vetoes if all_vetoes is not None else vetoes(pairs)).items()}
    best: tuple[float, tuple[str, ...], Score] | None = None
    for subset in subsets:
        vetoed = _union(per_guard, subset, len(cal))
        for t in np.round(np.arange(0.80, 0.995, 0.005), 3):
            s = score((cos >= t) & ~vetoed, dup)
            if s.precision < min_precision or s.hits < 50:
                continue
            key = (s.recall, -len(subset), t)
            if best is None or key > (best[2].recall, -len(best[1]), best[0]):
                best = (float(t), subset, s)
    if best is None:
        raise SystemExit(f"no setting reaches precision {min_precision} on the calibration pairs")
    return best


def _union(per_guard: dict[str, np.ndarray], guards: Iterable[str], n: int) -> np.ndarray:
    out = np.zeros(n, bool)
    for g in guards:
        out |= per_guard[g]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default=str(DEFAULT_PAIRS))
    ap.add_argument("--min-precision", type=float, default=0.90)
    ap.add_argument("--search-guards", action="store_true", help="also try every subset of guards")
    args = ap.parse_args()
    pairs = load_pairs(Path(args.pairs))
    cal, held = split(len(pairs.a))
    subsets = [GUARDS]
    if args.search_guards:
        subsets = [s for k in range(len(GUARDS) + 1) for s in itertools.combinations(GUARDS, k)]
    per_guard = vetoes(pairs)
    threshold, guards, cal_score = calibrate(pairs, cal, args.min_precision, subsets, per_guard)
    cal_vetoes = {g: v[cal] for g, v in per_guard.items()}
    ablation = {
        f"without {g}": score((pairs.cosine[cal] >= threshold)
                              & ~_union(cal_vetoes, [x for x in guards if x != g], len(cal)),
                              pairs.duplicate[cal]).__dict__
        for g in guards
    }
    held_vetoes = {g: v[held] for g, v in per_guard.items()}
    held_score = score((pairs.cosine[held] >= threshold) & ~_union(held_vetoes, guards, len(held)),
                       pairs.duplicate[held])
    print(json.dumps({
        "threshold": threshold,
        "guards": list(guards),
        "calibration": {"pairs": len(cal), **cal_score.__dict__},
        "calibration_ablation": ablation,
        "held_out": {"pairs": len(held), **held_score.__dict__},
    }, indent=2))


if __name__ == "__main__":
    main()
