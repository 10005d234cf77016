"""Build a small llama-architecture GGUF model locally: no downloads, deterministic for a seed.

The weights are random, so the text is gibberish, but everything an edge node touches is real:
a byte-level BPE tokenizer trained here with `tokenizers` (also written as tokenizer.json so the
gateway counts prompt tokens the same way), special tokens, a ChatML chat template in the GGUF
metadata, and llama.cpp's own 4-bit quantizer.

Random output weights would emit partial UTF-8 bytes and control tokens. To keep every sampled
token printable, residual dimension 0 is held at a positive constant through the network (every
token embedding has it; every sublayer's output projection has a zero row 0), so that dimension acts
as a bias after the final norm: unprintable and special tokens get a strongly negative weight on it
and are never sampled, at any temperature. Side effect: EOS is never produced, so generation always
runs to `max_tokens` or a stop string (handy for tests and benchmarks).
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Literal

import gguf
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from tiergate.edge_node.model.quantize import quantize

__all__ = ["CHAT_TEMPLATE", "SHAPES", "DemoModel", "ModelShape", "build_demo_model"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
BOS, EOS, IM_START, IM_END = "<s>", "</s>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (BOS, EOS, IM_START, IM_END)

_BIAS_DIM_VALUE = 4.0  # residual dim 0, constant through the network
_BANNED_LOGIT_WEIGHT = -64.0  # output weight on dim 0 for tokens that must never be sampled


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Llama hyperparameters. Widths are multiples of 256 so Q4_K quantizes every matrix."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int = 4096


SHAPES: MappingProxyType[str, ModelShape] = MappingProxyType(
    {
        # ~4M parameters: thousands of tokens/s on one core, builds in a few seconds.
        "tiny": ModelShape(n_layer=2, n_embd=256, n_head=4, n_head_kv=4, n_ff=768, n_vocab=4096),
        # ~110M parameters: big enough that matrix work, not Python, dominates a decode step.
        "bench": ModelShape(n_layer=12, n_embd=768, n_head=12, n_head_kv=12, n_ff=2048, n_vocab=16384),
    }
)

Quant = Literal["q4_0", "q4_k_m", "f16"]


@dataclass(frozen=True, slots=True)
class DemoModel:
    gguf: Path
    tokenizer_json: Path
    shape: ModelShape


# --------------------------------------------------------------------------- corpus and tokenizer

_WORDS = ["the", "of", "and", "to", "in", "is", "it", "that", "for", "on", "was", "with", "as", "be", "at", "by", "this", "from", "or", "have", "an", "they", "which", "one", "you", "were", "her", "all", "she", "there", "would", "their", "we", "him", "been", "has", "when", "who", "will", "more", "no", "if", "out", "so", "said", "what", "up", "its", "about", "into", "than", "them", "can", "only", "other", "new", "some", "could", "time", "these", "two", "may", "then", "do", "first", "any", "my", "now", "such", "like", "our", "over", "man", "me", "even", "most", "made", "after", "also", "did", "many", "before", "must", "through", "back", "years", "where", "much", "your", "way", "well", "down", "should", "because", "each", "just", "those", "people", "how", "too", "little", "state", "good", "very", "make", "world", "still", "own", "see", "men", "work", "long", "get", "here", "between", "both", "life", "being", "under", "never", "day", "same", "another", "know", "while", "last", "might", "us", "great", "old", "year", "off", "come", "since", "against", "go", "came", "right", "used", "take", "three", "edge", "cloud", "gateway", "model", "token", "request", "stream", "cache", "route", "policy", "latency", "tenant", "priority", "answer", "question", "server", "node", "batch", "decode", "prompt", "reply", "quick", "brown", "fox", "jumps", "lazy", "dog", "river", "mountain", "coffee", "garden", "window", "music", "paper", "light"]
_UNICODE_WORDS = ("café", "naïve", "über", "jalapeño", "straße", "déjà", "vu", "日本語", "中文", "Ελληνικά", "мир")
_SYLLABLES = (
    ["ka", "ri", "to", "na", "mi", "so", "lu", "ve", "ra", "de", "pa", "ko", "ti", "ne", "ba", "gu", "zo", "fe", "li", "mo", "sa", "ru", "ki", "ha", "yo", "ze", "wa", "pi", "du", "no", "me", "ta"]
)


def _corpus(n_vocab: int, seed: int) -> list[str]:
    """Deterministic pseudo-English lines; invented words give BPE enough pairs to fill the vocabulary."""
    rng = random.Random(seed)
    n_invented = max(200, n_vocab // 2)
    invented = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))) for _ in range(n_invented)]
    lines: list[str] = []
    n_lines = 3000 + n_vocab * 3
    for i in range(n_lines):
        words = []
        for _ in range(rng.randint(4, 16)):
            r = rng.random()
            if r < 0.55:
                words.append(rng.choice(_WORDS))
            elif r < 0.93:
                words.append(rng.choice(invented))
            elif r < 0.97:
                words.append(str(rng.randint(0, 2025)))
            else:
                words.append(rng.choice(_UNICODE_WORDS))
        if rng.random() < 0.3:
            words[0] = words[0].capitalize()
        line = " ".join(words) + rng.choice((".", ".", ",", "?", "!", ":", ";"))
        if i % 7 == 0:
            line = f"{rng.choice(_WORDS)}({rng.choice(invented)}, {rng.randint(0, 99)}) = [{line}]"
        lines.append(line)
    return lines


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable-character map used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def _train_tokenizer(n_vocab: int, seed: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=n_vocab,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(n_vocab, seed), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


def _special_id(tok: Tokenizer, token: str) -> int:
    """The id of one of SPECIAL_TOKENS (training adds them all to the vocabulary)."""
    token_id = tok.token_to_id(token)
    if token_id is None:
        raise ValueError(f"the trained tokenizer lacks the special token {token!r}")
    return token_id


def _token_bytes(token: str, byte_decoder: dict[str, int]) -> bytes | None:
    try:
        return bytes(byte_decoder[c] for c in token)
    except KeyError:
        return None


def _printable(raw: bytes | None) -> bool:
    if raw is None:
        return False
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c in " \n" for c in text)


# --------------------------------------------------------------------------- weights


def _weights(shape: ModelShape, n_vocab: int, allowed: np.ndarray,
             seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (name, array) in GGUF order; matrices as float16 (out, in), norms as float32."""
    rng = np.random.default_rng(seed)
    d, f = shape.n_embd, shape.n_ff
    head_dim = d // shape.n_head
    d_kv = head_dim * shape.n_head_kv

    def mat(rows: int, cols: int, std: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * std).astype(np.float16)

    emb = mat(n_vocab, d, 1.0)
    emb[:, 0] = _BIAS_DIM_VALUE
    yield "token_embd.weight", emb
    ones = np.ones(d, dtype=np.float32)
    s_in, s_ff = 1.0 / np.sqrt(d), 1.0 / np.sqrt(f)
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", ones
        yield p + "attn_q.weight", mat(d, d, s_in)
        yield p + "attn_k.weight", mat(d_kv, d, s_in)
        yield p + "attn_v.weight", mat(d_kv, d, s_in)
        wo = mat(d, d, s_in)
        wo[0, :] = 0  # never write residual dim 0: it stays the constant bias input
        yield p + "attn_output.weight", wo
        yield p + "ffn_norm.weight", ones
        yield p + "ffn_gate.weight", mat(f, d, s_in)
        yield p + "ffn_up.weight", mat(f, d, s_in)
        down = mat(d, f, s_ff)
        down[0, :] = 0
        yield p + "ffn_down.weight", down
    yield "output_norm.weight", ones
    out = mat(n_vocab, d, 3.0 / np.sqrt(d))
    out[:, 0] = 0
    out[~allowed, :] = 0
    out[~allowed, 0] = _BANNED_LOGIT_WEIGHT
    yield "output.weight", out


