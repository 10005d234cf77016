"""Error-bounded hits on the labelled question pairs: does the measured false-hit rate stay within the bound?

    .venv/bin/python -m bench.cache --only errbound

The pairs (`qqp_pairs_dev.jsonl`) are split as everywhere in bench/cache (`pairs.split`: the calibration half
chose the shipped threshold; the other half only scores). Within each half the pairs become a stream of cache
requests: a question that appears in several pairs is one cached entry, looked up once per pair by the other
question (a greedy star decomposition: the question with the most unassigned pairs becomes an entry first), and
the lookups are replayed in a seeded random order (20 orders).

Each lookup goes through the product's own decision (`cache.verify.Verifier` and `cache.errbound.ErrorBound`,
the objects `SemanticCache` uses after the guards), with the cosine the shipped int8 MiniLM gives, the two
questions' word overlap and the guards' verdict (`cache.guards`: a vetoed lookup is a miss). A verified would-be hit or a judged near miss
gets the pair's label as its verdict: the judge is assumed right (a real judge's errors add to the rate).
Simplification: a lookup is judged against its own entry only (the pairs' labels are all there is).

- "bounded, calibrated": the calibration half's labelled lookups seed the counts first (`ErrorBound.seed`, what
  an operator does with labelled pairs of their own), then the scoring half is replayed;
- "bounded, cold": no seed (the product's default start: no semantic hit until the evidence certifies one);
- "bounded, calibrated, one region": as "bounded, calibrated" with every lookup's overlap taken as 1.0, so the
  error bound keeps one cosine cutoff (what it did before 2026-11-26): what the overlap regions add;
- "bounded, calibrated, shadow checks": as "bounded, calibrated" with `verify_mode: shadow`: a would-be hit
  sampled for verification is served (and counts as a served hit, right or wrong) while the tier is asked too;
- "bounded, calibrated, cross-encoder verifier": as "bounded, calibrated" on the bound score of the product's
  optional verifier instead of the cosine (`bench.cache.verifier`: trained on the calibration half only);
- "fixed, chosen on calibration": the lowest cosine threshold (0.0025 grid, guards on, >= 50 hits) whose
  false-hit rate on the calibration half is within the bound, applied to the scoring half;
- "best fixed at the same false-hit rate": the highest recall of any fixed threshold whose false-hit rate on
  the scoring half itself is at most the bounded method's (chosen in hindsight: not achievable in practice).

Definitions: false-hit rate = wrong served hits / served hits; recall = right served hits / duplicate-labelled
lookups; verified = would-be hits whose answer was compared with the tier's (extra tier calls; with shadow
checks the hit is served as well) / lookups; judged = near misses whose tier answer was compared / lookups.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import random
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from prometheus_client import CollectorRegistry

from bench.cache import ceiling
from bench.cache.calibrate import Labelled, labelled
from bench.cache.pairs import split
from bench.cache.verifier import verifier_streams
from tiergate.cache.keys import RequestKey
from tiergate.cache.metrics import CacheMetrics
from tiergate.cache.settings import CacheSettings
from tiergate.cache.shared import MemoryShared
from tiergate.cache.store import MemoryStore
from tiergate.cache.types import CachedAnswer, CacheEntry, CacheHit
from tiergate.cache.verify import LookupResult, Verifier
from tiergate.core.types import CacheRule

BOUNDS = (0.02, 0.05, 0.10, 0.15, 0.20)
ORDERS = 20  # replay orders: enough to see how often one order's rate crosses the bound
SPLITS = 10  # other random calibration / scoring splits of the pairs, to tell a method's edge from one split's luck
SPLIT_ORDERS = 3  # replay orders per other split
SPLIT_SEEDS = 1000  # the other splits' seeds: 1000, 1001, ...
VERIFIER_SPLITS = 6  # of those, the first ones also with the verifier (each trains its own)
VERIFY_RATE = 0.03
TENANT = "bench"


@dataclass
class Stream:
    entry: np.ndarray  # node id of the cached question
    query: np.ndarray  # node id of the asking question
    sim: np.ndarray
    overlap: np.ndarray  # `cache.guards.overlap` of the two questions
    dup: np.ndarray
    vetoed: np.ndarray

    def take(self, idx: np.ndarray) -> Stream:
        return Stream(self.entry[idx], self.query[idx], self.sim[idx], self.overlap[idx], self.dup[idx],
                      self.vetoed[idx])

    def one_region(self) -> Stream:
        return Stream(self.entry, self.query, self.sim, np.ones(len(self)), self.dup, self.vetoed)

    def __len__(self) -> int:
        return len(self.sim)


def star_hubs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For each pair, which of its two questions is the entry (the hub of its star). Deterministic."""
    n_nodes = int(max(a.max(), b.max())) + 1
    adj: list[list[int]] = [[] for _ in range(n_nodes)]
    for p, (x, y) in enumerate(zip(a.tolist(), b.tolist(), strict=True)):
        adj[x].append(p)
        adj[y].append(p)
    remaining = np.array([len(x) for x in adj])
    hub = np.full(len(a), -1)
    heap = [(-int(d), v) for v, d in enumerate(remaining) if d > 0]
    heapq.heapify(heap)
    while heap:
        negd, v = heapq.heappop(heap)
        if remaining[v] == 0:
            continue
        if -negd != remaining[v]:
            heapq.heappush(heap, (-int(remaining[v]), v))
            continue
        for p in adj[v]:
            if hub[p] == -1:
                hub[p] = v
                remaining[b[p] if a[p] == v else a[p]] -= 1
        remaining[v] = 0
    return hub


