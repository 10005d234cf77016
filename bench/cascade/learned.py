"""bench/cascade/learned: the learned router in front of the cascade, replayed on bench/cascade's recorded answers.

    .venv/bin/python -m bench.cascade.learned [--results bench/results/cascade.json]
                                              [--more-mmlu bench/results/cascade-mmlu-400.json] [--out ...]

No model runs here: bench/cascade's result file holds every edge answer it got (right or wrong by the exact
checkers, the cascade's keep score, the edge's wall time to the whole answer and its CPU seconds), and its
questions are rebuilt from the same seed, so each design is scored on the same answers.

Cross-validated: each task's questions are dealt into 5 folds; for each fold, the router is trained on the other
four only, and every parameter (the router's cut-off, the cascade's threshold) is chosen on those four, the
router's cut-off on its out-of-fold predictions there; the fold is then scored. Every request is scored once, by
a router and parameters that never saw it, and the numbers are over all of them.

Designs, each at 1 % and 5 % quality loss (escalated requests count as answered right, as in bench/cascade):
- cascade only: mean logprob (hold), as shipped;
- router then cascade: requests whose predicted P(edge stands) <= the cut-off go straight to the cloud, the rest
  cascade; the cut-off and the cascade threshold are chosen together: the most kept on the edge within the loss,
  and of cut-offs that keep as much, the lowest (the router skips the edge only where it is surest). Four label
  sources: *cascade labels*: the cascade's own verdict (at the cascade-only 5 % threshold); *graded labels*: the
  exact checker's right/wrong (what feedback or graded traffic would give); *agreement labels*: what the gateway
  records where it holds the cloud's answer too (`gateway.agreement`): the product's own judge
  (`tiergate.cache.answercheck`) on the edge's answer against the gold answer standing in for the cloud's, on every
  request (escalations, explorations, and `router.verify: 1` for kept answers), no verdict, no label; and
  *agreement labels, escalations only*: the same on escalated requests only (`router.verify: 0`), the rest
  unlabelled, as `--from-outcomes` trains once it has enough graded labels; the same with a quarter of the kept
  answers verified (`router.verify: 0.25`), unweighted and weighted (each verified kept answer counted four
  times, for the kept ones not verified); and *agreement labels on escalations, cascade labels on kept*: the
  escalated requests' cascade labels replaced by graded ones;
- router only: the router's P decides alone (no edge answer is judged);
- length, complexity: the prompt's token count or complexity score alone, as bench/cascade's prompt rows.

Reported per design: share kept on the edge, edge attempts wasted (escalated after an edge attempt), the added
latency (p50, p90) of every request that ends in the cloud (escalated after an edge attempt: its edge time; sent
straight there: 0), edge CPU-seconds per request, APGR, the share of MMLU sent straight to the cloud, and against
cascade only: the answers cascade only kept that the design sent to the cloud (by task) and those it kept that
cascade only did not.

The MMLU study (`mmlu_after_outcomes`): does MMLU-like traffic go straight to the cloud once the router has seen
N outcomes of it? MMLU questions (those of `--results` and of `--more-mmlu`, bench/cascade runs of MMLU alone)
are dealt into 5 folds by question; the router of each fold trains on the other tasks' training folds plus N
MMLU requests drawn with repeats from the training folds' questions (a repeated question is answered as it was:
greedy decoding), and is scored on the held-out fold's questions, at the cut-off the fold's router-then-cascade
design chose. Also the router's own inference cost (features and prediction, median of 5 passes).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.cascade.metrics import apgr, kept_at_loss
from bench.cascade.tasks import make_items
from bench.report import REPO, RESULTS
from tiergate.complexity.edge_router import router_features
from tiergate.complexity.router_train import Outcomes, fit_router
from tiergate.core.answers import short_verdict

LOSSES = (0.01, 0.05)
CUTOFFS = tuple(round(0.025 * i, 3) for i in range(25))  # 0 .. 0.6
FOLDS = 5
MMLU_OUTCOMES = (75, 150, 300, 500)


def _rows(path: Path) -> tuple[dict, list[dict], list]:
    """A bench/cascade result: (report, its rows, their router features); each row also gets `agree`: the product's
    own judge on the edge's answer against the gold one as the cloud's answer (None: no verdict)."""
    report = json.loads(path.read_text())
    s = report["settings"]
    items = {it.id: it for it in make_items(s["counts"], s["seed"])}
    rows = report["items"]
    missing = [r["id"] for r in rows if r["id"] not in items]
    if missing:
        raise SystemExit(f"{path}: {len(missing)} recorded questions are not rebuilt from the seed "
                         f"(e.g. {missing[0]})")
    for r in rows:
        it = items[r["id"]]
        r["agree"] = short_verdict(it.prompt, r.get("answer") or "", it.gold)
    feats = [router_features(prompt_tokens=r["prompt_tokens"], complexity=r["complexity"],
                             max_tokens=s["max_tokens"], temperature=0.0, stream=True, text=items[r["id"]].prompt)
             for r in rows]
    return report, rows, feats


def _arrays(rows: list[dict], feats: list) -> dict:
    def score(r: dict) -> float:
        v = r["signals"]["mean logprob"]
        return -math.inf if v is None else float(v)

    return {"ids": [r["id"] for r in rows], "x": np.array([f.vector() for f in feats]),
            "tasks": [r["task"] for r in rows], "right": np.array([r["right"] for r in rows], float),
            "agree": np.array([np.nan if r["agree"] is None else float(r["agree"]) for r in rows]),
            "conf": np.array([score(r) for r in rows]), "done_s": np.array([r["done_s"] for r in rows]),
            "cpu_s": np.array([r["cpu_s"] for r in rows]),
            "tokens": np.array([r["prompt_tokens"] for r in rows], float),
            "complexity": np.array([r["complexity"] for r in rows], float)}


def _shown(path: Path) -> str:
    """A result file as the report names it: relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def _load(path: Path) -> dict:
    report, rows, feats = _rows(path)
    return {"report": report, "rows": rows, "features": feats, **_arrays(rows, feats)}


