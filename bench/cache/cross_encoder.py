"""How well does one cross-encoder rank the labelled pairs? The experiment behind the cache's optional verifier.

(The product's verifier, `cache.pairscore`, is two such members trained by `cache.training.verifier`; how the error
bound does with it is measured in `bench.cache.errbound`.)

    .venv/bin/python -m bench.cache.cross_encoder [--epochs 1] [--out .tiergate/calib/cross-encoder]

Fine-tunes all-MiniLM-L6-v2 (the embedder's own weights, fresh 1-logit head, BCE) as a pair classifier on the
calibration half of the labelled question pairs (the first 85 % of it; the last 15 % only picks thresholds), then
scores the held-out half, which never trains or tunes anything. Prints average precision, precision at the
threshold chosen for recall 0.40 on the threshold slice, the best precision reachable at recall >= 0.40, and the
same with a cosine pre-filter (what a lookup would see), next to cosine alone. Then, as the error bound would use
it (guards on, cosine >= its floor), the recall of each ranking cut in hindsight at each false-hit bound
(`bench.cache.ceiling.frontier`): cosine, the cross-encoder, and both (a logistic fit on the threshold slice).
Needs torch and transformers (`pip install -e '.[export]'`); ~10 minutes on 2 cores. Writes
bench/results/cache_cross_encoder.json; the result is in docs/benchmarks.md and docs/cache.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score

from bench.cache.calibrate import labelled
from bench.cache.ceiling import frontier, table
from bench.cache.errbound import BOUNDS
from bench.cache.pairs import DEFAULT_PAIRS, load_pairs, split
from bench.report import RESULTS, machine_facts, machine_line
from tiergate.cache.errbound import FLOOR
from tiergate.cache.training.export import default_embedder_dir
from tiergate.cache.training.verifier import MAX_LENGTH, fine_tune

RECALL = 0.40
RESULT_FILE = RESULTS / "cache_cross_encoder.json"


def threshold_for_recall(scores: np.ndarray, y: np.ndarray, recall: float) -> float:
    """The largest threshold whose recall is at least `recall`."""
    pos = np.sort(scores[y])[::-1]
    return float(pos[int(np.ceil(recall * len(pos))) - 1])


def precision_recall(scores: np.ndarray, y: np.ndarray, t: float) -> tuple[float, float]:
    hit = scores >= t
    tp = int((hit & y).sum())
    return tp / max(int(hit.sum()), 1), tp / max(int(y.sum()), 1)


def best_precision_at_recall(scores: np.ndarray, y: np.ndarray, recall: float) -> float:
    order = np.argsort(-scores)
    tp = np.cumsum(y[order])
    ok = tp / y.sum() >= recall
    return float((tp / np.arange(1, len(scores) + 1))[ok].max()) if ok.any() else 0.0


def train(a: list[str], b: list[str], y: np.ndarray, idx: np.ndarray, out: Path, *, epochs: float, seed: int):
    """The product's fine-tuning (`cache.training.verifier.fine_tune`, one member), saved for torch scoring here."""
    model, tok = fine_tune(a, b, y, idx, epochs=epochs, seed=seed)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return model, tok


