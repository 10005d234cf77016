"""The learned pre-generation router's model: P(the edge's answer stands) from what is known before a request is
decided, as plain numpy (the gateway never imports scikit-learn or torch).

The features are the ones an outcome record keeps (`gateway.outcomes`), so that a model trained on records predicts
on live requests exactly as it was trained: a few dense numbers (complexity score, token counts, sampling, a
lettered-options flag, digit and line shares) and the prompt's words hashed into `HASH_BUCKETS` buckets (crc32,
stable across processes, unlike `hash()`): word counts, not text, so a record holds no prompt.

A model is one logistic regression with Platt calibration on top (trained by `complexity.router_train`), per edge
model version: what the edge can answer changes with the edge model, so a router answers for one version only.
An artifact holds the models of several versions; the gateway reloads it when it changes (`gateway.learned_router`).

Tested in `tests/complexity/test_edge_router.py`.
"""

from __future__ import annotations

import json
import math
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tiergate.core.types import Features

__all__ = ["FEATURES_VERSION", "HASH_BUCKETS", "RouterArtifact", "RouterFeatures", "RouterModel", "features_of",
           "router_features"]

FEATURES_VERSION = 1  # bump when `router_features` changes: records and models of another version are not mixed
HASH_BUCKETS = 256
DENSE = 8  # dense features before the hashed words
_TEXT_CHARS = 4000  # the start of the prompt is what the words are read from: bounded work per request
_WORD = re.compile(r"[a-z0-9]+")
_OPTIONS = re.compile(r"(?m)^\s*\(?[A-D][\).:]\s")  # lettered answer options, MMLU-style

Vector = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class RouterFeatures:
    """One request's router features: the dense part and the hashed words (bucket -> weight), sparse."""

    dense: tuple[float, ...]
    words: dict[int, float]

    def vector(self) -> Vector:
        out = np.zeros(DENSE + HASH_BUCKETS)
        out[:DENSE] = self.dense
        for k, v in self.words.items():
            out[DENSE + k] = v
        return out

    def to_json(self) -> dict[str, Any]:
        return {"d": [round(x, 5) for x in self.dense], "w": {str(k): round(v, 5) for k, v in self.words.items()}}

    @classmethod
    def from_json(cls, obj: Any) -> RouterFeatures:
        """ValueError when `obj` is not what `to_json` writes (a record of another version, or damaged)."""
        if not isinstance(obj, dict) or not isinstance(obj.get("d"), list) or not isinstance(obj.get("w"), dict):
            raise ValueError("features must be {d: [...], w: {...}}")
        dense = tuple(float(x) for x in obj["d"])
        if len(dense) != DENSE:
            raise ValueError(f"features have {len(dense)} dense values, expected {DENSE}")
        words = {int(k): float(v) for k, v in obj["w"].items()}
        if any(not 0 <= k < HASH_BUCKETS for k in words):
            raise ValueError("a word bucket is out of range")
        return cls(dense, words)


def router_features(*, prompt_tokens: int, complexity: float, max_tokens: int | None, temperature: float | None,
                    stream: bool, text: str) -> RouterFeatures:
    """The features of one request (everything here is known before the policy decides)."""
    head = text[:_TEXT_CHARS]
    lower = head.lower()
    words = _WORD.findall(lower)
    counts: dict[int, float] = {}
    for w in words:
        k = zlib.crc32(w.encode()) % HASH_BUCKETS
        counts[k] = counts.get(k, 0.0) + 1.0
    norm = 1.0 / math.sqrt(sum(v * v for v in counts.values())) if counts else 0.0
    chars = max(len(head), 1)
    dense = (
        float(complexity),
        math.log1p(max(prompt_tokens, 0)) / 8.0,
        math.log1p(max(max_tokens or 0, 0)) / 8.0,
        min(float(temperature if temperature is not None else 1.0), 2.0) / 2.0,
        1.0 if stream else 0.0,
        1.0 if len(_OPTIONS.findall(head)) >= 2 else 0.0,
        sum(map(str.isdigit, head)) / chars,
        min(head.count("\n"), 64) / 64.0,
    )
    return RouterFeatures(dense, {k: v * norm for k, v in counts.items()})