def streams(data: Labelled, seed: int | None = None) -> tuple[Stream, Stream, dict[str, Any]]:
    """(calibration stream, scoring stream, their statistics); `seed`: another random split than the fixed one."""
    pairs, vetoed, shared = data.pairs, data.vetoed, data.overlap
    a, b = pairs.node_ids()
    out, stats = [], {}
    halves = split(len(a)) if seed is None else split(len(a), seed=seed)
    for name, idx in zip(("calibration", "scoring"), halves, strict=True):
        hub = star_hubs(a[idx], b[idx])
        query = np.where(hub == a[idx], b[idx], a[idx])
        s = Stream(hub, query, pairs.cosine[idx].astype(float), shared[idx], pairs.duplicate[idx].astype(bool),
                   vetoed[idx])
        lookups = np.unique(hub, return_counts=True)[1]
        stats[name] = {"lookups": len(s), "duplicates": int(s.dup.sum()), "entries": int(len(lookups)),
                       "lookups_on_entries_with_2_or_more": int(lookups[lookups >= 2].sum()),
                       "vetoed_share": round(float(s.vetoed.mean()), 3)}
        out.append(s)
    return out[0], out[1], stats


# -- fixed thresholds -----------------------------------------------------------------------------------------------
_GRID = np.round(np.arange(0.80, 1.0, 0.0025), 4)


def _fixed(s: Stream, t: float) -> tuple[int, int]:
    hit = ~s.vetoed & (s.sim >= t)
    return int(hit.sum()), int((hit & s.dup).sum())


def fixed_for(s: Stream, delta: float, min_hits: int = 50) -> float | None:
    for t in _GRID:  # ascending: the first within the bound has the most recall
        n, tp = _fixed(s, float(t))
        if n >= min_hits and (n - tp) / n <= delta:
            return float(t)
    return None


def score_fixed(s: Stream, t: float | None) -> dict[str, Any]:
    if t is None:
        return {"threshold": None, "served": 0, "fhr": None, "recall": 0.0}
    n, tp = _fixed(s, t)
    return {"threshold": t, "served": n, "fhr": round((n - tp) / n, 4) if n else None,
            "recall": round(tp / int(s.dup.sum()), 4)}


def best_fixed_recall(s: Stream, fhr: float | None, min_hits: int = 50) -> tuple[float, float | None]:
    """(recall, threshold) of the best fixed threshold whose false-hit rate on `s` is at most `fhr`."""
    best: tuple[float, float | None] = (0.0, None)
    if fhr is None:
        return best
    for t in _GRID:
        n, tp = _fixed(s, float(t))
        if n >= min_hits and (n - tp) / n <= fhr + 1e-12 and tp / int(s.dup.sum()) > best[0]:
            best = (round(tp / int(s.dup.sum()), 4), float(t))
    return best