def task_folds(tasks: Sequence[str], seed: int, k: int = FOLDS) -> np.ndarray:
    """Each task's questions shuffled with the seed and dealt into `k` folds (every fold holds every task)."""
    rng = np.random.default_rng(seed)
    arr = np.asarray(tasks)
    out = np.zeros(len(arr), int)
    for task in dict.fromkeys(tasks):
        idx = rng.permutation(np.nonzero(arr == task)[0])
        out[idx] = np.arange(len(idx)) % k
    return out


_L2: list[float | None] = [None]  # None: the trainer's own choice (held-out log loss); tests fix it for speed


def _fit_predict(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray) -> np.ndarray:
    model = fit_router(Outcomes(x_train, y_train, 0, {}), "smollm2", l2=_L2[0])
    z = x_test @ model.weights + model.bias
    return 1 / (1 + np.exp(-(model.platt_a * z + model.platt_b)))


def _cross_fitted(x: np.ndarray, y: np.ndarray, repeats: np.ndarray | None = None) -> np.ndarray:
    """Out-of-fold predictions on the training folds (choosing a cut-off on in-sample ones would flatter it); a
    NaN label is a request without one: never trained on, still predicted for."""
    out = np.zeros(len(y))
    folds = np.arange(len(y)) % FOLDS
    for k in range(FOLDS):
        train = folds != k
        out[folds == k] = _fit_predict(*_labelled(x[train], y[train], None if repeats is None else repeats[train]),
                                       x[folds == k])
    return out


