"""Complexity: a score in [0, 1] of how much a request stands to gain from the strong (cloud) model.

Why this design (measured leave-one-source-out in bench/router, docs/benchmarks.md): a score must rank prompts
of a kind it never saw at least as well as prompt length does. So:

1. A linear head on the last user message's generic features (complexity/features.py: lengths, what is asked
   for, structure, surface statistics) estimates the gain of escalating, strong minus weak quality. It is a
   ridge regression in which every training source weighs the same (without that, one large source decides)
   and which is penalised for predicting different mean gains for different sources (`Design.invariance`):
   the head then ranks prompts against others of their kind, and a threshold cuts every kind of traffic
   it was trained on at about the same share (the prototype without it put 41 % of arena and 21 % of
   selfinstruct at complexity >= 0.7). It costs about 0.004 of mean leave-one-source-out APGR (bench/router's
   ablations).
2. The length prior is z(log tokens of the whole conversation): where the system prompt and earlier turns
   enter (no training data has them, so nothing could learn what they mean).
3. Shift guard: the Mahalanobis distance of the content features to the training prompts says how unlike
   anything seen a prompt is. Up to `near` (a quantile of the training prompts' own distances) the head is
   trusted; from `far` (a multiple of near) on, the score is the length prior alone; log-linear in between.
   A head extrapolating to a new kind of prompt ranked it worse than length (MMLU held out: 0.49 vs 0.57).
4. Prompts with lettered answer options use the multiple-choice expert's z instead of the head's when the
   model has one (complexity/choice.py); no other prompt is affected by it.
5. The result is mapped through its distribution on a mixed reference set (the training prompts, every source
   weighing the same), so `complexity >= 0.7` selects about 30 % of that mix.

Scoring is a few numpy operations on 28 numbers (the featurizer dominates: ~0.1-0.3 ms a prompt); no
scikit-learn, no torch. Instances are immutable after loading and safe to share between threads.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tiergate.complexity.choice import ChoiceExpert, ChoiceFeaturizer
from tiergate.complexity.encoder import Encoder
from tiergate.complexity.features import (
    CONTENT,
    FEATURES,
    LENGTH,
    OPTIONS,
    Featured,
    Featurizer,
    Messages,
    as_messages,
)
from tiergate.complexity.trees import PercentileMap

__all__ = ["DEFAULT_MODEL_FILE", "MODEL_FORMAT", "ComplexityModel", "Design", "Guard", "Head", "Parts"]

MODEL_FORMAT = "tiergate-complexity/3"
DEFAULT_MODEL_FILE = Path(__file__).resolve().parent / "complexity_model.json"
MIN_OPTIONS = math.log1p(2)  # the `options` feature of a prompt with at least two lettered answer options
_CONTENT = np.array(CONTENT)


@dataclass(frozen=True)
class Design:
    """The choices training makes before fitting (by nested leave-one-source-out with `--select`)."""

    alpha: float = 1000.0  # ridge penalty, on standardised features with weights summing to the row count
    center: bool = False  # centre the gain within each source: learn only the ranking inside a kind of traffic
    invariance: float = 100.0  # penalty on different mean predictions for different training sources (fixed)
    trust_quantile: float = 0.95  # the head is trusted up to this quantile of the training prompts' distances
    trust_multiple: float = 2.0  # ... and not at all from this multiple of that distance on


@dataclass(frozen=True)
class Head:
    """model z = sum(weights * (x - mean) / scale) + bias, over the CONTENT features."""

    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray
    bias: float

    def z(self, x: np.ndarray) -> np.ndarray:
        z: np.ndarray = ((x - self.mean) / self.scale) @ self.weights + self.bias
        return z


@dataclass(frozen=True)
class Guard:
    """Trust in the head from the Mahalanobis distance of the CONTENT features to the training prompts."""

    mean: np.ndarray
    scale: np.ndarray
    precision: np.ndarray
    near: float  # trust 1 up to here
    far: float  # trust 0 from here

    def distance(self, x: np.ndarray) -> np.ndarray:
        z = (x - self.mean) / self.scale
        if z.ndim == 1:
            one: np.ndarray = np.sqrt(max(float(z @ self.precision @ z), 1e-12))
            return one
        many: np.ndarray = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", z, self.precision, z), 1e-12))
        return many

    def trust(self, d: np.ndarray | float) -> np.ndarray:
        lo, hi = math.log(self.near), math.log(self.far)
        return np.clip((hi - np.log(d)) / (hi - lo), 0.0, 1.0)


@dataclass(frozen=True)
class Parts:
    """How one score came about, for `tiergate policy explain`."""

    score: float
    raw: float
    model_z: float  # the head's (or the multiple-choice expert's) z
    length_z: float
    trust: float
    distance: float
    expert: bool


@dataclass(frozen=True)
class ComplexityModel:
    """A trained complexity scorer: featurizer, head, length prior, shift guard, optional expert, calibration."""

    design: Design
    head: Head
    length_mean: float
    length_sd: float
    guard: Guard
    calibration_raw: np.ndarray
    calibration_score: np.ndarray
    expert: ChoiceExpert | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    featurizer: Featurizer = field(default_factory=Featurizer, repr=False)
    choice_featurizer: ChoiceFeaturizer | None = field(default=None, repr=False)
    _map: PercentileMap = field(init=False, repr=False, compare=False)  # set once, in __post_init__

    def __post_init__(self) -> None:
        if self.expert is not None and self.choice_featurizer is None:
            object.__setattr__(self, "choice_featurizer", ChoiceFeaturizer.for_encoder(self.featurizer.encoder))
        object.__setattr__(self, "_map", PercentileMap(self.calibration_raw, self.calibration_score))

    # ------------------------------------------------------------------------------------- scoring

    def featurize(self, messages: Messages | str) -> Featured:
        return self.featurizer(as_messages(messages) if isinstance(messages, str) else messages)

    def score(self, messages: Messages | str) -> float:
        """Complexity in [0, 1] of a conversation ((role, text) pairs) or a bare prompt."""
        return self.parts(self.featurize(messages)).score

    def parts(self, f: Featured) -> Parts:
        """The score of an already featurized conversation, with how it came about."""
        h = np.asarray(f.values)
        x = h[_CONTENT]
        length_z = (h[LENGTH] - self.length_mean) / self.length_sd
        expert = self.expert is not None and h[OPTIONS] >= MIN_OPTIONS
        if expert:
            assert self.expert is not None and self.choice_featurizer is not None
            model_z = self.expert.z(self.choice_featurizer.values(f.last_text, f.last_ids))
        else:
            model_z = float(self.head.z(x))
        d = float(self.guard.distance(x))
        trust = float(self.guard.trust(d))
        raw = trust * model_z + (1.0 - trust) * length_z
        return Parts(self._map(raw), raw, model_z, float(length_z), trust, d, expert)

    def calibrate(self, raw: np.ndarray | float) -> np.ndarray | float:
        calibrated: np.ndarray | float = np.interp(raw, self.calibration_raw, self.calibration_score)
        return calibrated

    def raw_batch(self, h: np.ndarray, expert_z: np.ndarray | None = None) -> np.ndarray:
        """Raw scores of FEATURES rows (training, benchmarks); expert_z: the expert's z where it applies, else nan."""
        x = h[:, _CONTENT]
        length_z = (h[:, LENGTH] - self.length_mean) / self.length_sd
        model_z = self.head.z(x)
        if expert_z is not None:
            model_z = np.where(np.isnan(expert_z), model_z, np.nan_to_num(expert_z))
        trust = self.guard.trust(self.guard.distance(x))
        raw: np.ndarray = trust * model_z + (1.0 - trust) * length_z
        return raw

    def trust_batch(self, h: np.ndarray) -> np.ndarray:
        return self.guard.trust(self.guard.distance(h[:, _CONTENT]))

    def explain(self, messages: Messages | str, top: int = 5) -> dict[str, Any]:
        """The score and its parts, the features and the head's largest contributions, for `policy explain`."""
        f = self.featurize(messages)
        p = self.parts(f)
        x = np.asarray(f.values)[_CONTENT]
        contrib = (x - self.head.mean) / self.head.scale * self.head.weights
        order = np.argsort(-np.abs(contrib))[:top]
        return {
            "score": round(p.score, 4), "model_z": round(p.model_z, 4), "length_z": round(p.length_z, 4),
            "trust": round(p.trust, 4), "distance": round(p.distance, 4),
            "trusted_up_to": round(self.guard.near, 4), "untrusted_from": round(self.guard.far, 4),
            "scored_by": "multiple-choice expert" if p.expert else "head",
            "top_contributions": {FEATURES[CONTENT[i]]: round(float(contrib[i]), 4) for i in order},
            "features": {name: round(float(v), 4) for name, v in zip(FEATURES, f.values, strict=True)},
        }

    # --------------------------------------------------------------------------------- persistence

    def to_dict(self) -> dict[str, Any]:
        expert = None
        if self.expert is not None and self.choice_featurizer is not None:
            expert = {**self.expert.to_dict(), "vectors_sha256": self.choice_featurizer.vectors_sha256}
        return {
            "format": MODEL_FORMAT, "features": list(FEATURES), "content": [FEATURES[i] for i in CONTENT],
            "tokenizer_sha256": self.featurizer.encoder.sha256, "design": asdict(self.design),
            "head": {"mean": self.head.mean.tolist(), "scale": self.head.scale.tolist(),
                     "weights": self.head.weights.tolist(), "bias": self.head.bias},
            "length_prior": {"mean": self.length_mean, "sd": self.length_sd},
            "guard": {"mean": self.guard.mean.tolist(), "scale": self.guard.scale.tolist(),
                      "precision": self.guard.precision.tolist(), "near": self.guard.near, "far": self.guard.far},
            "calibration": {"raw": self.calibration_raw.tolist(), "score": self.calibration_score.tolist()},
            "choice_expert": expert, "meta": self.meta,
        }

    def save(self, path: Path) -> None:
        """Plain JSON: same model, same bytes."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True) + "\n")

    @staticmethod
    def read(path: str | Path) -> dict[str, Any]:
        """The file's contents after the format check (what `policy check` reports provenance from)."""
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a complexity model ({exc})") from None
        fmt = d.get("format") if isinstance(d, dict) else None
        if fmt != MODEL_FORMAT:
            if isinstance(fmt, str) and fmt.startswith("tiergate-complexity/"):
                raise ValueError(f"{path}: a {fmt} file, this gateway reads {MODEL_FORMAT}; retrain it "
                                 "(tiergate classifier train)")
            raise ValueError(f"{path}: not a {MODEL_FORMAT} file")
        checked: dict[str, Any] = d  # a dict: its format was read above
        return checked

    @classmethod
    def load(cls, path: str | Path, encoder: Encoder | None = None) -> ComplexityModel:
        path = Path(path)
        d = cls.read(path)
        if tuple(d.get("features", ())) != FEATURES:
            raise ValueError(f"{path}: trained with other features than this gateway computes; retrain it")
        featurizer = Featurizer(encoder)
        if d.get("tokenizer_sha256") != featurizer.encoder.sha256:
            raise ValueError(f"{path}: trained with another tokenizer than {featurizer.encoder.tokenizer_file}; "
                             "retrain it")
        try:
            expert, choice = None, None
            if d.get("choice_expert"):
                expert = ChoiceExpert.from_dict(d["choice_expert"])
                choice = ChoiceFeaturizer.for_encoder(featurizer.encoder)
                if d["choice_expert"].get("vectors_sha256") != choice.vectors_sha256:
                    raise ValueError(f"its multiple-choice expert was trained with other word vectors than "
                                     f"{choice.vectors_file}")
            h, g, cal = d["head"], d["guard"], d["calibration"]
            n = len(CONTENT)
            head = Head(_vec(h["mean"], n), _vec(h["scale"], n), _vec(h["weights"], n), float(h["bias"]))
            precision = np.asarray(g["precision"], np.float64)
            if precision.shape != (n, n):
                raise ValueError(f"guard precision of shape {precision.shape}, expected {(n, n)}")
            guard = Guard(_vec(g["mean"], n), _vec(g["scale"], n), precision, float(g["near"]), float(g["far"]))
            if not 0 < guard.near < guard.far:
                raise ValueError("guard distances must satisfy 0 < near < far")
            raw, score = np.asarray(cal["raw"], np.float64), np.asarray(cal["score"], np.float64)
            if len(raw) < 2 or len(raw) != len(score) or np.any(np.diff(raw) <= 0):
                raise ValueError("calibration must be increasing raw values with one score each")
            return cls(Design(**d["design"]), head, float(d["length_prior"]["mean"]), float(d["length_prior"]["sd"]),
                       guard, raw, score, expert, dict(d.get("meta") or {}), featurizer, choice)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}; retrain it") from None
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{path}: incomplete model ({type(exc).__name__}: {exc}); retrain it") from None

    @classmethod
    def provenance(cls, path: str | Path) -> dict[str, Any]:
        """What a model file was trained on and how, without loading it (for `tiergate policy check`)."""
        d = cls.read(path)
        meta = d.get("meta") or {}
        trained = meta.get("trained_on") or {}
        sources = trained.get("sources") or {}
        return {"path": str(path), "format": d["format"],
                "sources": {k: v.get("rows") if isinstance(v, dict) else v for k, v in sources.items()},
                "rows": sum(v.get("rows", 0) if isinstance(v, dict) else 0 for v in sources.values()),
                "files": [{k: f.get(k) for k in ("name", "sha256", "rows")} for f in trained.get("files", [])],
                "license": trained.get("license", "not stated"), "design": d.get("design"),
                "multiple_choice_expert": bool(d.get("choice_expert"))}

    @classmethod
    def load_default(cls) -> ComplexityModel:
        """The model shipped with the gateway (see its `meta` for what it was trained on)."""
        return cls.load(DEFAULT_MODEL_FILE)


def _vec(values: Any, n: int) -> np.ndarray:
    a = np.asarray(values, np.float64)
    if a.shape != (n,):
        raise ValueError(f"a vector of shape {a.shape}, expected ({n},)")
    return a
