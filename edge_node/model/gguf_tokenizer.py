"""A `tokenizers` tokenizer.json built from a GGUF's own vocabulary, so a gateway counts prompt tokens as the edge
model does without loading llama.cpp (`tiergate prepare` writes one for the demo's edge model).

Byte-level BPE models (`tokenizer.ggml.model = gpt2`) only: their tokens and merges are in the GGUF, and the
pre-tokenizer is named by `tokenizer.ggml.pre` (`gpt-2`; `smollm` also splits digits one by one). Control
tokens become special added tokens. tests/edge_node/model/test_gguf_tokenizer.py checks the result against
llama.cpp's own tokenization.
"""

from __future__ import annotations

from pathlib import Path

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from tiergate.edge_node.model.model_file import ModelFileError

__all__ = ["tokenizer_from_gguf"]

_CONTROL = 3  # gguf TokenType.CONTROL


def _strings(reader: gguf.GGUFReader, key: str) -> list[str]:
    field = reader.fields[key]
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def _merge(rule: str) -> tuple[str, str]:
    """A GGUF merge rule, "left right", as the pair BPE takes."""
    left, right = rule.split(" ", 1)
    return left, right


def tokenizer_from_gguf(path: Path) -> Tokenizer:
    reader = gguf.GGUFReader(str(path))
    model = bytes(reader.fields["tokenizer.ggml.model"].parts[-1]).decode()
    pre = bytes(reader.fields["tokenizer.ggml.pre"].parts[-1]).decode() if "tokenizer.ggml.pre" in reader.fields \
        else "default"
    if model != "gpt2" or pre not in ("gpt-2", "smollm", "default"):
        raise ModelFileError(f"{path}: tokenizer {model}/{pre} is not byte-level BPE this module can rebuild")
    tokens = _strings(reader, "tokenizer.ggml.tokens")
    merges = [_merge(m) for m in _strings(reader, "tokenizer.ggml.merges")]
    types = reader.fields["tokenizer.ggml.token_type"]
    kinds = [int(types.parts[i][0]) for i in types.data]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if pre == "smollm" else byte_level)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, kinds, strict=True) if k == _CONTROL])
    return tok