def _labelled(x: np.ndarray, y: np.ndarray, repeats: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The labelled rows, each `repeats` times (a weight: a verified kept answer stands for 1 / verify of them)."""
    keep = ~np.isnan(y)
    reps = np.ones(len(y), int) if repeats is None else repeats
    return np.repeat(x[keep], reps[keep], axis=0), np.repeat(y[keep], reps[keep])


LABELS = ("cascade labels", "graded labels", "agreement labels", "agreement labels, escalations only",
          "agreement labels, escalations + 25 % of kept verified",
          "agreement labels, escalations + 25 % of kept verified, weighted",
          "agreement labels on escalations, cascade labels on kept")
VERIFY = 0.25


def repeats(name: str, conf: np.ndarray, t5: float) -> np.ndarray | None:
    """How many times each request's label counts for `name`: a verified kept answer 1 / VERIFY times when the
    source is weighted, else once (None)."""
    if not name.endswith("weighted"):
        return None
    return np.where(conf < t5, 1, round(1 / VERIFY))


def label_sets(right: np.ndarray, conf: np.ndarray, agree: np.ndarray, t5: float) -> dict[str, np.ndarray]:
    """Each label source's labels (NaN: the request gives none): the cascade's verdict at the cascade-only 5 %
    threshold; the exact checker's; the product's judge on every request (escalations, explorations and
    `router.verify: 1`); the product's judge on escalated requests only (`router.verify: 0`, cold start: training
    on graded labels alone, as `--from-outcomes` does once it has enough); the same with `router.verify: 0.25`
    (a quarter of the kept ones judged too), also with each verified kept answer counted 4 times (`repeats`: it
    stands for the kept ones not verified); and the cascade's verdict on the kept ones with every escalated
    request's cascade label replaced by its graded one."""
    escalated = conf < t5
    verified = np.random.default_rng(len(conf)).random(len(conf)) < VERIFY  # the same draw for the same requests
    return {"cascade labels": (conf >= t5).astype(float), "graded labels": right, "agreement labels": agree,
            "agreement labels, escalations only": np.where(escalated, agree, np.nan),
            "agreement labels, escalations + 25 % of kept verified": np.where(escalated | verified, agree, np.nan),
            "agreement labels, escalations + 25 % of kept verified, weighted":
                np.where(escalated | verified, agree, np.nan),
            "agreement labels on escalations, cascade labels on kept": np.where(escalated, agree, 1.0)}


def _composite(conf: np.ndarray, p: np.ndarray, cut: float) -> np.ndarray:
    return np.where(p > cut, conf, -np.inf)


def choose_cut(conf: np.ndarray, right: np.ndarray, p: np.ndarray, loss: float) -> tuple[float, float]:
    """(cut-off, cascade threshold) keeping the most on the edge within `loss`; of cut-offs keeping as much, the
    lowest: a wider one would skip the edge on requests the data cannot tell apart, at no measured gain."""
    ones = np.ones(len(right))
    best: tuple[float, float, float] | None = None
    for cut in CUTOFFS:
        chosen = kept_at_loss(_composite(conf, p, cut), right, ones, loss)
        if best is None or round(chosen.kept, 6) > round(best[0], 6):
            best = (chosen.kept, cut, chosen.threshold)
    assert best is not None
    return best[1], best[2]


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


def _against(keep: np.ndarray, base_keep: np.ndarray, d: dict) -> dict:
    """Against cascade only at the same loss: the answers it kept that this design did not, and the reverse."""
    tasks = np.asarray(d["tasks"])
    lost, gained = base_keep & ~keep, keep & ~base_keep
    return {"kept_by_cascade_only_not_here": int(lost.sum()),
            "of_them_right": int((lost & (d["right"] == 1)).sum()),
            "lost_by_task": dict(sorted(collections.Counter(tasks[lost].tolist()).items())),
            "kept_here_not_by_cascade_only": int(gained.sum()),
            "gained_by_task": dict(sorted(collections.Counter(tasks[gained].tolist()).items()))}


class _Pooled:
    """One design's decisions, filled fold by fold."""

    def __init__(self, n: int) -> None:
        self.keep = np.zeros(n, bool)
        self.attempted = np.zeros(n, bool)
        self.score = np.zeros(n)
        self.params: list[dict] = []

    def set(self, test: np.ndarray, keep: np.ndarray, attempted: np.ndarray, score: np.ndarray, **params) -> None:
        self.keep[test], self.attempted[test], self.score[test] = keep, attempted, score
        self.params.append({k: round(float(v), 4) for k, v in params.items()})