# --------------------------------------------------------------------------- builder


def _write_gguf(path: Path, shape: ModelShape, tok: Tokenizer, seed: int, name: str) -> None:
    vocab = tok.get_vocab()
    n_vocab = len(vocab)
    tokens = [""] * n_vocab
    for t, i in vocab.items():
        tokens[i] = t
    byte_decoder = {c: b for b, c in _bytes_to_unicode().items()}
    special_ids = {tok.token_to_id(s) for s in SPECIAL_TOKENS}
    types = [gguf.TokenType.CONTROL if i in special_ids else gguf.TokenType.NORMAL for i in range(n_vocab)]
    allowed = np.array(
        [i not in special_ids and _printable(_token_bytes(t, byte_decoder)) for i, t in enumerate(tokens)]
    )
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]

    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_name(name)
    w.add_context_length(shape.n_ctx_train)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_dimension_count(shape.n_embd // shape.n_head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(_special_id(tok, BOS))
    w.add_eos_token_id(_special_id(tok, EOS))
    w.add_eot_token_id(_special_id(tok, IM_END))
    w.add_pad_token_id(_special_id(tok, EOS))
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    for tname, arr in _weights(shape, n_vocab, allowed, seed):
        w.add_tensor(tname, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def build_demo_model(
    out_dir: str | Path,
    size: str = "tiny",
    quant: Quant = "q4_0",
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> DemoModel:
    """Write `tiergate-demo-<size>-<quant>.gguf` and `tokenizer.json` into out_dir and return their paths.

    Quantizing goes through llama.cpp's own quantizer, so llama-cpp-python must be installed for q4_*.
    """
    if size not in SHAPES:
        raise ValueError(f"unknown size {size!r}: choose one of {', '.join(SHAPES)}")
    if quant not in ("q4_0", "q4_k_m", "f16"):
        raise ValueError(f"unknown quantization {quant!r}: choose q4_0, q4_k_m or f16")
    shape = SHAPES[size]
    say = progress or (lambda _msg: None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    say(f"training a {shape.n_vocab}-token byte-level BPE tokenizer")
    tok = _train_tokenizer(shape.n_vocab, seed)
    tok_path = out / "tokenizer.json"
    tok.save(str(tok_path))

    final = out / f"tiergate-demo-{size}-{quant}.gguf"
    name = f"tiergate-demo-{size}"
    if quant == "f16":
        say(f"writing {shape.n_layer}-layer, {shape.n_embd}-wide F16 weights")
        _write_gguf(final, shape, tok, seed, name)
    else:
        with tempfile.TemporaryDirectory(dir=out) as tmp:
            f16 = Path(tmp) / "model.f16.gguf"
            say(f"writing {shape.n_layer}-layer, {shape.n_embd}-wide F16 weights")
            _write_gguf(f16, shape, tok, seed, name)
            say(f"quantizing to {quant.upper()} with llama.cpp")
            quantize(f16, final, quant, show_progress=False)
    return DemoModel(gguf=final, tokenizer_json=tok_path, shape=shape)
