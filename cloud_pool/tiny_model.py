"""Build a tiny random Llama that vLLM can serve, so tests never download a model.

Runs under the vLLM virtualenv's python (it needs torch and transformers):
`<vllm python> cloud_pool/tiny_model.py OUT_DIR`. It imports nothing from tiergate, so it works
as a plain script there. The weights are random: output is gibberish; tests check structure,
usage counts, streaming, metrics and routing, never content.

Choices that matter to vLLM on CPU: the attention head size must be one its CPU attention supports
(hidden 64 with 2 heads = head size 32); the tokenizer is a byte-level BPE trained here on a
generated corpus (any text is tokenizable, about one token per generated word); the output rows of
special and partial-UTF-8 tokens are zeroed so greedy text stays printable (and EOS is practically
never produced: use `max_tokens`/`ignore_eos` to bound generations).

Tested in `tests/integration/test_cloud_pool.py`.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "build", "words"]

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]

# Role-tagged turns; vLLM reads it from chat_template.jinja (transformers 5 writes it there).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"


def words(n: int, seed: int = 0) -> list[str]:
    """`n` distinct pronounceable pseudo-words (deterministic per seed), the corpus vocabulary."""
    rng = random.Random(seed)
    out: dict[str, None] = {}
    while len(out) < n:
        syllables = rng.randint(1, 3)
        out["".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(syllables))] = None
    return list(out)


def _corpus(vocab: list[str], lines: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(vocab) for _ in range(rng.randint(5, 20))) + "." for _ in range(lines)]


def _train_tokenizer(vocab_size: int, seed: int) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(words(600, seed), 4000, seed), trainer=trainer)
    return tok


def build(out_dir: Path, *, vocab_size: int = 1024, layers: int = 2, seed: int = 0) -> Path:
    """Write config, safetensors weights, tokenizer and chat template to `out_dir`."""
    import torch  # optional dependency: the export extra (tests only)
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # optional: export extra

    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    raw = _train_tokenizer(vocab_size, seed)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=SPECIAL_TOKENS[4:],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    n_vocab = len(tokenizer)
    config = LlamaConfig(
        vocab_size=n_vocab,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=2,  # head size 32: supported by vLLM's CPU attention
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype="float32",  # transformers 5's name (`torch_dtype` is its deprecated alias): config.json "dtype"
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        head = model.lm_head.weight
        for token_id in range(n_vocab):
            text = tokenizer.decode([token_id])
            assert isinstance(text, str)  # one sequence of ids decodes to one string (a batch, to a list)
            if token_id in tokenizer.all_special_ids or "\ufffd" in text or not text.isprintable():
                head[token_id].zero_()
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "tiergate-tiny.json").write_text(json.dumps({"seed": seed, "vocab_size": n_vocab}))
    return out_dir


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    print(build(args.out_dir, layers=args.layers, seed=args.seed))


if __name__ == "__main__":
    _main()