def run(path: Path, more_mmlu: Sequence[Path] = (), *, mmlu_study: bool = True, l2: float | None = None) -> dict:
    """Every design, cross-validated, on the answers of `path` (`l2`: fixed instead of the trainer's choice)."""
    _L2[0] = l2
    d = _load(path)
    seed = d["report"]["settings"]["seed"]
    n = len(d["right"])
    folds = task_folds(d["tasks"], seed)
    right, conf, x = d["right"], d["conf"], d["x"]
    ones = np.ones(n)
    everyone = np.arange(n)
    pooled: dict[str, _Pooled] = collections.defaultdict(lambda: _Pooled(n))
    cuts: dict[str, list[float]] = collections.defaultdict(list)  # per label source: each fold's cut at 5 %
    t5s: list[float] = []

    for k in range(FOLDS):
        tr, te = folds != k, folds == k
        t5 = kept_at_loss(conf[tr], right[tr], ones[tr], 0.05).threshold
        t5s.append(t5)
        for loss in LOSSES:
            t = kept_at_loss(conf[tr], right[tr], ones[tr], loss).threshold
            pooled[f"cascade only @ {loss:.0%}"].set(te, conf[te] >= t, np.ones(te.sum(), bool), conf[te],
                                                     threshold=t)
        for name, y in label_sets(right, conf, d["agree"], t5).items():
            reps = repeats(name, conf[tr], t5)
            p_in = _cross_fitted(x[tr], y[tr], reps)
            p_te = _fit_predict(*_labelled(x[tr], y[tr], reps), x[te])
            for loss in LOSSES:
                cut, t = choose_cut(conf[tr], right[tr], p_in, loss)
                if loss == 0.05:
                    cuts[name].append(cut)
                pooled[f"router then cascade ({name}) @ {loss:.0%}"].set(
                    te, (p_te > cut) & (conf[te] >= t), p_te > cut, _composite(conf[te], p_te, cut),
                    cutoff=cut, threshold=t)
                t_r = kept_at_loss(p_in, right[tr], ones[tr], loss).threshold
                pooled[f"router only ({name}) @ {loss:.0%}"].set(te, p_te >= t_r, p_te >= t_r, p_te,
                                                                 threshold=t_r)
        for name, score in (("length", -d["tokens"]), ("complexity", -d["complexity"])):
            for loss in LOSSES:
                t = kept_at_loss(score[tr], right[tr], ones[tr], loss).threshold
                keep = score[te] >= t
                pooled[f"{name} only @ {loss:.0%}"].set(te, keep, keep, score[te], threshold=t)

    designs: dict[str, dict] = {}
    order = [f"cascade only @ {loss:.0%}" for loss in LOSSES] + [
        f"{kind} ({name}) @ {loss:.0%}" for name in LABELS for loss in LOSSES
        for kind in ("router then cascade", "router only")] + [
        f"{name} only @ {loss:.0%}" for name in ("length", "complexity") for loss in LOSSES]
    for key in order:
        p = pooled[key]
        loss_name = key.rsplit("@ ", 1)[1]
        row = {**_outcome(p.keep, p.attempted, d, everyone), "apgr": round(apgr(p.score, right, ones), 4),
               "per_fold": p.params}
        if not key.startswith("cascade only"):
            row["against_cascade_only"] = _against(p.keep, pooled[f"cascade only @ {loss_name}"].keep, d)
        designs[key] = row

    return {"command": "python -m bench.cascade.learned", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "source": _shown(path), "requests": n, "folds": FOLDS,
            "mmlu_training_outcomes_per_fold": int(sum(t == "mmlu" for t in d["tasks"]) * (FOLDS - 1) / FOLDS),
            "judge_against_checker": _judge_agreement(d),
            "designs": designs,
            "mmlu_after_outcomes": _mmlu_study(d, folds, t5s, cuts, more_mmlu) if mmlu_study else None,
            "router_inference_ms": _inference_ms(d)}


def _judge_agreement(d: dict) -> dict:
    """How the product's judge (edge answer against the gold one) compares with the exact checker, per task."""
    out: dict = {}
    tasks = np.asarray(d["tasks"])
    for task in [*dict.fromkeys(d["tasks"]), None]:
        m = tasks == task if task is not None else np.ones(len(tasks), bool)
        a, r = d["agree"][m], d["right"][m]
        judged = ~np.isnan(a)
        out[task or "all"] = {"no_verdict": round(float((~judged).mean()), 4),
                              "same_as_checker": round(float((a[judged] == r[judged]).mean()), 4),
                              "agrees_where_checker_wrong": int(((a == 1) & (r == 0)).sum()),
                              "disagrees_where_checker_right": int(((a == 0) & (r == 1)).sum())}
    return out


