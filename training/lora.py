"""LoRA fine-tuning of the edge model, starting from the weights the fleet runs: its GGUF read back into torch.

The adapter is trained on the dequantized INT4 weights and later applied over that same unchanged GGUF, so the
gain is not lost to a second quantization step. The loss is on the answer tokens only (the prompt is context).
Checkpoints hold the adapter, the optimizer and the step, so an interrupted run resumes where it stopped.

Tested in `tests/training/test_pipeline.py`.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gguf
import torch
from llama_cpp import Llama
from peft import LoraConfig, PeftModel, get_peft_model
from tokenizers import pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from tiergate.training.data import Example

__all__ = ["TARGET_MODULES", "TokenizerMismatch", "TrainConfig", "check_tokenizer", "load_base", "save_base",
           "train_lora"]

TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
_STATE = "trainer_state.pt"


@dataclass(frozen=True, slots=True)
class TrainConfig:
    rank: int = 16
    alpha: int = 32
    lr: float = 1e-3
    epochs: float = 2.0
    batch_size: int = 8
    max_len: int = 256
    checkpoint_every: int = 20
    seed: int = 0
    threads: int = 1

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class TokenizerMismatch(ValueError):
    """transformers tokenizes the model's text differently from llama.cpp: training would teach other tokens."""


def _gguf_string(path: Path, key: str) -> str | None:
    field = gguf.GGUFReader(path).get_field(key)
    return field.contents() if field is not None else None


def check_tokenizer(model_gguf: Path, tok: PreTrainedTokenizerBase, texts: list[str]) -> None:
    """Refuse to train when transformers' ids for `texts` differ from llama.cpp's (the runtime that serves)."""
    llm = Llama(model_path=str(model_gguf), vocab_only=True, verbose=False)
    try:
        for text in texts:
            theirs = llm.tokenize(text.encode(), add_bos=False, special=True)
            ours = tok(text, add_special_tokens=False)["input_ids"]
            if ours != theirs:
                raise TokenizerMismatch(f"{model_gguf}: transformers and llama.cpp tokenize {text[:80]!r} differently "
                                        f"({len(ours)} and {len(theirs)} tokens)")
    finally:
        llm.close()


def load_base(model_gguf: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The GGUF as a float32 torch model (a plain one: transformers will not save a GGUF-loaded model) and its
    tokenizer with the GGUF's chat template."""
    with tempfile.TemporaryDirectory() as tmp:  # from_pretrained(dir, gguf_file=name) wants a folder
        (Path(tmp) / "model.gguf").symlink_to(model_gguf.resolve())
        tok = AutoTokenizer.from_pretrained(tmp, gguf_file="model.gguf")
        loaded = AutoModelForCausalLM.from_pretrained(tmp, gguf_file="model.gguf", dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # on the CPU: its buffers are computed
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.tie_weights()
    if _gguf_string(model_gguf, "tokenizer.ggml.pre") == "smollm":
        # transformers knows no "smollm" pre-tokenizer and falls back to GPT-2's; llama.cpp splits digits first.
        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    template = _gguf_string(model_gguf, "tokenizer.chat_template")
    if template and not tok.chat_template:
        tok.chat_template = template
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok


def save_base(model: PreTrainedModel, tok: PreTrainedTokenizerBase, out: Path) -> Path:
    """The dequantized base as a Hugging Face folder: what `convert_lora_to_gguf.py --base` reads."""
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def chat_texts(tok: PreTrainedTokenizerBase, rows: list[Example]) -> list[str]:
    """Each example as the model sees it in training: prompt and answer through the chat template."""
    return [tok.apply_chat_template([*ex.chat, {"role": "assistant", "content": ex.answer}], tokenize=False)
            for ex in rows]


def _encode(tok: PreTrainedTokenizerBase, ex: Example, max_len: int) -> tuple[list[int], list[int]]:
    prompt = tok.apply_chat_template(ex.chat, tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template([*ex.chat, {"role": "assistant", "content": ex.answer}], tokenize=False)
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    ids = tok(full, add_special_tokens=False)["input_ids"][:max_len]
    labels = [-100] * min(len(p_ids), len(ids)) + ids[len(p_ids):]
    return ids, labels


def _batch(rows: list[tuple[list[int], list[int]]], pad: int) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (x, y) in enumerate(rows):
        ids[i, : len(x)] = torch.tensor(x)
        labels[i, : len(y)] = torch.tensor(y)
        mask[i, : len(x)] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def train_lora(model: PreTrainedModel, tok: PreTrainedTokenizerBase, train: list[Example], cfg: TrainConfig,
               workdir: Path, *, resume: bool = True, max_steps: int | None = None,
               progress: Callable[[int, int, float], None] | None = None,
               say: Callable[[str], None] | None = None) -> Path:
    """Train, checkpointing into `workdir/checkpoint`; returns the folder of the final peft adapter."""
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ckpt = workdir / "checkpoint"
    lora = LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=0.0, target_modules=TARGET_MODULES,
                      task_type="CAUSAL_LM")
    step = 0
    if resume and (ckpt / _STATE).exists():
        peft_model = PeftModel.from_pretrained(model, ckpt, is_trainable=True)
        state = torch.load(ckpt / _STATE, weights_only=False)
        step = state["step"]
        if say is not None:
            say(f"resuming from the checkpoint at step {step}")
    else:
        peft_model = get_peft_model(model, lora)
        state = None
    peft_model.to(device)
    opt = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=cfg.lr)
    if state is not None:
        opt.load_state_dict(state["optimizer"])
    rows = [_encode(tok, ex, cfg.max_len) for ex in train]
    per_epoch = max(1, -(-len(rows) // cfg.batch_size))
    total = max(1, round(per_epoch * cfg.epochs)) if max_steps is None else max_steps
    peft_model.train()
    while step < total:
        order = list(range(len(rows)))
        random.Random(cfg.seed + step // per_epoch).shuffle(order)
        at = (step % per_epoch) * cfg.batch_size
        batch = _batch([rows[i] for i in order[at: at + cfg.batch_size]], tok.pad_token_id)
        loss = peft_model(**{k: v.to(device) for k, v in batch.items()}).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        step += 1
        if progress is not None:
            progress(step, total, float(loss.detach()))
        if step % cfg.checkpoint_every == 0 or step == total:
            peft_model.save_pretrained(ckpt)
            torch.save({"step": step, "optimizer": opt.state_dict()}, ckpt / _STATE)
    final = workdir / "adapter"
    peft_model.save_pretrained(final)
    (final / "training.json").write_text(json.dumps({"steps": step, **cfg.as_dict()}, indent=2) + "\n")
    return final
