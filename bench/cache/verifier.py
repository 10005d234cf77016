"""The error bound with the product's cross-encoder verifier, on the labelled pairs (a method of bench.cache.errbound).

The verifier is trained by the product's own code (`cache.training.verifier.train_verifier`, what
`tiergate cache train-verifier` runs) on the calibration half only; the scoring half never trains or tunes it.
Then both halves become streams on the bound score's axis instead of the cosine:

- calibration lookups (the seed): each pair at the bound score of the member that did not train on it
  (`out_of_fold.json`), as `tiergate cache seed-bound --verifier` counts an operator's pairs;
- scoring lookups: the bound score the gateway computes (`cache.pairscore.PairScorer`: both members' mean logit
  for the cached and the asked question, onnxruntime), for every lookup the guards pass at cosine >= the floor.

The trained folder is kept in `.tiergate/bench/verifier-<pairs digest>-<settings>` and reused by later runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.cache.calibrate import Labelled
from bench.cache.pairs import DEFAULT_PAIRS, digest, split
from bench.report import REPO
from tiergate.cache.errbound import FLOOR
from tiergate.cache.keys import normalize_text
from tiergate.cache.pairscore import PairScorer
from tiergate.cache.training.verifier import OUT_OF_FOLD, pair_key, train_verifier

if TYPE_CHECKING:  # errbound runs this module's method: a type only, no import cycle
    from bench.cache.errbound import Stream

__all__ = ["verifier_streams"]

EPOCHS = 1.0
SEED = 12345


def _folder(pairs_file: Path, split_seed: int | None) -> Path:
    """Keyed by the pairs and by the code that trains the members and scores their out-of-fold logits."""
    code = hashlib.sha256(b"".join((REPO / "cache" / f).read_bytes() for f in ("training/verifier.py", "pairscore.py")))
    which = "" if split_seed is None else f"-split{split_seed}"
    return REPO / ".tiergate" / "bench" / f"verifier-{digest(pairs_file)[:12]}-{code.hexdigest()[:8]}-e{EPOCHS:g}-s{SEED}{which}"


def verifier_streams(data: Labelled, cal: Stream, sco: Stream,
                     split_seed: int | None = None) -> tuple[Stream, Stream, dict[str, Any]]:
    """(calibration stream, scoring stream, facts) with each judged lookup's `sim` set to its bound score;
    `split_seed`: the streams are those of that other split (`errbound.streams(data, seed)`), and the verifier
    is trained on its calibration half."""
    pairs = data.pairs
    a = [normalize_text(t) for t in pairs.a]
    b = [normalize_text(t) for t in pairs.b]
    cosine = pairs.cosine.astype(float)
    judged = ~data.vetoed & (cosine >= FLOOR) & (np.array(a) != np.array(b))
    cal_idx, sco_idx = split(len(a)) if split_seed is None else split(len(a), seed=split_seed)
    folder = _folder(DEFAULT_PAIRS, split_seed)
    facts: dict[str, Any] = {"folder": str(folder.relative_to(REPO))}
    if (folder / "verifier.json").is_file():
        facts["trained"] = "reused"
    else:
        started = time.perf_counter()
        train_verifier([a[i] for i in cal_idx], [b[i] for i in cal_idx], pairs.duplicate[cal_idx],
                       cosine[cal_idx], judged[cal_idx], folder, epochs=EPOCHS, seed=SEED,
                       progress=lambda msg: print(f"verifier: {msg}", flush=True))
        facts["trained"] = "this run"
        facts["train_seconds"] = round(time.perf_counter() - started, 1)
    meta = json.loads((folder / "verifier.json").read_text())
    facts |= {k: meta[k] for k in ("trained_on_pairs", "fit_on_judged_pairs", "epochs", "quantization")}
    scorer = PairScorer.load(folder)
    try:
        oof = json.loads((folder / OUT_OF_FOLD).read_text())
        cal_sim = cosine[cal_idx].copy()
        j = np.flatnonzero(judged[cal_idx])
        logits = np.array([oof[pair_key(a[cal_idx[i]], b[cal_idx[i]])] for i in j])
        cal_sim[j] = scorer.combination.bound_scores(cosine[cal_idx][j], logits)
        sco_sim = cosine[sco_idx].copy()
        j = np.flatnonzero(judged[sco_idx])
        entry_is_a = sco.entry == pairs.node_ids()[0][sco_idx]  # the star's hub (the cached question) is `a`
        texts = [(a[k], b[k]) if entry_is_a[i] else (b[k], a[k]) for i, k in ((i, sco_idx[i]) for i in j)]
        started = time.perf_counter()
        logits = scorer.logits(texts)  # one pair per call, as the gateway scores
        facts["scoring_ms_per_lookup"] = round(1000 * (time.perf_counter() - started) / max(len(texts), 1), 2)
        sco_sim[j] = scorer.combination.bound_scores(cosine[sco_idx][j], logits)
    finally:
        scorer.close()
    facts["scored_lookups"] = int(len(j))
    facts["pairs_per_call"] = 1
    return dataclasses.replace(cal, sim=cal_sim), dataclasses.replace(sco, sim=sco_sim), facts