def _mmlu_study(d: dict, folds: np.ndarray, t5s: list[float], cuts: dict[str, list[float]],
                more: Sequence[Path]) -> dict:
    """The share of held-out MMLU questions the router sends straight to the cloud after N MMLU outcomes."""
    is_mmlu = np.array([t == "mmlu" for t in d["tasks"]])
    other = {k: v[~is_mmlu] if isinstance(v, np.ndarray) else [e for e, m in zip(v, is_mmlu, strict=True) if not m]
             for k, v in d.items() if k in ("ids", "x", "tasks", "right", "conf", "agree")}
    other_folds = folds[~is_mmlu]
    mm = {k: (v[is_mmlu] if isinstance(v, np.ndarray) else [e for e, m in zip(v, is_mmlu, strict=True) if m])
          for k, v in d.items() if k in ("ids", "x", "right", "conf", "agree")}
    sources: list[str] = []
    for extra in more:
        _, rows, feats = _rows(extra)
        a = _arrays(rows, feats)
        new = [i for i, (qid, task) in enumerate(zip(a["ids"], a["tasks"], strict=True))
               if task == "mmlu" and qid not in set(mm["ids"])]
        mm = {"ids": mm["ids"] + [a["ids"][i] for i in new], "x": np.vstack([mm["x"], a["x"][new]]),
              "right": np.r_[mm["right"], a["right"][new]], "conf": np.r_[mm["conf"], a["conf"][new]],
              "agree": np.r_[mm["agree"], a["agree"][new]]}
        sources.append(_shown(extra))
    q = len(mm["ids"])
    rng = np.random.default_rng(1)
    mfold = rng.permutation(q) % FOLDS
    out: dict = {"mmlu_questions": q, "right_share": round(float(mm["right"].mean()), 4), "results": {}}
    for name in ("graded labels", "cascade labels", *LABELS[2:]):  # the first two as before: the same draws
        for count in MMLU_OUTCOMES:
            straight, probs = [], []
            for k in range(FOLDS):
                otr = other_folds != k
                mtr, mte = np.nonzero(mfold != k)[0], np.nonzero(mfold == k)[0]
                draw = rng.choice(mtr, size=count, replace=True)  # repeats, as real traffic has them
                y_other = label_sets(other["right"][otr], other["conf"][otr], other["agree"][otr], t5s[k])[name]
                y_mmlu = label_sets(mm["right"][draw], mm["conf"][draw], mm["agree"][draw], t5s[k])[name]
                # shuffled so that the trainer's own folds (by position) mix MMLU and the rest; N outcomes of
                # MMLU are N requests, of which a label source may label only some (escalations only)
                reps = repeats(name, np.r_[other["conf"][otr], mm["conf"][draw]], t5s[k])
                xs, ys = _labelled(np.vstack([other["x"][otr], mm["x"][draw]]), np.r_[y_other, y_mmlu], reps)
                perm = rng.permutation(len(ys))
                p = _fit_predict(xs[perm], ys[perm], mm["x"][mte])
                straight.append(p <= cuts[name][k])
                probs.append(p)
            s, pr = np.concatenate(straight), np.concatenate(probs)
            out["results"][f"{name}, {count} MMLU outcomes"] = {
                "straight_to_cloud": round(float(s.mean()), 4), "p_median": round(float(np.median(pr)), 4),
                "cutoffs": cuts[name]}
    out["sources"] = sources
    return out


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
    ap.add_argument("--more-mmlu", type=Path, action="append", default=[],
                    help="more bench/cascade answers whose MMLU questions join the MMLU study")
    ap.add_argument("--out", type=Path, default=RESULTS / "cascade-learned-router.json")
    args = ap.parse_args()
    out = run(args.results, args.more_mmlu)
    out["command"] = "python -m bench.cascade.learned" + "".join(f" --more-mmlu {p}" for p in args.more_mmlu)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for name, row in out["designs"].items():
        print(f"{name:48s} " + " ".join(f"{k}={v}" for k, v in row.items() if k not in ("per_fold",)))
    for name, row in out["mmlu_after_outcomes"]["results"].items():
        print(f"MMLU {name}: {row}")
    print("router inference:", out["router_inference_ms"])


if __name__ == "__main__":
    main()