# -- the product's decision, replayed -----------------------------------------------------------------------------
class _LabelJudge:
    """The pair's label as the verdict: a judge that is always right."""

    def __init__(self) -> None:
        self.truth = True

    async def same(self, question: str, cached: str, fresh: str) -> bool | None:
        return self.truth


async def replay(s: Stream, delta: float, *, seed: int, warm: Stream | None,
                 mode: Literal["tier", "shadow"] = "tier") -> dict[str, Any]:
    settings = CacheSettings()
    judge = _LabelJudge()
    verifier = Verifier(MemoryStore(None, max_entries=1), MemoryShared(1e9, 1e9), judge, settings,  # type: ignore[arg-type]
                        CacheMetrics(CollectorRegistry()))
    verifier.errbound._rng = random.Random(seed)
    if warm is not None:
        ok = ~warm.vetoed
        verifier.errbound.seed(TENANT, warm.sim[ok], warm.overlap[ok], ~warm.dup[ok])
    rule = CacheRule(threshold=0.94, max_false_hit_rate=delta, verify_rate=VERIFY_RATE, verify_mode=mode)
    served = wrong = verified = judged = 0
    for i in range(len(s)):
        if s.vetoed[i]:
            continue
        e = int(s.entry[i])
        key = RequestKey(TENANT, "t", "ns", f"q{i}", f"question {int(s.query[i])}", True, None)
        answer = CachedAnswer("chat", f"answer {e}", "stop", "m", "edge")
        entry = CacheEntry(f"t-e{e}", TENANT, "ns", f"question {e}", answer)
        sim, shared = float(s.sim[i]), float(s.overlap[i])
        hit = LookupResult(CacheHit(answer, "hit-semantic", sim, entry.id, "ns", shared), "hit-semantic", key=key)
        res = await verifier.decide(key, entry, sim, shared, rule, hit)
        if res.status == "hit-semantic":  # a shadow-checked one too
            served += 1
            wrong += not s.dup[i]
        if res.reason in ("verify", "judge"):
            verified += res.reason == "verify"
            judged += res.reason == "judge"
            judge.truth = bool(s.dup[i])
            await verifier.settle(key, CachedAnswer("chat", "the tier's answer", "stop", "m", "edge"))
    dups = int(s.dup.sum())
    final = [None if math.isinf(c) else c for c in verifier.errbound.cutoffs(TENANT, delta).tolist()]
    return {"served": served, "fhr": round(wrong / served, 4) if served else None,
            "recall": round((served - wrong) / dups, 4), "verified_share": round(verified / len(s), 4),
            "judged_share": round(judged / len(s), 4), "final_cutoffs": final}


