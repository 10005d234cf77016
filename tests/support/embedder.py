"""The exported ONNX embedder for tests: exported once into <repo>/.tiergate/embedder when missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["embedder_dir", "onnx_embedder"]


@pytest.fixture(scope="session")
def embedder_dir() -> Path:
    from cache.export import default_embedder_dir, export_embedder, is_complete

    path = default_embedder_dir()
    if not is_complete(path):
        try:
            import torch  # noqa: F401
        except ImportError:
            msg = "the embedder is not exported and torch is missing: pip install -e '.[export]'"
            if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
                pytest.fail(msg)
            pytest.skip(msg)
        export_embedder(path)
    return path


@pytest.fixture(scope="session")
def onnx_embedder(embedder_dir: Path):  # -> cache.embedder.OnnxEmbedder, loaded once per session
    from cache.embedder import OnnxEmbedder

    return OnnxEmbedder.load(embedder_dir)
