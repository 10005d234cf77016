"""The multiple-choice expert: the previous complexity design, fenced to prompts with lettered answer options.

Why it survives: on multiple-choice questions the format itself says how hard a question is (several
statements to judge, verdict options like "True, False", near-synonymous options), and the generic
conversation features cannot see that (MMLU in-source APGR 0.50 without it, about 0.66 with it; bench/router).
Those features describe one benchmark's format and do not transfer to other traffic, so the expert scores
only prompts whose last user message has at least two lettered options (`A.` .. `H.` at the start of a line),
is trained only on such prompts, and exists only when the training data has at least `MIN_ROWS` of them.

Design (chosen on MMLU subject cross-validation, docs/benchmarks.md): 27 structural and lexical numbers of the
question and its options, 2 of them cosines between the options' sums of static word vectors (all-MiniLM-L6-v2's
input embeddings reduced to 64 dimensions, `word_vectors.npy`, built by `tiergate classifier vectors`); two
small gradient-boosted tree ensembles predicting the gain of escalating (one on strong - weak, one as
strong minus weak), each turned into a percentile of its training predictions, averaged, and calibrated once
more. Its score p in [0, 1] enters the complexity model as the standard normal quantile of p: distributed
over its training prompts as the head's z is over the others (standardised, roughly normal), so a complexity
threshold cuts multiple-choice traffic at about the share it cuts the rest.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from tiergate.complexity.encoder import MAX_CHARS, Encoder
from tiergate.complexity.trees import PercentileMap, TreeEnsemble, calibration, fit_trees, negate_and_join

__all__ = ["CHOICE_FEATURES", "DEFAULT_VECTORS_FILE", "MIN_ROWS", "ChoiceExpert", "ChoiceFeaturizer", "Member"]

DEFAULT_VECTORS_FILE = Path(__file__).resolve().parent / "word_vectors.npy"
MIN_ROWS = 300  # fewer multiple-choice training prompts than this: no expert
MAX_SIMILAR_OPTIONS = 16  # the option-similarity features look at the first 16 options (quadratic cost)
_NORMAL = NormalDist()
_P_CLIP = 0.005  # percentiles are clipped to [this, 1 - this] before the normal quantile (z within +-2.58)

CHOICE_FEATURES: tuple[str, ...] = (
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


class ChoiceFeaturizer:
    """Question text → the CHOICE_FEATURES vector. Shared by training and serving: identical numbers."""

    def __init__(self, encoder: Encoder, vectors_file: Path = DEFAULT_VECTORS_FILE) -> None:
        self.encoder = encoder
        self.vectors_file = vectors_file
        self.vectors_sha256 = hashlib.sha256(vectors_file.read_bytes()).hexdigest()
        vectors = np.load(vectors_file, allow_pickle=False)
        if vectors.ndim != 2 or vectors.dtype != np.float16:
            raise ValueError(f"{vectors_file}: expected a 2-d float16 array, got {vectors.dtype} {vectors.shape}")
        if len(vectors) != encoder.vocab_size:
            raise ValueError(f"{vectors_file}: {len(vectors)} word vectors for a vocabulary of {encoder.vocab_size}")
        self._vectors = vectors  # float16 rows summed in float64: exact, whatever the order

    @staticmethod
    @functools.cache
    def for_encoder(encoder: Encoder) -> ChoiceFeaturizer:
        """The featurizer with the shipped word vectors for `encoder`, loaded once per process and encoder."""
        return ChoiceFeaturizer(encoder)

    def values(self, text: str, ids: list[int] | None = None) -> list[float]:
        """The CHOICE_FEATURES of `text`; `ids` may be passed when the caller has already encoded it (<= MAX_CHARS)."""
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
        enc = self.encoder
        if ids is None:
            ids = enc.encode(text)

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
            frag = float(sum(map(enc.continuation.__getitem__, ids))) / nw
            mean_id = (sum(ids) / n_ids) / enc.vocab_size
            rare = sum(map((10_000).__lt__, ids)) / n_ids
            unk = float(ids.count(enc.unk)) / (n_ids + 1)
        else:
            frag = mean_id = rare = unk = 0.0
        if words:
            ttr = len({w.lower() for w in words}) / nw
            wlen = sum(map(len, words)) / len(words)
            caps = sum(1 for w in words[1:] if w[0].isupper()) / nw
        else:
            ttr = wlen = caps = 0.0
        return [
            math.log1p(full_len), math.log1p(len(stem)), math.log1p(opt_len) if opt_texts else 0.0,
            float(len(opt_texts)), len(_DIGIT.findall(text)) / n, opt_digits, len(_MATH.findall(text)) / n,
            float(len(_PARTS.findall(text))), compound, overlap, repetition,
            1.0 if _NEGATION.search(stem) else 0.0, 1.0 if _CALC.search(stem) else 0.0,
            math.log1p(stem.count("\n")), len(_UPPER.findall(text)) / n, len(_PUNCT.findall(text)) / n,
            len(_NONASCII.findall(text)) / n, frag, mean_id, rare, ttr, wlen, caps, unk, verdict,
            similarity, similarity_max,
        ]

    def _option_similarity(self, opt_texts: list[str]) -> tuple[float, float]:
        """Mean and largest cosine between the options' word-vector sums (0, 0 with fewer than 2 non-empty)."""
        ids: list[int] = []
        starts: list[int] = []
        for o in opt_texts[:MAX_SIMILAR_OPTIONS]:
            piece = self.encoder.encode(o)
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
        rows = [self.values(t) for t in texts]
        return np.asarray(rows, np.float64) if rows else np.zeros((0, len(CHOICE_FEATURES)))


