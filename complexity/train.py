"""Training the complexity model (`tiergate classifier train`), reproducibly: same data, same file.

Input: labelled JSON lines, one request per line, as operators collect them from their own traffic:
`prompt` (text) or `messages` (OpenAI chat messages), `weak_correct` and `strong_correct` (true/false, or a
quality in [0, 1] such as a judge score / 10: fractional labels are fine), and optionally `source`, a name for
the kind of traffic (default: the file's name without extension). Every source weighs the same in training
and in the calibration (the "mixed reference"), so give each kind of traffic its own name.

The target is the gain of escalating, strong - weak quality: its conditional mean is what routing ranks by.
The head is a weighted ridge regression solved with numpy; the multiple-choice expert (complexity/choice.py),
trained when the data has at least `choice.MIN_ROWS` prompts with lettered answer options, needs
scikit-learn (the `dev` extra). The gateway scores the result with numpy alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tiergate.complexity.choice import CHOICE_FEATURES, MIN_ROWS, ChoiceExpert, ChoiceFeaturizer
from tiergate.complexity.features import (
    CONTENT,
    LENGTH,
    OPTIONS,
    Featurizer,
    Messages,
    as_messages,
    last_user_text,
)
from tiergate.complexity.model import MIN_OPTIONS, ComplexityModel, Design, Guard, Head

__all__ = ["Labelled", "choice_matrix", "expert_scores", "fit", "one_blas_thread", "read_labelled", "ridge", "source_weights", "train"]

_CONTENT = np.array(CONTENT)
_FLOOR_SD = 0.1  # a feature that never varied in training: a change in it is a shift, not a division by zero
_SHRINK_COV = 0.05  # covariance + this * I before inverting (on standardised features)


@dataclass(frozen=True)
class Labelled:
    conversations: list[list[tuple[str, str]]]
    weak: np.ndarray  # quality in [0, 1]
    strong: np.ndarray
    source: np.ndarray  # one name per row
    files: list[dict[str, Any]]  # name, sha256, rows, skipped lines: recorded in the model
    errors: list[tuple[str, int, str]]  # (file, line number, why it was skipped)


def _quality(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float) and 0.0 <= value <= 1.0:
        return float(value)
    return None


def _messages(obj: dict[str, Any]) -> list[tuple[str, str]] | None:
    if isinstance(obj.get("prompt"), str):
        return as_messages(obj["prompt"])
    msgs = obj.get("messages")
    if isinstance(msgs, list) and msgs and all(isinstance(m, dict) for m in msgs):
        return as_messages(msgs)
    return None


def read_labelled(paths: Sequence[Path | str]) -> Labelled:
    """Read labelled files; malformed lines are skipped and reported, never fatal."""
    convs: list[list[tuple[str, str]]] = []
    weak: list[float] = []
    strong: list[float] = []
    source: list[str] = []
    files: list[dict[str, Any]] = []
    errors: list[tuple[str, int, str]] = []
    for path in map(Path, paths):
        raw = path.read_bytes()
        rows = skipped = 0
        for n, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as exc:
                errors.append((str(path), n, f"not JSON: {exc}"))
                skipped += 1
                continue
            msgs = _messages(obj) if isinstance(obj, dict) else None
            w = _quality(obj.get("weak_correct")) if msgs is not None else None
            s = _quality(obj.get("strong_correct")) if msgs is not None else None
            if msgs is None:
                why = 'expected an object with a string "prompt" or a list of "messages"'
            elif w is None or s is None:
                why = '"weak_correct" and "strong_correct" must be true/false or a number in [0, 1]'
            elif not isinstance(obj.get("source", ""), str):
                why = '"source" must be a string'
            else:
                convs.append(msgs)
                weak.append(w)
                strong.append(s)
                source.append(obj.get("source") or path.stem)
                rows += 1
                continue
            errors.append((str(path), n, why))
            skipped += 1
        files.append({"name": path.name, "sha256": hashlib.sha256(raw).hexdigest(), "rows": rows,
                      "skipped_lines": skipped})
    return Labelled(convs, np.asarray(weak, np.float64), np.asarray(strong, np.float64), np.asarray(source, str),
                    files, errors)


# ------------------------------------------------------------------------------------------ fitting


def source_weights(src: np.ndarray) -> np.ndarray:
    """Row weights under which every source weighs the same; they sum to the number of rows."""
    _, inverse, counts = np.unique(src, return_inverse=True, return_counts=True)
    w = 1.0 / counts[inverse]
    weights: np.ndarray = w * len(src) / w.sum()
    return weights


def _mean_sd(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mu = np.average(x, axis=0, weights=w)
    return mu, np.sqrt(np.average((x - mu) ** 2, axis=0, weights=w))


def ridge(x: np.ndarray, y: np.ndarray, w: np.ndarray, alpha: float, src: np.ndarray | None = None,
          invariance: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, scale, coefficients) of a weighted ridge regression on standardised columns.

    With `src` and `invariance` > 0, also penalised by invariance * n * (mean over sources of the squared
    difference between a source's mean prediction and the overall one): predictions of equal mean per source."""
    mu, sd = _mean_sd(x, w)
    sd = np.where(sd < 1e-9, 1.0, sd)
    z = (x - mu) / sd
    yc = y - np.average(y, weights=w)
    a = z.T @ (z * w[:, None]) + alpha * np.eye(z.shape[1])
    if src is not None and invariance > 0:
        names = np.unique(src)
        means = np.stack([np.average(z[src == k], axis=0, weights=w[src == k]) for k in names])
        a += invariance * len(y) * (means.T @ means) / len(names)
    return mu, sd, np.linalg.solve(a, z.T @ (w * yc))