def score(model, tok, a: list[str], b: list[str], idx: np.ndarray, max_length: int = MAX_LENGTH) -> np.ndarray:
    import torch  # the optional `export` extra

    out = np.zeros(len(idx), np.float32)
    order = np.argsort([len(a[i]) + len(b[i]) for i in idx])
    model.eval()
    with torch.no_grad():
        for s in range(0, len(idx), 128):
            o = order[s:s + 128]
            ii = idx[o]
            enc = tok([a[i] for i in ii], [b[i] for i in ii], truncation=True, max_length=max_length,
                      padding=True, return_tensors="pt")
            out[o] = model(**enc).logits[:, 0].float().numpy()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default=str(DEFAULT_PAIRS))
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(default_embedder_dir().parent / "calib" / "cross-encoder"))
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch  # the optional `export` extra (after the offline switches above)

    torch.set_num_threads(args.threads)
    pairs = load_pairs(Path(args.pairs))  # texts, labels and (cached) embeddings for the cosine rows
    a, b, y = pairs.a, pairs.b, pairs.duplicate
    cal, held = split(len(a))
    k = int(len(cal) * 0.85)
    fit, tune = cal[:k], cal[k:]
    machine = machine_facts()
    started = time.perf_counter()
    model, tok = train(a, b, y, fit, Path(args.out), epochs=args.epochs, seed=args.seed)
    train_s = time.perf_counter() - started
    s_tune, s_held = score(model, tok, a, b, tune), score(model, tok, a, b, held)
    cosine = pairs.cosine
    y_tune, y_held = y[tune], y[held]
    rows = []
    for label, st, sh in [("cosine alone", cosine[tune], cosine[held]), ("cross-encoder", s_tune, s_held),
                          *[(f"cosine >= {c} and cross-encoder", np.where(cosine[tune] >= c, s_tune, -1e9),
                             np.where(cosine[held] >= c, s_held, -1e9)) for c in (0.7, 0.8, 0.85)]]:
        t = threshold_for_recall(st, y_tune, RECALL)
        p, r = precision_recall(sh, y_held, t)
        rows.append({"verifier": label, "held_ap": float(average_precision_score(y_held, sh)),
                     "held_precision": p, "held_recall": r,
                     "best_precision_at_recall": best_precision_at_recall(sh, y_held, RECALL)})
    top = np.argsort(-s_held)[:200]
    report = {"train_pairs": len(fit), "threshold_pairs": len(tune), "held_out_pairs": len(held),
              "epochs": args.epochs, "seed": args.seed, "train_seconds": round(train_s, 1), "rows": rows,
              "precision_of_top_200": float(y_held[top].mean()),
              "ceiling": ceiling(cosine, y, labelled(pairs).vetoed, tune, held, s_tune, s_held),
              "command": "python -m bench.cache.cross_encoder", "when": time.strftime("%Y-%m-%d"),
              "machine": {"start": machine, "end": machine_facts()}}
    (Path(args.out) / "report.json").write_text(json.dumps(report, indent=2))
    RESULT_FILE.write_text(json.dumps(report, indent=1) + "\n")
    print("| verifier | held-out AP | precision / recall at the threshold chosen for recall 0.40 "
          "| best precision at recall >= 0.40 |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['verifier']} | {r['held_ap']:.3f} | {r['held_precision']:.3f} / {r['held_recall']:.3f} "
              f"| {r['best_precision_at_recall']:.3f} |")
    print(f"\nThe 200 highest-scored held-out pairs: {report['precision_of_top_200']:.1%} labelled duplicate. "
          f"Training: {len(fit)} pairs, {args.epochs:g} epoch(s), {train_s:.0f} s.\n")
    c = report["ceiling"]
    print(f"Guards on, cosine >= {FLOOR:g} ({c['scored']:,} held-out lookups): recall (false-hit rate) at the best "
          "hindsight cut\n")
    print("\n".join(table(c["rows"], CEILING_RANKINGS)))
    print("\n" + machine_line(report["machine"]["start"], report["machine"]["end"]))


CEILING_RANKINGS = ("cosine", "cross-encoder", "cosine and cross-encoder")


def ceiling(cosine: np.ndarray, duplicate: np.ndarray, vetoed: np.ndarray, tune: np.ndarray, held: np.ndarray,
            s_tune: np.ndarray, s_held: np.ndarray) -> dict:
    """Each ranking's recall at the best hindsight cut per bound, on the guard-passed held-out lookups the error
    bound would see; "both" is a logistic fit on the guard-passed threshold slice."""
    ok_t = ~vetoed[tune] & (cosine[tune] >= FLOOR)
    ok_h = ~vetoed[held] & (cosine[held] >= FLOOR)
    both = LogisticRegression(max_iter=2000).fit(np.column_stack([cosine[tune][ok_t], s_tune[ok_t]]),
                                                 duplicate[tune][ok_t])
    scores = {"cosine": cosine[held][ok_h], "cross-encoder": s_held[ok_h],
              "cosine and cross-encoder": both.predict_proba(np.column_stack([cosine[held][ok_h], s_held[ok_h]]))[:, 1]}
    wrong = ~duplicate[held][ok_h].astype(bool)
    dups = int(duplicate[held].sum())
    return {"scored": int(ok_h.sum()), "duplicates": dups,
            "rows": [{"bound": d} | {k: frontier(v, wrong, dups, d) for k, v in scores.items()} for d in BOUNDS]}


if __name__ == "__main__":
    main()