@dataclass(frozen=True)
class Member:
    """One model of the expert: trees predicting the gain of escalating, and their own percentile map."""

    trees: TreeEnsemble
    calibration_raw: np.ndarray
    calibration_score: np.ndarray
    target: str = "gain"  # what the trees were fitted to (documentation only)

    def percentile(self, x: list[float]) -> float:
        return self._map(self.trees.predict(x))

    @functools.cached_property
    def _map(self) -> PercentileMap:
        return PercentileMap(self.calibration_raw, self.calibration_score)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "trees": self.trees.to_dict(),
                "calibration": {"raw": self.calibration_raw.tolist(), "score": self.calibration_score.tolist()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Member:
        cal = d["calibration"]
        return cls(TreeEnsemble.from_dict(d["trees"]), np.asarray(cal["raw"], np.float64),
                   np.asarray(cal["score"], np.float64), str(d.get("target", "gain")))


@dataclass(frozen=True)
class ChoiceExpert:
    """Members whose percentiles are averaged and calibrated to a percentile of the expert's training prompts."""

    members: tuple[Member, ...]
    calibration_raw: np.ndarray
    calibration_score: np.ndarray

    def combined(self, x: list[float]) -> float:
        """Mean of the members' percentiles for a feature vector (before the final calibration)."""
        return sum(m.percentile(x) for m in self.members) / len(self.members)

    def percentile(self, x: list[float]) -> float:
        return self._map(self.combined(x))

    def z(self, x: list[float]) -> float:
        """The percentile as a standard normal z (the complexity model's scale)."""
        return _NORMAL.inv_cdf(min(max(self.percentile(x), _P_CLIP), 1.0 - _P_CLIP))

    @functools.cached_property
    def _map(self) -> PercentileMap:
        return PercentileMap(self.calibration_raw, self.calibration_score)

    def to_dict(self) -> dict[str, Any]:
        return {"features": list(CHOICE_FEATURES), "members": [m.to_dict() for m in self.members],
                "calibration": {"raw": self.calibration_raw.tolist(), "score": self.calibration_score.tolist()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ChoiceExpert:
        if tuple(d.get("features", ())) != CHOICE_FEATURES:
            raise ValueError("its multiple-choice expert was trained with other features than this gateway computes")
        members = tuple(Member.from_dict(m) for m in d["members"])
        if not members:
            raise ValueError("its multiple-choice expert has no members")
        cal = d["calibration"]
        return cls(members, np.asarray(cal["raw"], np.float64), np.asarray(cal["score"], np.float64))

    @classmethod
    def fit(cls, x: np.ndarray, weak: np.ndarray, strong: np.ndarray,
            params: dict[str, Any] | None = None) -> ChoiceExpert:
        """Train on CHOICE_FEATURES rows (needs scikit-learn): a "gain" and a "strong-weak" member."""
        specs = [(fit_trees(x, strong - weak, params), "gain"),
                 (negate_and_join(fit_trees(x, strong, params), fit_trees(x, weak, params)), "strong-weak")]
        members, percentiles = [], []
        for trees, name in specs:
            raw = np.array([trees.predict(row) for row in x])
            cal_raw, cal_score = calibration(raw)
            members.append(Member(trees, cal_raw, cal_score, name))
            percentiles.append(np.interp(raw, cal_raw, cal_score))
        cal_raw, cal_score = calibration(np.mean(percentiles, axis=0))
        return cls(tuple(members), cal_raw, cal_score)