def features_of(f: Features) -> RouterFeatures:
    """The router's features of a classified request (the same on the request path, in records and in simulate)."""
    return router_features(prompt_tokens=f.prompt_tokens, complexity=f.complexity, max_tokens=f.max_tokens,
                           temperature=f.temperature, stream=f.stream, text=f.text)


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


@dataclass(frozen=True, slots=True)
class RouterModel:
    """A calibrated logistic regression for one edge model version: P = sigmoid(a * (w.x + b) + c)."""

    edge_version: str
    weights: Vector
    bias: float
    platt_a: float = 1.0
    platt_b: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)  # outcomes trained on, prior version, held-out scores

    def logit(self, f: RouterFeatures) -> float:
        w = self.weights
        z = self.bias + float(np.dot(w[:DENSE], f.dense))
        for k, v in f.words.items():
            z += float(w[DENSE + k]) * v
        return z

    def predict(self, f: RouterFeatures) -> float:
        """P(the edge's answer stands) for one request."""
        return _sigmoid(self.platt_a * self.logit(f) + self.platt_b)

    def to_json(self) -> dict[str, Any]:
        return {"weights": [round(float(x), 7) for x in self.weights], "bias": self.bias, "platt_a": self.platt_a,
                "platt_b": self.platt_b, "meta": self.meta}

    @classmethod
    def from_json(cls, version: str, obj: Any) -> RouterModel:
        if not isinstance(obj, dict):
            raise ValueError(f"model for {version!r} is not an object")
        weights = np.asarray(obj.get("weights"), dtype=np.float64)
        if weights.shape != (DENSE + HASH_BUCKETS,) or not np.all(np.isfinite(weights)):
            raise ValueError(f"model for {version!r}: weights must be {DENSE + HASH_BUCKETS} finite numbers")
        vals = [float(obj.get(k, d)) for k, d in (("bias", 0.0), ("platt_a", 1.0), ("platt_b", 0.0))]
        if not all(math.isfinite(v) for v in vals):
            raise ValueError(f"model for {version!r}: bias and calibration must be finite")
        return cls(version, weights, vals[0], vals[1], vals[2], dict(obj.get("meta") or {}))


@dataclass(frozen=True, slots=True)
class RouterArtifact:
    """The router models of a deployment, one per edge model version, as one JSON file."""

    models: dict[str, RouterModel]

    def get(self, edge_version: str) -> RouterModel | None:
        return self.models.get(edge_version)

    def latest_other(self, edge_version: str) -> RouterModel | None:
        """The most recently trained model of another version: the prior for a newly promoted edge model."""
        others = [m for v, m in self.models.items() if v != edge_version]
        return max(others, key=lambda m: float(m.meta.get("trained_at", 0)), default=None)

    def with_model(self, model: RouterModel) -> RouterArtifact:
        return RouterArtifact({**self.models, model.edge_version: model})

    @classmethod
    def load(cls, path: Path) -> RouterArtifact:
        """FileNotFoundError when there is none (yet); ValueError (naming the file) when it is not a router artifact
        of this features version."""
        try:
            obj = json.loads(path.read_text())
        except FileNotFoundError:
            raise
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: cannot read a router model: {exc}") from None
        if not isinstance(obj, dict) or obj.get("kind") != "tiergate-edge-router":
            raise ValueError(f"{path}: not a tiergate edge router model (kind: tiergate-edge-router)")
        if obj.get("features_version") != FEATURES_VERSION:
            raise ValueError(f"{path}: features version {obj.get('features_version')!r}, this gateway reads "
                             f"{FEATURES_VERSION}: retrain it with `tiergate classifier train --from-outcomes`")
        models = obj.get("models")
        if not isinstance(models, dict):
            raise ValueError(f"{path}: `models` must be an object of edge version -> model")
        try:
            return cls({str(v): RouterModel.from_json(str(v), m) for v, m in models.items()})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from None

    def save(self, path: Path) -> None:
        """Written whole to a temporary file and renamed, so a gateway watching `path` never reads half of it."""
        doc = {"kind": "tiergate-edge-router", "features_version": FEATURES_VERSION,
               "models": {v: m.to_json() for v, m in sorted(self.models.items())}}
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(doc, separators=(",", ":")))
        os.replace(tmp, path)
