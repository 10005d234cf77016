"""The labelled question pairs and their embeddings, computed once and kept under .tiergate/.

Calibration and the benchmark both sweep thresholds many times; embedding 80k questions takes minutes
on one core, so the vectors are cached, keyed by the data file and the embedder model's contents.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.report import REPO
from tiergate.cache.embedder import OnnxEmbedder
from tiergate.cache.training.export import default_embedder_dir

_RELATIVE = Path("shared") / "data" / "cache" / "qqp_pairs_dev.jsonl"
# ../shared/... next to the checkout; from a git worktree (one more level down) the nearest such folder above it.
DEFAULT_PAIRS = next((p / _RELATIVE for p in REPO.parents if (p / _RELATIVE).is_file()), REPO.parent / _RELATIVE)


@dataclass(frozen=True)
class Pairs:
    a: list[str]
    b: list[str]
    duplicate: np.ndarray  # bool
    va: np.ndarray  # (n, dim) float32
    vb: np.ndarray

    @property
    def cosine(self) -> np.ndarray:
        return (self.va * self.vb).sum(1)

    def node_ids(self) -> tuple[np.ndarray, np.ndarray]:
        """One id per distinct question (every `a` first, then every `b`, in file order): the ids of each pair's
        `a` and `b`."""
        ids: dict[str, int] = {}
        a = np.array([ids.setdefault(t, len(ids)) for t in self.a])
        b = np.array([ids.setdefault(t, len(ids)) for t in self.b])
        return a, b

    def take(self, idx: np.ndarray) -> Pairs:
        return Pairs([self.a[i] for i in idx], [self.b[i] for i in idx], self.duplicate[idx],
                     self.va[idx], self.vb[idx])


def split(n: int, held_out: float = 0.5, seed: int = 20261122) -> tuple[np.ndarray, np.ndarray]:
    """Fixed random split: (calibration indices, held-out indices). Held-out pairs never tune anything."""
    perm = np.random.default_rng(seed).permutation(n)
    cut = int(n * (1 - held_out))
    return np.sort(perm[:cut]), np.sort(perm[cut:])


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def load_pairs(path: Path = DEFAULT_PAIRS, embedder_dir: Path | None = None, batch: int = 64) -> Pairs:
    embedder_dir = Path(embedder_dir or default_embedder_dir())
    a, b, dup = [], [], []
    with path.open(encoding="utf-8") as f:
        for line in f:
            o = json.loads(line)
            a.append(str(o["a"]))
            b.append(str(o["b"]))
            dup.append(bool(o["duplicate"]))
    key = f"{digest(path)}-{digest(embedder_dir / 'model.onnx')}-single"  # one text per run, as served
    cache_file = REPO / ".tiergate" / "calib" / f"pairs-{key}.npz"
    if cache_file.is_file():
        z = np.load(cache_file)
        va, vb = z["va"], z["vb"]
    else:
        emb = OnnxEmbedder.load(embedder_dir)
        texts = sorted(set(a) | set(b))
        vecs = np.zeros((len(texts), emb.dim), np.float32)
        started = time.perf_counter()
        for i in range(0, len(texts), batch):
            vecs[i:i + batch] = emb.embed(texts[i:i + batch]).vectors
            if (i // batch) % 100 == 0:
                print(f"embedding pairs: {i}/{len(texts)} ({time.perf_counter() - started:.0f} s)",
                      file=sys.stderr)
        pos = {t: i for i, t in enumerate(texts)}
        va = vecs[[pos[t] for t in a]]
        vb = vecs[[pos[t] for t in b]]
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        np.savez(cache_file, va=va, vb=vb)
    return Pairs(a, b, np.asarray(dup), va, vb)
