"""Complexity: a score in [0, 1] of how much a prompt stands to gain from the strong (cloud) model.

Design, chosen by measurement (bench/router, docs/benchmarks.md):
- Features are cheap structural and lexical statistics of the prompt (length of the question and of its
  answer options, digits and math symbols, multi-part statements, how alike the options are, options that are
  verdicts like "True, False", negations, calculation cues, WordPiece fragmentation and rarity of the words,
  ...): 25 numbers, computed with regular expressions and one WordPiece tokenization (the vocabulary shipped
  in `tokenizer_default.json`), plus 2 on how alike the answer options are in meaning: the cosines between
  the options' sums of static word vectors (all-MiniLM-L6-v2's input word embeddings, reduced to 64
  dimensions and shipped as `word_vectors.npy`, built by `tiergate classifier vectors`, see complexity/word_vectors.py). Options that are near
  synonyms need finer judgment, whatever the subject: these two raised held-out subjects' APGR by about
  0.01-0.02. Learned word or embedding features of the prompt itself (its topic) were tried and generalised
  worse to unseen subjects.
- The head is two small gradient-boosted tree ensembles ("members") trained (`tiergate classifier train`)
  to estimate the expected gain of escalating, E[strong_correct - weak_correct | prompt], which is what the
  APGR sweep ranks by: one fitted to that difference directly, one as P(strong right) - P(weak right). Each
  member's prediction becomes a percentile of its training predictions and the two are averaged (a rank
  average ranked held-out subjects better than either member). The trees are stored as plain arrays in JSON;
  no torch, no scikit-learn at run time.
- Scoring one prompt is plain Python on purpose: numpy's per-call cost on 27-number vectors dominated, and on
  a gateway core that also runs the network code it is paid cold, several times over. Each tree ensemble is
  compiled once, at load, into one Python expression of nested conditionals (only the model's numbers go
  into it), which evaluates 450 trees in a few microseconds. Training uses the same code, so the numbers are
  identical. The option similarity is the one numpy step (a handful of calls for all options together, some
  30 microseconds).
- The average is mapped through the training set's empirical distribution, so the score is a percentile:
  `complexity >= 0.8` in a policy means "among the 20 % of training prompts that gain most".

Only the first `MAX_CHARS` characters are analysed (the full length still counts), which bounds the cost of
a huge prompt; a typical prompt takes well under a millisecond. Instances are immutable after loading and
safe to share between threads.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from complexity.wordpiece import AsciiWordPiece

__all__ = [
    "DEFAULT_MODEL_FILE",
    "DEFAULT_VECTORS_FILE",
    "FEATURES",
    "MAX_CHARS",
    "MODEL_FORMAT",
    "ComplexityModel",
    "Featurizer",
    "Member",
    "TreeEnsemble",
]

MODEL_FORMAT = "tiergate-complexity/2"
DEFAULT_MODEL_FILE = Path(__file__).resolve().parent / "complexity_model.json"
_TOKENIZER_FILE = Path(__file__).resolve().parent / "tokenizer_default.json"
DEFAULT_VECTORS_FILE = Path(__file__).resolve().parent / "word_vectors.npy"
MAX_CHARS = 16_000
MAX_SIMILAR_OPTIONS = 16  # the option-similarity features look at the first 16 options (quadratic cost)

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
    "verdict_options",      # options that are verdicts on statements ("True, False", "Wrong, Not wrong", "Valid")
    "option_similarity",    # mean cosine between the options' word-vector sums: near-synonymous options
    "option_similarity_max",  # the two most alike options
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
_VERDICT = re.compile(r"\b(True|False|Wrong|Not wrong|Correct|Incorrect|Valid|Invalid|Yes|No|Right|Both|Neither)\b")
_CALC = re.compile(r"\b(calculate|compute|find|how many|how much|what is the value|solve|estimate|determine)\b",
                   re.IGNORECASE)


class Featurizer:
    """Prompt → the FEATURES vector. Shared by training and serving, so both see identical numbers."""

    def __init__(self, tokenizer_file: Path = _TOKENIZER_FILE, vectors_file: Path = DEFAULT_VECTORS_FILE) -> None:
        self.tokenizer_file = tokenizer_file
        raw = tokenizer_file.read_bytes()
        self.tokenizer_sha256 = hashlib.sha256(raw).hexdigest()
        self.vectors_file = vectors_file
        vec_raw = vectors_file.read_bytes()
        self.vectors_sha256 = hashlib.sha256(vec_raw).hexdigest()
        vectors = np.load(vectors_file, allow_pickle=False)
        if vectors.ndim != 2 or vectors.dtype != np.float16:
            raise ValueError(f"{vectors_file}: expected a 2-d float16 array, got {vectors.dtype} {vectors.shape}")
        self._vectors = vectors  # float16 rows summed in float64: exact, whatever the order
        tok = Tokenizer.from_str(raw.decode("utf-8"))
        tok.no_truncation()
        tok.no_padding()
        self._tok = tok
        self._ascii = AsciiWordPiece.from_config(json.loads(raw))  # exact and faster for plain-ASCII prompts
        vocab = tok.get_vocab()
        self._vocab_size = max(vocab.values()) + 1
        cont = bytearray(self._vocab_size)
        for piece, idx in vocab.items():
            if piece.startswith("##"):
                cont[idx] = 1
        self._continuation = bytes(cont)
        self._unk = vocab.get("[UNK]", -1)
        if len(vectors) != self._vocab_size:
            raise ValueError(f"{vectors_file}: {len(vectors)} word vectors for a vocabulary of {self._vocab_size}")
        # The gateway's default token counter uses this same file: the classifier then encodes a prompt once.
        self.builtin_tokenizer = tokenizer_file == _TOKENIZER_FILE

    def encode(self, text: str) -> list[int]:
        """WordPiece ids of `text` (no special tokens), as `values` computes them for a text of <= MAX_CHARS."""
        ids = self._ascii.encode(text) if self._ascii is not None else None
        return self._tok.encode(text, add_special_tokens=False).ids if ids is None else ids

    def vector(self, text: str) -> np.ndarray:
        return np.array(self.values(text), dtype=np.float64)

    def values(self, text: str, ids: list[int] | None = None) -> list[float]:
        """The FEATURES of `text`, as a list (what scoring uses; `vector` wraps it for training).

        `ids` may be passed when the caller has already encoded `text` (which must then be <= MAX_CHARS)."""
        full_len = len(text)
        if ids is not None and full_len > MAX_CHARS:
            raise ValueError(f"ids given for a text longer than MAX_CHARS ({full_len} > {MAX_CHARS})")
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
        if ids is None:
            ids = self.encode(text)

        if opt_texts:
            opt_len = sum(len(o) for o in opt_texts) / len(opt_texts)
            opt_digits = sum(len(_DIGIT.findall(o)) / (len(o) + 1) for o in opt_texts) / len(opt_texts)
            compound = sum(1 for o in opt_texts if "," in o or " and " in o) / len(opt_texts)
            sets = [set(o.lower().replace(",", " ").split()) for o in opt_texts]
            union = set().union(*sets)
            inter = set.intersection(*sets)
            overlap = len(inter) / (len(union) + 1)
            repetition = 1 - len(union) / (sum(len(s) for s in sets) + 1)
            verdict = sum(1 for o in opt_texts if len(o.split()) <= 6 and _VERDICT.search(o)) / len(opt_texts)
            similarity, similarity_max = self._option_similarity(opt_texts)
        else:
            opt_len = opt_digits = compound = overlap = repetition = verdict = similarity = similarity_max = 0.0
        if ids:  # integer counts and sums: exact, whatever the order
            n_ids = len(ids)
            frag = float(sum(map(self._continuation.__getitem__, ids))) / nw
            mean_id = (sum(ids) / n_ids) / self._vocab_size
            rare = sum(map((10_000).__lt__, ids)) / n_ids
            unk = float(ids.count(self._unk)) / (n_ids + 1)
        else:
            frag = mean_id = rare = unk = 0.0
        if words:
            ttr = len({w.lower() for w in words}) / nw
            wlen = sum(map(len, words)) / len(words)
            caps = sum(1 for w in words[1:] if w[0].isupper()) / nw
        else:
            ttr = wlen = caps = 0.0
        return [
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
            verdict,
            similarity,
            similarity_max,
        ]

    def _option_similarity(self, opt_texts: list[str]) -> tuple[float, float]:
        """Mean and largest cosine between the options' word-vector sums (0, 0 with fewer than 2 non-empty)."""
        ids: list[int] = []
        starts: list[int] = []
        for o in opt_texts[:MAX_SIMILAR_OPTIONS]:
            piece = self.encode(o)
            if piece:
                starts.append(len(ids))
                ids += piece
        if len(starts) < 2:
            return 0.0, 0.0
        # float16 rows summed in float64 are exact, whatever the order: the same numbers on any machine
        sums = np.add.reduceat(self._vectors[ids].astype(np.float64), starts, axis=0)
        norms = np.sqrt(np.einsum("ij,ij->i", sums, sums))
        m = sums[norms > 0.0] / norms[norms > 0.0, None]
        k = len(m)
        if k < 2:
            return 0.0, 0.0
        off = (m @ m.T)[~np.eye(k, dtype=bool)]  # every pair twice
        return float(off.sum()) / (k * (k - 1)), float(off.max())

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

    def __post_init__(self) -> None:
        self._compiled  # compile at load, not on the first request  # noqa: B018

    def predict(self, x: Sequence[float]) -> float:
        return float(self._compiled(x))

    @functools.cached_property
    def _compiled(self) -> Callable[[Sequence[float]], float]:
        """The trees as one function `x -> baseline + sum of leaf values`, built from the arrays' numbers only."""
        feature, threshold = self.feature.tolist(), self.threshold.tolist()
        left, right, value = self.left.tolist(), self.right.tolist(), self.value.tolist()

        def tree(node: int) -> str:
            if left[node] == node:  # a leaf points to itself
                return repr(float(value[node]))
            return (f"({tree(left[node])} if x[{int(feature[node])}] <= {float(threshold[node])!r} "
                    f"else {tree(right[node])})")

        terms = [repr(float(self.baseline))] + [tree(int(root)) for root in self.roots.tolist()]
        namespace: dict[str, Any] = {}
        # A tuple summed, not `a + b + ...`: a chain of hundreds of additions nests as deep in the compiler.
        exec(compile("def predict(x):\n    return sum((" + ", ".join(terms) + ",))\n", "<tree-ensemble>", "exec"),
             namespace)
        return namespace["predict"]

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


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """`numpy.interp(x, xs, ys)` for one value, by the same formula, without numpy's per-call cost."""
    if x < xs[0]:
        return float(ys[0])
    j = bisect.bisect_right(xs, x) - 1
    if j >= len(xs) - 1:
        return float(ys[-1])
    slope = (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j])
    return float(slope * (x - xs[j]) + ys[j])


