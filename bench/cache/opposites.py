"""The opposites guard on the labelled pairs: the false hits it removes and the true hits it costs (issue 39).

    .venv/bin/python -m bench.cache.opposites [--pairs FILE] [--write-docs]

On the held-out half of ../shared/data/cache/qqp_pairs_dev.jsonl (the half that never chose anything), at the
shipped threshold, the other four guards on: precision and recall without and with the opposites guard, the
pairs it turns from hit to miss by label (wrong hits removed, right hits lost), what each of the lexicon's
sources adds (WordNet's direct antonyms, its indirect ones, the negating prefixes, the prepositions it lacks),
and whether the calibration rule (`bench.cache.calibrate`: the lowest threshold with precision >= 0.90 on the
calibration half) would pick another threshold with the guard on. Then the opposites the issue reported,
through the product's own scoring path (`SemanticCache.score_many`, what `tiergate cache score-pairs` runs)
with the guard off and on, and the guard's cost per lookup. Raw results: bench/results/cache_opposites.json.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.cache.calibrate import calibrate, score
from bench.cache.pairs import DEFAULT_PAIRS, Pairs, load_pairs, split
from bench.report import RESULTS, machine_facts, machine_line, publish
from tiergate.cache import build_cache
from tiergate.cache.guards import GUARDS, Signature, signature, veto
from tiergate.cache.lexicon import Lexicon, load
from tiergate.cache.settings import DEFAULT_THRESHOLD, CacheSettings
from tiergate.cache.training.export import default_embedder_dir
from tiergate.core.types import CacheRule

OUT = RESULTS / "cache_opposites.json"
HEADING = "## Semantic cache: the opposites guard (bench/cache/opposites)"
OTHERS = tuple(g for g in GUARDS if g != "opposites")
# The issue's reports (and the kinds it names), each pair over the threshold on the cosine alone.
ISSUE_PAIRS = [
    ("What is the maximum daily dose of acetaminophen for adults?",
     "What is the minimum daily dose of acetaminophen for adults?"),
    ("Is it legal to drive barefoot in California?", "Is it illegal to drive barefoot in California?"),
    ("Is it legal to own a pet fox in Texas?", "Is it illegal to own a pet fox in Texas?"),
    ("Is it safe to eat raw cookie dough?", "Is it unsafe to eat raw cookie dough?"),
    ("Is it safe to take ibuprofen during pregnancy?", "Is it unsafe to take ibuprofen during pregnancy?"),
    ("Should I take ibuprofen before meals?", "Should I take ibuprofen after meals?"),
    ("Should metformin be taken before meals or with food?", "Should metformin be taken after meals or with food?"),
    ("How do I sort a list in ascending order in Python?", "How do I sort a list in descending order in Python?"),
    ("How do I sort a dictionary by value in ascending order?",
     "How do I sort a dictionary by value in descending order?"),
    ("Is it possible to run Windows apps on a Mac?", "Is it impossible to run Windows apps on a Mac?"),
    ("How can I increase my metabolism?", "How can I decrease my metabolism?"),
    ("How do I install Docker on Ubuntu?", "How do I uninstall Docker on Ubuntu?"),
]
VARIANTS: dict[str, dict[str, bool]] = {
    "WordNet direct antonyms only": {"indirect": False, "function_words": False, "prefixes": False},
    "+ indirect antonyms (adjective satellites)": {"function_words": False, "prefixes": False},
    "+ negating prefixes": {"function_words": False},
    "+ before/after, over/under, max/min (shipped)": {},
}


def _vetoed(pairs: Pairs, sigs: dict[str, Signature], guards: tuple[str, ...]) -> np.ndarray:
    return np.array([veto(sigs[a], sigs[b], guards) is not None for a, b in zip(pairs.a, pairs.b, strict=True)])


def _sigs(texts: set[str], lex: Lexicon) -> dict[str, Signature]:
    return {t: signature(t, lex) for t in texts}


def accuracy(pairs: Pairs) -> dict[str, Any]:
    cal, held = split(len(pairs.a))
    texts = set(pairs.a) | set(pairs.b)
    started = time.perf_counter()
    full = load()
    load_s = time.perf_counter() - started
    sigs = _sigs(texts, full)
    others = _vetoed(pairs, sigs, OTHERS)
    cos, dup = pairs.cosine, pairs.duplicate
    t = DEFAULT_THRESHOLD
    rows: dict[str, Any] = {}
    removed: dict[str, Any] = {}
    for name, flags in VARIANTS.items():
        lex = load(**flags) if flags else full
        vs = _sigs(texts, lex) if flags else sigs
        opp = _vetoed(pairs, vs, ("opposites",))
        base = (cos >= t) & ~others
        h = held
        rows[name] = score((base & ~opp)[h], dup[h]).__dict__
        turned = base[h] & opp[h]
        issue = sum(veto(signature(a, lex), signature(b, lex), ("opposites",)) is not None for a, b in ISSUE_PAIRS)
        removed[name] = {"wrong_hits_removed": int((turned & ~dup[h]).sum()),
                         "right_hits_lost": int((turned & dup[h]).sum()), "issue_pairs_vetoed": int(issue)}
    before = score(((cos >= t) & ~others)[held], dup[held]).__dict__
    opp = _vetoed(pairs, sigs, ("opposites",))
    turned = ((cos >= t) & ~others & opp)[held]
    examples = {
        "wrong_hits_removed": [[pairs.a[i], pairs.b[i], round(float(cos[i]), 4)]
                               for i in held[turned & ~dup[held]][:10]],
        "right_hits_lost": [[pairs.a[i], pairs.b[i], round(float(cos[i]), 4)]
                            for i in held[turned & dup[held]][:10]],
    }
    per_guard = {g: _vetoed(pairs, sigs, (g,)) for g in GUARDS}
    recal = {}
    for label, guards in (("four guards", OTHERS), ("five guards (with opposites)", GUARDS)):
        threshold, _, cal_score = calibrate(pairs, cal, 0.90, [guards], per_guard)
        vetoed = np.zeros(len(pairs.a), bool)
        for g in guards:
            vetoed |= per_guard[g]
        recal[label] = {"threshold": threshold, "calibration": cal_score.__dict__,
                        "held_out": score(((cos >= threshold) & ~vetoed)[held], dup[held]).__dict__}
    sample = list(texts)[:2000]
    started = time.perf_counter()
    for text in sample:
        signature(text, full)
    per_signature_us = (time.perf_counter() - started) / len(sample) * 1e6
    return {"threshold": t, "held_out_pairs": len(held), "duplicates": int(dup[held].sum()),
            "without_opposites": before, "with_opposites": rows, "turned_to_miss": removed,
            "examples": examples, "recalibrated": recal, "lexicon": {
                "load_s": round(load_s, 2), "words_with_antonyms": len(full.antonyms),
                "signature_us": round(per_signature_us, 1)}}


async def _product(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """The issue's pairs through `SemanticCache.score_many` (the CLI's score-pairs), the guard off, then on."""
    out: dict[str, Any] = {}
    for label, guards in (("four guards", OTHERS), ("five guards (with opposites)", GUARDS)):
        cache = build_cache(None, default_embedder_dir(), settings=CacheSettings(guards=guards))
        await cache.start()
        try:
            scores = await cache.score_many(pairs, CacheRule(threshold=DEFAULT_THRESHOLD))
        finally:
            await cache.stop()
        out[label] = [{"a": a, "b": b, "hit": s.hit, "similarity": round(s.similarity, 4), "reason": s.reason}
                      for (a, b), s in zip(pairs, scores, strict=True)]
    return out


def render(report: dict[str, Any], out: Path) -> str:
    acc = report["accuracy"]
    n_issue = len(report["issue_pairs"]["four guards"])
    over = [r for r in report["issue_pairs"]["four guards"] if r["similarity"] >= acc["threshold"]]
    hits = {k: sum(r["hit"] for r in v) for k, v in report["issue_pairs"].items()}
    lines = [
        f"Command: `.venv/bin/python -m bench.cache.opposites --write-docs` ({report['date']}). Raw results: "
        f"`{out.relative_to(out.parents[2])}`. {report['machine']}",
        "",
        "Why: sentence embeddings put a question and its opposite side by side (issue 39: \"maximum\" / \"minimum\" "
        "daily dose at 0.958, legal / illegal 0.98); the `opposites` guard (`cache/guards.py`, words from "
        "WordNet 3.0 in `cache/lexicon.py`) vetoes a semantic hit when a word only one side has is the opposite "
        "of a word of the other side.",
        "",
        f"The issue's opposites through the product's scoring path (`tiergate cache score-pairs`, threshold "
        f"{acc['threshold']}): {len(over)} of {n_issue} pairs are over the threshold on the cosine alone; hits with "
        f"the four other guards: **{hits['four guards']}**, with the opposites guard: "
        f"**{hits['five guards (with opposites)']}**.",
        "",
        f"Held-out half of `qqp_pairs_dev.jsonl` ({acc['held_out_pairs']} pairs, {acc['duplicates']} duplicates), "
        f"cosine >= {acc['threshold']}, the four other guards on; each row adds one source of opposites:",
        "",
        f"| rule | precision | recall | hits | wrong hits removed | right hits lost | issue's pairs vetoed "
        f"(of {n_issue}) |",
        "|---|---|---|---|---|---|---|",
        f"| without the opposites guard | {acc['without_opposites']['precision']:.4f} | "
        f"{acc['without_opposites']['recall']:.4f} | {acc['without_opposites']['hits']} | | | 0 |",
    ]
    for name, row in acc["with_opposites"].items():
        t = acc["turned_to_miss"][name]
        lines.append(f"| {name} | {row['precision']:.4f} | {row['recall']:.4f} | {row['hits']} | "
                     f"{t['wrong_hits_removed']} | {t['right_hits_lost']} | {t['issue_pairs_vetoed']} |")
    last = acc["with_opposites"][list(VARIANTS)[-1]]
    t = acc["turned_to_miss"][list(VARIANTS)[-1]]
    lines += ["", f"What it means: the reported kind of false hit is gone ({hits['five guards (with opposites)']} of "
                  f"{len(over)} issue pairs over the threshold still hit; the WordNet rows alone catch "
                  f"{acc['turned_to_miss'][list(VARIANTS)[0]]['issue_pairs_vetoed']}, the negating prefixes add "
                  "safe/unsafe and install/uninstall, the prepositions before/after), for "
                  f"{acc['without_opposites']['recall'] - last['recall']:.4f} of recall "
                  f"({acc['without_opposites']['hits'] - last['hits']} of {acc['without_opposites']['hits']} held-out "
                  f"hits). These labelled pairs hold few opposites: the guard removes {t['wrong_hits_removed']} wrong "
                  f"hits there and turns {t['right_hits_lost']} pairs labelled duplicate into misses, several of which "
                  "do ask the opposite (sell / buy, least / most: label noise, as in docs/cache.md). A miss costs one "
                  "tier request; a dosage question answered with its opposite is a safety defect, so the guard is on "
                  "by default whatever these labels say, and the threshold stays 0.94 (the calibration rule picks it "
                  "with or without the guard)."]
    lines += ["", "The calibration rule (lowest threshold whose precision on the calibration half is >= 0.90), "
                  "scored on the held-out half:", "",
              "| guards | threshold | calibration precision / recall | held-out precision / recall |",
              "|---|---|---|---|"]
    for name, r in acc["recalibrated"].items():
        lines.append(f"| {name} | {r['threshold']} | {r['calibration']['precision']:.3f} / "
                     f"{r['calibration']['recall']:.3f} | {r['held_out']['precision']:.3f} / "
                     f"{r['held_out']['recall']:.3f} |")
    lex = acc["lexicon"]
    lines += ["", f"Cost: the lexicon loads once per process in {lex['load_s']} s (at cache start, off the event "
                  f"loop; {lex['words_with_antonyms']} words have opposites); a signature, guards included, takes "
                  f"{lex['signature_us']} µs (a lookup makes one per candidate, 4 at most, plus the request's).", "",
              "Pairs it turned from hit to miss on the held-out half, labelled not duplicate (first ones):", ""]
    lines += [f"- \"{a}\" / \"{b}\" ({c})" for a, b, c in acc["examples"]["wrong_hits_removed"][:6]]
    lines += ["", "and labelled duplicate (first ones):", ""]
    lines += [f"- \"{a}\" / \"{b}\" ({c})" for a, b, c in acc["examples"]["right_hits_lost"][:6]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default=str(DEFAULT_PAIRS))
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    before = machine_facts()
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "accuracy": accuracy(load_pairs(Path(args.pairs))),
                              "issue_pairs": asyncio.run(_product(ISSUE_PAIRS))}
    report["machine"] = machine_line(before, machine_facts())
    publish(report, OUT, render, HEADING if args.write_docs else None)


if __name__ == "__main__":
    main()
