"""Complexity: a score in [0, 1] of how much a prompt stands to gain from the strong (cloud) model.

Design, chosen by measurement (bench/router, docs/benchmarks.md):
- Features are cheap structural and lexical statistics of the prompt (length of the question and of its
  answer options, digits and math symbols, multi-part statements, how alike the options are, negations,
  calculation cues, WordPiece fragmentation and rarity of the words, ...): 24 numbers, computed with
  regular expressions and one WordPiece tokenization (the vocabulary shipped in `tokenizer_default.json`).
  Learned word or embedding features were tried and generalised worse to unseen subjects.
- The head is a small gradient-boosted tree ensemble trained (`tiergate classifier train`) to predict the
  expected gain of escalating, E[strong_correct - weak_correct | prompt], which is exactly what the APGR
  sweep ranks by. The ensemble is stored as plain arrays in JSON and evaluated here with numpy: no torch,
  no scikit-learn at run time.
- The raw prediction is mapped through the training set's empirical distribution, so the score is a
  percentile: `complexity >= 0.8` in a policy means "among the 20 % of training prompts that gain most".

Only the first `MAX_CHARS` characters are analysed (the full length still counts), which bounds the cost of
a huge prompt; a typical prompt takes well under a millisecond. Instances are immutable after loading and
safe to share between threads.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

__all__ = [
    "DEFAULT_MODEL_FILE",
    "FEATURES",
    "MAX_CHARS",
    "MODEL_FORMAT",
    "ComplexityModel",
    "Featurizer",
    "TreeEnsemble",
]

MODEL_FORMAT = "tiergate-complexity/1"
DEFAULT_MODEL_FILE = Path(__file__).resolve().parent / "complexity_model.json"
_TOKENIZER_FILE = Path(__file__).resolve().parent / "tokenizer_default.json"
MAX_CHARS = 16_000

FEATURES: tuple[str, ...] = (
    "log_chars",            # length of the whole prompt
    "log_stem_chars",       # length of the question before any answer options
    "log_option_chars",     # mean length of the answer options (0 without options)
    "n_options",
    "digit_share",
    "option_digit_share",   # numbers in the options: a computation question
    "math_share",           # = + ^ * / < > √ ∑ ∫ π θ $ _ { } |
    "parts",                # "Statement 1 |", "Scenario 2 |", (i)/(ii) items: several judgments in one
    "compound_options",     # options that combine judgments ("True, False", "(i) and (iii) only")
    "option_overlap",       # words shared by every option
    "option_repetition",    # 1 - distinct words / all words over the options
    "negation",             # NOT, EXCEPT, least, not in the question
    "calculation",          # calculate, compute, find, how many, solve, ...
    "stem_lines",
    "upper_share",
    "punct_share",
    "nonascii_share",
    "wordpiece_fragmentation",  # continuation pieces per word: jargon and rare words
    "mean_token_id",            # WordPiece ids grow roughly with rarity
    "rare_token_share",
    "type_token_ratio",
    "mean_word_len",
    "capitalised_words",
    "unknown_tokens",
)

_OPTION = re.compile(r"^[ \t]*\(?([A-H])[.)][ \t]+(.*)$", re.MULTILINE)
_WORD = re.compile(r"[A-Za-z]+")
_DIGIT = re.compile(r"\d")
_MATH = re.compile(r"[=+^*/<>√∑∫πθ$_{}|]")
_UPPER = re.compile(r"[A-Z]")
_PUNCT = re.compile(r"[()\[\],;:]")
_NONASCII = re.compile(r"[^\x00-\x7f]")
_PARTS = re.compile(r"(?:Statement|Scenario|Part)\s*\d+\s*\||\n\(?(?:i{1,3}|iv|v|vi{1,3})\)", re.IGNORECASE)
_NEGATION = re.compile(r"\b(NOT|EXCEPT|LEAST|least|not)\b")
_CALC = re.compile(r"\b(calculate|compute|find|how many|how much|what is the value|solve|estimate|determine)\b",
                   re.IGNORECASE)


class Featurizer:
    """Prompt → the FEATURES vector. Shared by training and serving, so both see identical numbers."""

    def __init__(self, tokenizer_file: Path = _TOKENIZER_FILE) -> None:
        self.tokenizer_file = tokenizer_file
        raw = tokenizer_file.read_bytes()
        self.tokenizer_sha256 = hashlib.sha256(raw).hexdigest()
        tok = Tokenizer.from_str(raw.decode("utf-8"))
        tok.no_truncation()
        tok.no_padding()
        self._tok = tok
        vocab = tok.get_vocab()
        self._vocab_size = max(vocab.values()) + 1
        cont = np.zeros(self._vocab_size, dtype=bool)
        for piece, idx in vocab.items():
            if piece.startswith("##"):
                cont[idx] = True
        self._continuation = cont
        self._unk = vocab.get("[UNK]", -1)

    def vector(self, text: str) -> np.ndarray:
        full_len = len(text)
        text = text[:MAX_CHARS]
        n = len(text) + 1
        options = _OPTION.findall(text)
        opt_texts = [o[1] for o in options] if len(options) >= 2 else []
        if opt_texts:
            first = _OPTION.search(text)
            stem = text[: first.start()] if first else text
        else:
            stem = text
        words = _WORD.findall(text)
        nw = len(words) + 1
        ids = np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)

        if opt_texts:
            opt_len = sum(len(o) for o in opt_texts) / len(opt_texts)
            opt_digits = sum(len(_DIGIT.findall(o)) / (len(o) + 1) for o in opt_texts) / len(opt_texts)
            compound = sum(1 for o in opt_texts if "," in o or " and " in o) / len(opt_texts)
            sets = [set(o.lower().replace(",", " ").split()) for o in opt_texts]
            union = set().union(*sets)
            inter = set.intersection(*sets)
            overlap = len(inter) / (len(union) + 1)
            repetition = 1 - len(union) / (sum(len(s) for s in sets) + 1)
        else:
            opt_len = opt_digits = compound = overlap = repetition = 0.0
        if ids.size:
            frag = float(self._continuation[ids].sum()) / nw
            mean_id = float(ids.mean()) / self._vocab_size
            rare = float((ids > 10_000).mean())
            unk = float((ids == self._unk).sum()) / (ids.size + 1)
        else:
            frag = mean_id = rare = unk = 0.0
        if words:
            ttr = len({w.lower() for w in words}) / nw
            wlen = sum(map(len, words)) / len(words)
            caps = sum(1 for w in words[1:] if w[0].isupper()) / nw
        else:
            ttr = wlen = caps = 0.0
        return np.array([
            math.log1p(full_len),
            math.log1p(len(stem)),
            math.log1p(opt_len) if opt_texts else 0.0,
            float(len(opt_texts)),
            len(_DIGIT.findall(text)) / n,
            opt_digits,
            len(_MATH.findall(text)) / n,
            float(len(_PARTS.findall(text))),
            compound,
            overlap,
            repetition,
            1.0 if _NEGATION.search(stem) else 0.0,
            1.0 if _CALC.search(stem) else 0.0,
            math.log1p(stem.count("\n")),
            len(_UPPER.findall(text)) / n,
            len(_PUNCT.findall(text)) / n,
            len(_NONASCII.findall(text)) / n,
            frag,
            mean_id,
            rare,
            ttr,
            wlen,
            caps,
            unk,
        ], dtype=np.float64)

    def matrix(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.vector(t) for t in texts]) if texts else np.zeros((0, len(FEATURES)))


@dataclass(frozen=True)
class TreeEnsemble:
    """Regression trees as flat arrays; a leaf points to itself, so every row walks the same number of steps."""

    feature: np.ndarray  # int32, per node
    threshold: np.ndarray  # float64, go left when x[feature] <= threshold
    left: np.ndarray  # int32, global node index
    right: np.ndarray  # int32
    value: np.ndarray  # float64, leaf values (shrinkage included)
    roots: np.ndarray  # int32, one per tree
    depth: int
    baseline: float

    def predict(self, x: np.ndarray) -> float:
        node = self.roots
        for _ in range(self.depth):
            go_left = x[self.feature[node]] <= self.threshold[node]
            node = np.where(go_left, self.left[node], self.right[node])
        return float(self.baseline + self.value[node].sum())

    def to_dict(self) -> dict[str, Any]:
        return {"feature": self.feature.tolist(), "threshold": self.threshold.tolist(), "left": self.left.tolist(),
                "right": self.right.tolist(), "value": self.value.tolist(), "roots": self.roots.tolist(),
                "depth": self.depth, "baseline": self.baseline}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TreeEnsemble:
        return cls(np.asarray(d["feature"], np.int32), np.asarray(d["threshold"], np.float64),
                   np.asarray(d["left"], np.int32), np.asarray(d["right"], np.int32),
                   np.asarray(d["value"], np.float64), np.asarray(d["roots"], np.int32), int(d["depth"]),
                   float(d["baseline"]))


@dataclass(frozen=True)
class ComplexityModel:
    """A trained complexity scorer: featurizer + tree ensemble + calibration to a [0, 1] percentile."""

    trees: TreeEnsemble
    calibration_raw: np.ndarray  # increasing raw predictions ...
    calibration_score: np.ndarray  # ... and the share of training prompts at or below each
    meta: dict[str, Any] = field(default_factory=dict)
    featurizer: Featurizer = field(default_factory=Featurizer, repr=False)

    # ------------------------------------------------------------------------------------- scoring

    def raw(self, text: str) -> float:
        """Predicted gain of escalating (strong minus weak correctness), uncalibrated."""
        return self.trees.predict(self.featurizer.vector(text))

    def score(self, text: str) -> float:
        """Complexity in [0, 1] (a percentile of the training prompts)."""
        return self.calibrate(self.raw(text))

    def calibrate(self, raw: float) -> float:
        return float(np.interp(raw, self.calibration_raw, self.calibration_score))

    def explain(self, text: str) -> dict[str, Any]:
        """The features, the raw prediction and the score, for `tiergate policy explain`."""
        x = self.featurizer.vector(text)
        raw = self.trees.predict(x)
        return {"score": round(self.calibrate(raw), 4), "expected_gain": round(raw, 4),
                "features": {name: round(float(v), 4) for name, v in zip(FEATURES, x, strict=True)}}

    # --------------------------------------------------------------------------------- persistence

    def to_dict(self) -> dict[str, Any]:
        return {"format": MODEL_FORMAT, "features": list(FEATURES),
                "tokenizer_sha256": self.featurizer.tokenizer_sha256, "trees": self.trees.to_dict(),
                "calibration": {"raw": self.calibration_raw.tolist(), "score": self.calibration_score.tolist()},
                "meta": self.meta}

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | Path, featurizer: Featurizer | None = None) -> ComplexityModel:
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a complexity model ({exc})") from None
        if not isinstance(d, dict) or d.get("format") != MODEL_FORMAT:
            raise ValueError(f"{path}: not a {MODEL_FORMAT} file")
        if tuple(d.get("features", ())) != FEATURES:
            raise ValueError(f"{path}: trained with other features than this gateway computes; retrain it")
        feats = featurizer or Featurizer()
        if d.get("tokenizer_sha256") != feats.tokenizer_sha256:
            raise ValueError(f"{path}: trained with another tokenizer than {feats.tokenizer_file}; retrain it")
        cal = d["calibration"]
        return cls(TreeEnsemble.from_dict(d["trees"]), np.asarray(cal["raw"], np.float64),
                   np.asarray(cal["score"], np.float64), dict(d.get("meta", {})), feats)

    @classmethod
    def load_default(cls) -> ComplexityModel:
        """The model shipped with the gateway (trained on ../shared/data/routing/mmlu_dev.jsonl)."""
        return cls.load(DEFAULT_MODEL_FILE)