class _PercentileMap:
    """A calibration curve (increasing raw values and the share of training prompts at or below each)."""

    __slots__ = ("raw", "score")

    def __init__(self, raw: np.ndarray, score: np.ndarray) -> None:
        self.raw, self.score = raw.tolist(), score.tolist()

    def __call__(self, value: float) -> float:
        return _interp(self.raw, self.score, value)


@dataclass(frozen=True)
class Member:
    """One model of the ensemble: trees predicting the gain of escalating, and their own percentile map."""

    trees: TreeEnsemble
    calibration_raw: np.ndarray  # increasing raw predictions ...
    calibration_score: np.ndarray  # ... and the share of training prompts at or below each
    target: str = "gain"  # what the trees were fitted to (documentation only)

    def predict(self, x: Sequence[float]) -> float:
        return self.trees.predict(x)

    def percentile(self, raw: float) -> float:
        return self._map(raw)

    @functools.cached_property
    def _map(self) -> _PercentileMap:
        return _PercentileMap(self.calibration_raw, self.calibration_score)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "trees": self.trees.to_dict(),
                "calibration": {"raw": self.calibration_raw.tolist(), "score": self.calibration_score.tolist()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Member:
        cal = d["calibration"]
        return cls(TreeEnsemble.from_dict(d["trees"]), np.asarray(cal["raw"], np.float64),
                   np.asarray(cal["score"], np.float64), str(d.get("target", "gain")))


@dataclass(frozen=True)
class ComplexityModel:
    """A trained complexity scorer: featurizer + members + calibration of their combination to a percentile.

    Every member predicts the gain of escalating (its own way, see complexity/train.py); each
    prediction is turned into a percentile of the member's training predictions, the percentiles are
    averaged (a rank average: members on different scales count equally), and the average is mapped
    through the training set's distribution once more, so the score is again a percentile.
    """

    members: tuple[Member, ...]
    calibration_raw: np.ndarray  # increasing mean member percentiles ...
    calibration_score: np.ndarray  # ... and the share of training prompts at or below each
    meta: dict[str, Any] = field(default_factory=dict)
    featurizer: Featurizer = field(default_factory=Featurizer, repr=False)

    # ------------------------------------------------------------------------------------- scoring

    def combined(self, x: Sequence[float]) -> float:
        """Mean of the members' percentiles for a feature vector (before the final calibration)."""
        return sum(m.percentile(m.predict(x)) for m in self.members) / len(self.members)

    def raw(self, text: str, ids: list[int] | None = None) -> float:
        """Mean of the members' percentiles, uncalibrated."""
        return self.combined(self.featurizer.values(text, ids))

    def score(self, text: str, ids: list[int] | None = None) -> float:
        """Complexity in [0, 1] (a percentile of the training prompts); `ids` as for `Featurizer.values`."""
        return self.calibrate(self.raw(text, ids))

    def calibrate(self, raw: float) -> float:
        return self._map(raw)

    @functools.cached_property
    def _map(self) -> _PercentileMap:
        return _PercentileMap(self.calibration_raw, self.calibration_score)

    def explain(self, text: str) -> dict[str, Any]:
        """The features, the members' mean predicted gain and the score, for `tiergate policy explain`."""
        x = self.featurizer.vector(text)
        preds = [m.predict(x) for m in self.members]
        combined = sum(m.percentile(p) for m, p in zip(self.members, preds, strict=True)) / len(self.members)
        return {"score": round(self.calibrate(combined), 4), "expected_gain": round(float(np.mean(preds)), 4),
                "members": [{"target": m.target, "expected_gain": round(p, 4), "percentile": round(m.percentile(p), 4)}
                            for m, p in zip(self.members, preds, strict=True)],
                "features": {name: round(float(v), 4) for name, v in zip(FEATURES, x, strict=True)}}

    # --------------------------------------------------------------------------------- persistence

    def to_dict(self) -> dict[str, Any]:
        return {"format": MODEL_FORMAT, "features": list(FEATURES),
                "tokenizer_sha256": self.featurizer.tokenizer_sha256,
                "vectors_sha256": self.featurizer.vectors_sha256,
                "members": [m.to_dict() for m in self.members],
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
            if isinstance(d, dict) and isinstance(d.get("format"), str) and \
                    d["format"].startswith("tiergate-complexity/"):
                raise ValueError(f"{path}: a {d['format']} file, this gateway reads {MODEL_FORMAT}; retrain it")
            raise ValueError(f"{path}: not a {MODEL_FORMAT} file")
        if tuple(d.get("features", ())) != FEATURES:
            raise ValueError(f"{path}: trained with other features than this gateway computes; retrain it")
        feats = featurizer or Featurizer()
        if d.get("tokenizer_sha256") != feats.tokenizer_sha256:
            raise ValueError(f"{path}: trained with another tokenizer than {feats.tokenizer_file}; retrain it")
        if d.get("vectors_sha256") != feats.vectors_sha256:
            raise ValueError(f"{path}: trained with other word vectors than {feats.vectors_file}; retrain it")
        members = tuple(Member.from_dict(m) for m in d["members"])
        if not members:
            raise ValueError(f"{path}: no members")
        cal = d["calibration"]
        return cls(members, np.asarray(cal["raw"], np.float64), np.asarray(cal["score"], np.float64),
                   dict(d.get("meta", {})), feats)

    @classmethod
    def load_default(cls) -> ComplexityModel:
        """The model shipped with the gateway (trained on ../shared/data/routing/mmlu_dev.jsonl)."""
        return cls.load(DEFAULT_MODEL_FILE)