def _mean(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in rows[0]:
        if isinstance(rows[0][k], list):  # the final cutoffs: per order
            out[k] = [r[k] for r in rows]
            continue
        vals = [r[k] for r in rows if r[k] is not None]
        out[k] = round(float(np.mean(vals)), 4) if vals else None
        if k == "fhr" and vals:
            out["fhr_min_max"] = [round(min(vals), 4), round(max(vals), 4)]
            out["fhr_per_order"] = vals
    out["served"] = round(float(np.mean([r["served"] for r in rows])), 1)
    out["orders"] = len(rows)
    return out


def _replayed(s: Stream, delta: float, perms: list[np.ndarray], warm: Stream | None,
              mode: Literal["tier", "shadow"] = "tier") -> dict[str, Any]:
    """`s` replayed in each order of `perms` under the bound `delta`, averaged over the orders."""
    return _mean([asyncio.run(replay(s.take(p), delta, seed=k, warm=warm, mode=mode)) for k, p in enumerate(perms)])


def _split_row(sco: Stream, res: dict[str, Any]) -> dict[str, Any]:
    """One split's row for a method: its mean and worst order's false-hit rate and its recall, beside the
    recall of the best fixed cosine threshold chosen in hindsight on `sco` at that rate."""
    return {"fhr": res["fhr"], "fhr_max": res["fhr_min_max"][1] if res["fhr"] is not None else None,
            "recall": res["recall"], "hindsight_recall": best_fixed_recall(sco, res["fhr"])[0]}


def across_splits(data: Labelled, bounds: tuple[float, ...] = BOUNDS, splits: int = SPLITS,
                  orders: int = SPLIT_ORDERS, verifier_splits: int = VERIFIER_SPLITS) -> dict[str, Any]:
    """The calibrated bound and both fixed baselines on other random halves of the pairs.

    On one split the hindsight threshold is the best point of a jagged curve (near the top, one 0.0025 step
    moves recall by 6 % while the false-hit rate moves by a tenth of a point), so one split cannot tell whether
    the bound trails it or that split's luck does; the same comparison over several splits can. The first
    `verifier_splits` splits also replay the bound with the cross-encoder verifier, trained on each split's own
    calibration half (`bench.cache.verifier`)."""
    per: dict[float, list[dict[str, Any]]] = {d: [] for d in bounds}
    for k in range(splits):
        cal, sco, _ = streams(data, seed=SPLIT_SEEDS + k)
        rng = np.random.default_rng(7)
        perms = [rng.permutation(len(sco)) for _ in range(orders)]
        verified = verifier_streams(data, cal, sco, SPLIT_SEEDS + k) if k < verifier_splits else None
        for d in bounds:
            fixed = score_fixed(sco, fixed_for(cal, d))
            row = {"seed": SPLIT_SEEDS + k, **_split_row(sco, _replayed(sco, d, perms, cal)),
                   "fixed_fhr": fixed["fhr"], "fixed_recall": fixed["recall"]}
            if verified is not None:
                row["verifier"] = _split_row(sco, _replayed(verified[1], d, perms, verified[0]))
            per[d].append(row)
        print(f"errbound: split {k + 1} of {splits} done", flush=True)
    return {"splits": splits, "orders": orders, "verifier_splits": min(verifier_splits, splits),
            "rows": [{"bound": d, "per_split": per[d]} for d in bounds]}


def methods(sco: Stream, cal: Stream) -> list[tuple[str, Stream, Stream | None, Literal["tier", "shadow"]]]:
    """(name, scored stream, seed stream, verify_mode) of each bounded method the table replays."""
    return [("bounded_calibrated", sco, cal, "tier"), ("bounded_cold", sco, None, "tier"),
            ("bounded_calibrated_one_region", sco.one_region(), cal.one_region(), "tier"),
            ("bounded_calibrated_shadow", sco, cal, "shadow")]


LABELS = {"bounded_calibrated": "bounded, calibrated", "bounded_cold": "bounded, cold",
          "bounded_calibrated_one_region": "bounded, calibrated, one region",
          "bounded_calibrated_shadow": "bounded, calibrated, shadow checks",
          "bounded_calibrated_verifier": "bounded, calibrated, cross-encoder verifier"}


def run(bounds: tuple[float, ...] = BOUNDS, orders: int = ORDERS) -> dict[str, Any]:
    data = labelled()
    cal, sco, stats = streams(data)
    rng = np.random.default_rng(7)
    perms = [rng.permutation(len(sco)) for _ in range(orders)]
    cal_order = np.random.default_rng(8).permutation(len(cal))
    out: dict[str, Any] = {"streams": stats, "verify_rate": VERIFY_RATE, "orders": orders, "rows": []}
    cal_v, sco_v, out["verifier"] = verifier_streams(data, cal, sco)
    print(f"errbound: verifier {out['verifier']}", flush=True)
    for delta in bounds:
        t_cal = fixed_for(cal.take(cal_order), delta)
        row: dict[str, Any] = {"bound": delta, "fixed_calibrated": score_fixed(sco, t_cal)}
        for name, stream, warm, mode in [*methods(sco, cal), ("bounded_calibrated_verifier", sco_v, cal_v, "tier")]:
            res = _replayed(stream, delta, perms, warm, mode)
            res["best_fixed_recall_at_same_fhr"], res["best_fixed_threshold"] = best_fixed_recall(sco, res["fhr"])
            if stream is sco_v:  # also a fixed threshold on the verifier's own score, chosen in hindsight
                res["best_fixed_on_score"] = best_fixed_recall(sco_v, res["fhr"])
            res["orders_over"] = sum(f > delta for f in res.get("fhr_per_order", []))
            row[name] = res
        out["rows"].append(row)
        print(f"errbound: bound {delta}: {row}", flush=True)
    out["ceiling"] = ceiling.run(bounds, data)
    out["splits"] = across_splits(data, bounds)
    return out


def render(eb: dict[str, Any], command: str, when: str, machine: str = "") -> list[str]:
    st = eb["streams"]
    lines = ["### Error-bounded hits on the labelled pairs", "",
             (f"Command: `{command}` ({when}); raw results: `bench/results/cache.json` (`errbound`). {machine} "
              f"Scoring half: {st['scoring']['lookups']:,} lookups of {st['scoring']['entries']:,} entries "
              f"({st['scoring']['duplicates']:,} labelled duplicate; {st['scoring']['vetoed_share']:.0%} vetoed by "
              f"the guards); calibration half: {st['calibration']['lookups']:,} lookups. Means over "
              f"{eb['orders']} replay orders (false-hit rate: min-max); verify rate {eb['verify_rate']:g}, judge "
              "band 0.05, the label as the judge's verdict. \"bounded\": the product's decision, a cutoff per word-overlap "
              "region (`cache.errbound`); \"one region\": the same with every lookup's overlap taken as 1.0, one cosine "
              "cutoff (the error bound before 2026-11-26); \"calibrated\": the calibration half's labels counted first, "
              "\"cold\": not; \"shadow checks\": `verify_mode: shadow`, a hit sampled for verification is served "
              "while the tier is asked too (the default sends it to the tier instead); best fixed threshold: chosen "
              "in hindsight on the scored half itself."), "",
             ("| bound | method | served hits | false-hit rate | recall | verified / judged share | "
              "best fixed threshold at that false-hit rate: recall (threshold) |"),
             "|---|---|---|---|---|---|---|"]
    for row in eb["rows"]:
        d = row["bound"]
        f = row["fixed_calibrated"]
        fhr = "-" if f["fhr"] is None else f"{f['fhr']:.3f}" + (" **over**" if f["fhr"] > d else "")
        t = "none reaches it" if f["threshold"] is None else f"t = {f['threshold']}"
        lines.append(f"| {d:.0%} | fixed, chosen on calibration ({t}) | {f['served']} | {fhr} | {f['recall']:.3f} | "
                     "- | - |")
        for name, label in LABELS.items():
            r = row.get(name)
            if r is None:  # a run before the regions (or the shadow checks)
                continue
            if r["fhr"] is None:
                fhr = "- (nothing served)"
            else:
                lo, hi = r["fhr_min_max"]
                fhr = f"{r['fhr']:.3f} ({lo:.3f}-{hi:.3f})" + (
                    f" **over** in {r['orders_over']} of {r['orders']}" if hi > d else "")
            best = "-" if r["fhr"] is None else f"{r['best_fixed_recall_at_same_fhr']:.3f} ({r['best_fixed_threshold']})"
            lines.append(f"| {d:.0%} | {label} | {r['served']:g} | {fhr} | {r['recall']:.3f} | "
                         f"{r['verified_share']:.3f} / {r['judged_share']:.3f} | {best} |")
    if "verifier" in eb:  # runs before 2026-11-27 have none
        lines += render_verifier(eb)
    if "ceiling" in eb:  # runs before 2026-11-26 (third session) have none
        lines += ceiling.render(eb["ceiling"])
    if "splits" in eb:  # runs before 2026-11-26 (fourth session) have none
        lines += render_splits(eb["splits"])
    return lines


def render_verifier(eb: dict[str, Any]) -> list[str]:
    v = eb["verifier"]
    trained = (f"trained by this run in {v['train_seconds']:.0f} s" if v["trained"] == "this run"
               else f"trained by an earlier run of the same code and reused from `{v['folder']}`")
    scored = (", one pair per call as in the gateway" if v.get("pairs_per_call") == 1 else
              ", but in batches of 64, seeds too: int8 members quantise over the batch, so those scores are not "
              "exactly the gateway's (one pair per call); **to be measured again**")
    rows = [(r["bound"], r["bounded_calibrated_verifier"]) for r in eb["rows"]
            if r.get("bounded_calibrated_verifier", {}).get("fhr") is not None]
    fixed = "; ".join(f"{d:.0%}: {r['best_fixed_on_score'][0]:.3f}" for d, r in rows if "best_fixed_on_score" in r)
    return ["", ("\"cross-encoder verifier\": the product's optional verifier (`cache.pairscore`), trained by "
                 f"`cache.training.verifier` (what `tiergate cache train-verifier` runs) on the {v['trained_on_pairs']:,} "
                 f"calibration pairs only ({v['epochs']:g} epoch, two members, {v['quantization']}; {trained}); "
                 f"the calibration lookups are counted at their out-of-fold scores ({v['fit_on_judged_pairs']:,} "
                 f"judged), the {v['scored_lookups']:,} judged scoring lookups at the score the gateway computes "
                 f"({v['scoring_ms_per_lookup']:g} ms per lookup here, both members{scored}). Its best fixed "
                 "threshold column is still the cosine's; a fixed threshold on the verifier's own score, chosen in "
                 f"hindsight at the same false-hit rate, reaches recall {fixed or '-'}.")]


def render_splits(sp: dict[str, Any]) -> list[str]:
    lines = ["", (f"Across {sp['splits']} other random splits of the pairs into calibration and scoring halves (same "
                  f"run and raw results, `errbound.splits`; {sp['orders']} replay orders each): \"bounded, calibrated\" "
                  "beside the best fixed threshold chosen in hindsight on each scoring half at the rate the bound kept "
                  "there, and beside the fixed threshold an operator would choose on the calibration half "
                  "(\"fixed, chosen on calibration\" above)."), "",
             ("| bound | bounded: false-hit rate, mean (range of splits) | recall, mean | hindsight fixed at that rate: "
              "recall, mean | bounded ÷ hindsight: mean (range), splits higher | fixed chosen on calibration: "
              "false-hit rate, mean (range), splits over | its recall, mean |"),
             "|---|---|---|---|---|---|---|"]
    for row in sp["rows"]:
        d, per = row["bound"], row["per_split"]
        n = len(per)
        bounded, recall, hindsight, ratio = _against_hindsight(per, d)
        fixed_rates = [r["fixed_fhr"] for r in per if r["fixed_fhr"] is not None]
        if fixed_rates:
            over = sum(x > d for x in fixed_rates)
            fixed = f"{_spread(fixed_rates)}, " + (f"**over** in {over} of {n}" if over else f"over in none of {n}")
        else:
            fixed = "- (none reaches it)"
        lines.append(f"| {d:.0%} | {bounded} | {recall} | {hindsight} | {ratio} | {fixed} | "
                     f"{np.mean([r['fixed_recall'] for r in per]):.3f} |")
    if sp.get("verifier_splits"):  # runs before 2026-11-27 have none
        lines += ["", (f"The cross-encoder verifier on the first {sp['verifier_splits']} of those splits (same run and "
                       "raw results, `per_split[].verifier`; trained on each split's calibration half, seeded with "
                       "its out-of-fold scores, the same replay orders), beside the best fixed cosine threshold "
                       "chosen in hindsight on each scoring half at the rate it kept there."), "",
                  ("| bound | verifier: false-hit rate, mean (range of splits) | recall, mean | hindsight fixed cosine "
                   "at that rate: recall, mean | verifier ÷ hindsight: mean (range), splits higher |"),
                  "|---|---|---|---|---|"]
        for row in sp["rows"]:
            per = [r["verifier"] for r in row["per_split"] if "verifier" in r]
            lines.append("| {:.0%} | {} | {} | {} | {} |".format(row["bound"], *_against_hindsight(per, row["bound"])))
    return lines


def _against_hindsight(per: list[dict[str, Any]], d: float) -> tuple[str, str, str, str]:
    """(false-hit rate over the splits, mean recall, mean hindsight recall, ratio) of one method at bound d."""
    served = [r for r in per if r["fhr"] is not None]
    if not served:
        return "- (nothing served)", "0", "-", "-"
    over = sum(r["fhr_max"] > d for r in served)
    bounded = _spread([r["fhr"] for r in served]) + (f", an order **over** in {over} of {len(per)} splits" if over else "")
    ratios = [r["recall"] / r["hindsight_recall"] for r in served if r["hindsight_recall"] > 0]
    ratio = f"{_spread(ratios)}, {sum(x > 1 for x in ratios)} of {len(ratios)}" if ratios else "-"
    return (bounded, f"{np.mean([r['recall'] for r in per]):.3f}",
            f"{np.mean([r['hindsight_recall'] for r in served]):.3f}", ratio)


def _spread(values: list[float]) -> str:
    """Mean (min-max)."""
    return f"{np.mean(values):.3f} ({min(values):.3f}-{max(values):.3f})"