def target(weak: np.ndarray, strong: np.ndarray, src: np.ndarray, center: bool) -> np.ndarray:
    """The gain of escalating; centred within each source when `center` (only the ranking inside a source)."""
    gain = strong - weak
    if center:
        for k in np.unique(src):
            gain = np.where(src == k, gain - gain[src == k].mean(), gain)
    centred: np.ndarray = gain
    return centred


def _wquantile(x: np.ndarray, w: np.ndarray, q: float) -> float:
    o = np.argsort(x, kind="stable")
    c = np.cumsum(w[o]) / w.sum()
    return float(x[o][min(int(np.searchsorted(c, q)), len(x) - 1)])


def percentile_map(raw: np.ndarray, w: np.ndarray, points: int = 201) -> tuple[np.ndarray, np.ndarray]:
    """Increasing raw values and the weighted share of reference prompts at or below each."""
    o = np.argsort(raw, kind="stable")
    r, c = raw[o], np.cumsum(w[o]) / w.sum()
    levels = np.linspace(0.0, 1.0, points)
    xs, idx = np.unique(np.interp(levels, c, r), return_index=True)
    ys = levels[idx]
    if len(xs) < 2:
        xs, ys = np.array([xs[0] - 1e-9, xs[0] + 1e-9]), np.array([0.0, 1.0])
    return xs, ys


def choice_matrix(choice: ChoiceFeaturizer, conversations: Sequence[Messages], h: np.ndarray) -> np.ndarray:
    """CHOICE_FEATURES of the rows with answer options (nan rows elsewhere): the expert's training input."""
    out = np.full((len(h), len(CHOICE_FEATURES)), np.nan)
    for i in np.nonzero(h[:, OPTIONS] >= MIN_OPTIONS)[0]:
        out[i] = choice.values(last_user_text(conversations[int(i)]))
    return out


def expert_scores(expert: ChoiceExpert | None, x_choice: np.ndarray | None) -> np.ndarray | None:
    """The expert's z for the rows of `x_choice` with answer options (nan elsewhere); None without an expert."""
    if expert is None or x_choice is None:
        return None
    rows = ~np.isnan(x_choice[:, 0])
    out = np.full(len(x_choice), np.nan)
    out[rows] = [expert.z(r) for r in x_choice[rows].tolist()]
    return out


