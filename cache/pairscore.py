"""A second opinion for error-bounded hits: a cross-encoder reads the cached and the asked question together.

The cosine of two embeddings is computed from each question alone; a cross-encoder (MiniLM fine-tuned on an
operator's labelled pairs, `tiergate cache train-verifier`) reads both at once and sees what the cosine
misses ("convert A to B" against "B to A"). On the labelled pairs, combined with the cosine, it is the one
signal measured that lets more right hits through at the same false-hit rate (docs/cache.md).

For a rule with `max_false_hit_rate`, the best candidate that passed the guards gets a *bound score* in
place of its cosine: the probability of a right hit from a logistic fit of (cosine, cross-encoder logit),
mapped through that fit's own distribution on the training pairs onto the error bound's axis
[`cache.errbound.FLOOR`, 1), so that each of the bound's cells holds an equal share of the candidates.
`cache.errbound` then learns its cutoffs on that axis exactly as it does on the cosine; the
`x-tiergate-cache-similarity` header still says the cosine.

The verifier folder holds `verifier.json` (the fit, the quantiles, the members), `tokenizer.json` and one ONNX
graph per member: the members were trained on the two halves of the pairs (each pair's evidence was scored
by the member that had not seen it), and a lookup takes the mean of their logits. onnxruntime, one thread,
no torch.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from tiergate.cache.errbound import FLOOR

__all__ = ["MANIFEST", "Combination", "PairScorer", "VerifierError"]

MANIFEST = "verifier.json"


class VerifierError(RuntimeError):
    """The verifier folder cannot be used; the message says what is wrong with which file."""


@dataclass(frozen=True, slots=True)
class Combination:
    """(cosine, mean logit) → bound score: the logistic fit and the quantiles of its probability."""

    coef_cosine: float
    coef_logit: float
    intercept: float
    quantiles: np.ndarray  # ascending probabilities of the training candidates (equal shares between them)

    def bound_scores(self, cosine: np.ndarray, logit: np.ndarray) -> np.ndarray:
        z = self.coef_cosine * np.asarray(cosine, float) + self.coef_logit * np.asarray(logit, float) + self.intercept
        p = 1.0 / (1.0 + np.exp(-z))
        share = np.searchsorted(self.quantiles, p, side="right") / len(self.quantiles)
        return FLOOR + (1.0 - FLOOR) * np.minimum(share, 1.0 - 1e-9)  # < 1.0: inside the bound's last cell

    def to_json(self) -> dict[str, object]:
        return {"coef_cosine": self.coef_cosine, "coef_logit": self.coef_logit, "intercept": self.intercept,
                "quantiles": [round(float(q), 6) for q in self.quantiles]}

    @classmethod
    def from_json(cls, obj: dict[str, object]) -> Combination:
        q = np.asarray(obj["quantiles"], float)
        if q.ndim != 1 or len(q) < 2 or not np.all(np.diff(q) >= 0):
            raise ValueError("quantiles must be an ascending list of at least 2 probabilities")
        return cls(float(obj["coef_cosine"]), float(obj["coef_logit"]), float(obj["intercept"]),  # type: ignore[arg-type]
                   q)


class PairScorer:
    """The members' mean logit for (cached question, asked question) pairs, and the bound score from it."""

    def __init__(self, members: list[object], tokenizer: Tokenizer, combination: Combination, *,
                 path: Path | None = None, axis: str = "verifier") -> None:
        self._members = members  # onnxruntime.InferenceSession
        self._tok = tokenizer
        self.combination = combination
        self.path = path
        # Which scale the bound scores are on (a digest of the manifest): the error bound keeps the evidence of
        # each scale apart, so a retrained verifier starts from its own seed, not from its predecessor's counts.
        self.axis = axis
        # One worker: a lookup waits for its pair, not for a pool; onnxruntime releases the GIL meanwhile.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tiergate-verifier")

    @classmethod
    def load(cls, folder: Path, *, threads: int = 1) -> PairScorer:
        import onnxruntime as ort  # start-up time: only a gateway configured with a verifier loads a second model

        folder = Path(folder)
        manifest = folder / MANIFEST
        try:
            raw = manifest.read_bytes()
            meta = json.loads(raw)
            combination = Combination.from_json(meta["combination"])
            files = [folder / str(m) for m in meta["members"]]
            tok_file = folder / str(meta.get("tokenizer", "tokenizer.json"))
            max_length = int(meta["max_length"])
        except FileNotFoundError:
            raise VerifierError(f"{manifest} is missing; write the folder with `tiergate cache train-verifier`") \
                from None
        except (ValueError, KeyError, TypeError) as exc:
            raise VerifierError(f"{manifest}: not a verifier manifest ({type(exc).__name__}: {exc})") from None
        if not files:
            raise VerifierError(f"{manifest}: lists no members")
        for f in (*files, tok_file):
            if not f.is_file():
                raise VerifierError(f"{manifest}: member {f.name} is missing" if f != tok_file
                                    else f"{manifest}: tokenizer {f.name} is missing")
        try:
            tokenizer = Tokenizer.from_file(str(tok_file))
        except Exception as exc:  # tokenizers raises its own untyped exception for a bad file
            raise VerifierError(f"{tok_file}: not a tokenizer ({exc})") from None
        tokenizer.enable_truncation(max_length=max_length)
        pad = tokenizer.token_to_id("[PAD]")
        tokenizer.enable_padding(pad_id=0 if pad is None else pad, pad_token="[PAD]")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        members = []
        for f in files:
            try:
                members.append(ort.InferenceSession(str(f), opts, providers=["CPUExecutionProvider"]))
            except Exception as exc:  # onnxruntime's own exception types, for a file that is not a graph
                raise VerifierError(f"{f}: not an ONNX member ({exc})") from None
        return cls(members, tokenizer, combination, path=folder, axis="v" + hashlib.sha256(raw).hexdigest()[:12])

    def logits(self, pairs: list[tuple[str, str]], member: int | None = None) -> np.ndarray:
        """Mean logit of the members (or of one), one per (cached, asked) pair; synchronous.

        One pair per call, as the gateway scores a lookup's candidate: int8 members quantise activations over
        the whole padded batch, so a pair's logit would depend on its batch-mates (measured on the labelled
        pairs in batches of 64: 0.06 on average, up to 0.5), and seeds or benchmarks scored in batches would
        not be on the gateway's scale. It is not slower on one thread (no padding)."""
        chosen = self._members if member is None else [self._members[member]]
        out = np.zeros(len(pairs), np.float32)
        for i, pair in enumerate(pairs):
            e = self._tok.encode(*pair)
            feeds = {"input_ids": np.array([e.ids], np.int64), "attention_mask": np.array([e.attention_mask], np.int64),
                     "token_type_ids": np.array([e.type_ids], np.int64)}
            out[i] = np.mean([s.run(None, feeds)[0][0, 0] for s in chosen])  # type: ignore[attr-defined]
        return out

    def bound_scores(self, cosine: np.ndarray, pairs: list[tuple[str, str]]) -> np.ndarray:
        return self.combination.bound_scores(cosine, self.logits(pairs))

    async def bound_score(self, cosine: float, cached: str, asked: str) -> float:
        """The bound score of one candidate, computed off the event loop."""
        loop = asyncio.get_running_loop()
        score = await loop.run_in_executor(self._pool, self.bound_scores, np.array([cosine]), [(cached, asked)])
        value = float(score[0])
        if not math.isfinite(value):
            raise ValueError("the verifier gave a non-finite score")
        return value

    @property
    def members(self) -> int:
        return len(self._members)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
