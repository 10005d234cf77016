from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.cache.helpers import fresh_metrics
from tiergate.cache.batcher import EmbeddingBatcher
from tiergate.cache.embedder import EmbedderError, OnnxEmbedder, clean_text, resolve_embedder_path


def test_vectors_are_normalised_and_paraphrases_are_close(onnx_embedder: OnnxEmbedder) -> None:
    emb = onnx_embedder.embed(["How do I bake bread?", "How can I bake bread?", "What is the GDP of Peru?"])
    v = emb.vectors
    assert v.shape == (3, onnx_embedder.dim) == (3, 384)
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] > 0.9 > v[0] @ v[2]
    assert not emb.truncated.any()


def test_long_texts_are_flagged_as_truncated(onnx_embedder: OnnxEmbedder) -> None:
    emb = onnx_embedder.embed(["short", "word " * 400])
    assert emb.truncated.tolist() == [False, True]


def test_junk_input_embeds(onnx_embedder: OnnxEmbedder) -> None:
    emb = onnx_embedder.embed(["", "\x00\x01", "\ud800", "🙂" * 10])
    assert np.isfinite(emb.vectors).all()
    assert clean_text(b"\xff\xfeok") == "\ufffd\ufffdok"


def test_missing_embedder_says_how_to_make_one(tmp_path) -> None:
    with pytest.raises(EmbedderError, match="export-embedder"):
        resolve_embedder_path(tmp_path / "nope")
    with pytest.raises(EmbedderError, match="no ONNX model"):
        OnnxEmbedder.load(tmp_path)


def test_unknown_hub_name_offline_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EmbedderError, match="offline"):
        resolve_embedder_path("sentence-transformers/definitely-not-cached-here")


@pytest.mark.anyio
async def test_concurrent_requests_are_embedded_together(onnx_embedder: OnnxEmbedder) -> None:
    metrics, registry = fresh_metrics()
    batcher = EmbeddingBatcher(onnx_embedder, metrics, linger_ms=50)
    texts = [f"question number {i} about bread" for i in range(8)] + ["a much longer question " * 20]
    try:
        got = await asyncio.gather(*(batcher.embed(t) for t in texts))
    finally:
        await batcher.stop()
    assert registry.get_sample_value("tiergate_cache_embedding_batch_size_sum") == len(texts)
    assert registry.get_sample_value("tiergate_cache_embedding_batch_size_count") == 1  # one batch for all
    alone = onnx_embedder.embed(texts).vectors
    for i, v in enumerate(got):
        assert float(v.values @ alone[i]) > 0.999  # same vectors as embedding them directly, in order


def test_window_counts_are_the_model_tokens_or_none_past_the_window(onnx_embedder: OnnxEmbedder) -> None:
    counts = onnx_embedder.window_counts(["hello world", "word " * 400, "a"])
    assert counts[0] == onnx_embedder.token_count("hello world") == 4  # [CLS] hello world [SEP]
    assert counts[1] is None
    assert counts[2] == 3  # padding to the batch's longest is not counted