def fit(h: np.ndarray, weak: np.ndarray, strong: np.ndarray, src: np.ndarray, design: Design,
        x_choice: np.ndarray | None = None, featurizer: Featurizer | None = None,
        head: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> ComplexityModel:
    """The model for FEATURES rows `h` and their labels and source names.

    x_choice: CHOICE_FEATURES rows (nan where a prompt has no options); with at least MIN_ROWS such rows the
    multiple-choice expert is trained on them. head: a ridge fit to reuse (design selection fits many)."""
    sw = source_weights(src)
    x = h[:, _CONTENT]
    mu, sd, coef = head if head is not None else ridge(x, target(weak, strong, src, design.center), sw,
                                                        design.alpha, src, design.invariance)
    head_raw = ((x - mu) / sd) @ coef
    head_mu, head_sd = (float(v) for v in _mean_sd(head_raw, sw))
    head_sd = head_sd or 1.0
    hd = Head(mu, sd, coef / head_sd, -head_mu / head_sd)  # standardised: z over the training prompts
    length_mean, length_sd = (float(v) for v in _mean_sd(h[:, LENGTH], sw))
    length_sd = length_sd or 1.0

    g_mu, g_sd = _mean_sd(x, sw)
    g_sd = np.where(g_sd < 1e-6, _FLOOR_SD, g_sd)
    z = (x - g_mu) / g_sd
    cov = (z * sw[:, None]).T @ z / sw.sum()
    precision = np.linalg.inv(cov + _SHRINK_COV * np.eye(len(CONTENT)))
    d = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", z, precision, z), 1e-12))
    near = _wquantile(d, sw, design.trust_quantile)
    guard = Guard(g_mu, g_sd, precision, near, near * design.trust_multiple)

    expert = None
    if x_choice is not None and np.sum(~np.isnan(x_choice[:, 0])) >= MIN_ROWS:
        rows = ~np.isnan(x_choice[:, 0])
        expert = ChoiceExpert.fit(x_choice[rows], weak[rows], strong[rows])
    expert_z = expert_scores(expert, x_choice)
    feats = featurizer or Featurizer()
    unit = np.array([0.0, 1.0])
    model = ComplexityModel(design, hd, length_mean, length_sd, guard, unit, unit, expert, {}, feats)
    cal_raw, cal_score = percentile_map(model.raw_batch(h, expert_z), sw)
    return ComplexityModel(design, hd, length_mean, length_sd, guard, cal_raw, cal_score, expert, {}, feats,
                           model.choice_featurizer)


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS on one thread: products summed in another order by more threads differ in the last bits, and the
    same data would not give the same model file on every machine setting."""
    try:
        from threadpoolctl import threadpool_limits  # optional dependency: installed with scikit-learn
    except ImportError:
        yield
        return
    with threadpool_limits(1):
        yield


def train(data: Labelled, design: Design | None = None, *, select: bool = False, expert: bool = True,
          license_note: str = "", featurizer: Featurizer | None = None) -> ComplexityModel:
    """Train on all of `data`; the model records what it was trained on, how, and under which license."""
    with one_blas_thread():
        return _train(data, design, select, expert, license_note, featurizer)


def _train(data: Labelled, design: Design | None, select: bool, expert: bool, license_note: str,
           featurizer: Featurizer | None) -> ComplexityModel:
    # an import cycle otherwise: design selection builds on `fit`
    from tiergate.complexity.select import MIN_SOURCES, select_design

    feats = featurizer or Featurizer()
    h = feats.matrix(data.conversations)
    selection: dict[str, Any] = {}
    if select and len(set(data.source.tolist())) >= MIN_SOURCES:
        design, selection = select_design(h, data.weak, data.strong, data.source)
    design = design or Design()
    x_choice = choice_matrix(ChoiceFeaturizer.for_encoder(feats.encoder), data.conversations, h) if expert else None
    model = fit(h, data.weak, data.strong, data.source, design, x_choice, feats)
    cx = np.asarray(model.calibrate(model.raw_batch(h, expert_scores(model.expert, x_choice))))
    trust = model.trust_batch(h)
    counts = Counter(data.source.tolist())
    meta = {
        "trained_on": {
            "sources": {k: {"rows": counts[k], "share_complexity_ge_0.7": round(float(np.mean(cx[data.source == k]
                                                                                             >= 0.7)), 4),
                            "mean_trust": round(float(np.mean(trust[data.source == k])), 4)}
                        for k in sorted(counts)},
            "files": data.files,
            "license": license_note or "not stated (tiergate classifier train --license)",
        },
        "design": asdict(design),
        "selection": selection or f"default design (no --select, or fewer than {MIN_SOURCES} sources)",
        "choice_expert_rows": int(np.sum(~np.isnan(x_choice[:, 0]))) if model.expert is not None and
        x_choice is not None else 0,
    }
    return ComplexityModel(model.design, model.head, model.length_mean, model.length_sd, model.guard,
                           model.calibration_raw, model.calibration_score, model.expert, meta, feats,
                           model.choice_featurizer)
