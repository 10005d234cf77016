"""The tokenizer rebuilt from a GGUF counts tokens exactly as llama.cpp tokenizes (what the gateway relies on)."""

from __future__ import annotations

import pytest

from tiergate.edge_node.model.gguf_tokenizer import tokenizer_from_gguf
from tiergate.edge_node.model.packaged import packaged_path

TEXTS = ["Hello world", "What is 12 times 12345?", "  spaces  and\ttabs\n\nnewlines", "Ünïcödé façade — naïve 😀",
         "<|im_start|>user\nhi<|im_end|>", "x=3.14159; y = x**2 // 7", "don't won't I'll", "https://ex.com/a?b=c&d=1",
         "def f(a, b):\n    return a+b  # comment\n", "2024-11-25T04:19:07Z 1,234,567.89"]


@pytest.mark.parametrize("model", ["smollm2", "demo"])
def test_same_ids_as_llama_cpp(model, edge_model):
    import llama_cpp  # optional dependency: the edge extra

    path = packaged_path("smollm2-135m-instruct") if model == "smollm2" else edge_model.gguf
    tok = tokenizer_from_gguf(path)
    llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    for text in TEXTS:
        assert tok.encode(text).ids == llm.tokenize(text.encode(), add_bos=False, special=True), text
