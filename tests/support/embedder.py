"""The exported ONNX embedder for tests: exported once into <repo>/.tiergate/embedder when missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.require import skip_or_fail
from tiergate.cache.embedder import OnnxEmbedder
from tiergate.cache.training.export import default_embedder_dir, export_embedder, is_complete

__all__ = ["embedder_dir", "onnx_embedder"]


@pytest.fixture(scope="session")
def embedder_dir() -> Path:
    path = default_embedder_dir()
    if not is_complete(path):
        try:
            import torch  # noqa: F401
        except ImportError:
            skip_or_fail("the embedder is not exported and torch is missing: pip install -e '.[export]'",
                         "embedder")
        export_embedder(path)
    return path


@pytest.fixture(scope="session")
def onnx_embedder(embedder_dir: Path) -> OnnxEmbedder:  # loaded once per session
    return OnnxEmbedder.load(embedder_dir)
