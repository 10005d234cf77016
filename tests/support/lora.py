"""A random LoRA adapter GGUF for the tiny demo model, written with the `gguf` package: what `edge-node serve
--lora` and `POST /admin/lora` load, without torch (the training pipeline's real adapters are tested in
tests/training/)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from tiergate.edge_node.model.demo_model import ModelShape

__all__ = ["build_lora"]


def build_lora(path: Path, shape: ModelShape, *, rank: int = 4, seed: int = 0, scale: float = 0.5) -> Path:
    """Adapters on every layer's attention and MLP projections, big enough to change greedy answers."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(rank))
    dims = {"attn_q": (shape.n_embd, shape.n_embd), "attn_v": (shape.n_embd, shape.n_embd),
            "ffn_up": (shape.n_embd, shape.n_ff), "ffn_down": (shape.n_ff, shape.n_embd)}
    for layer in range(shape.n_layer):
        for name, (n_in, n_out) in dims.items():
            a = rng.normal(0, scale, (rank, n_in)).astype(np.float32)
            b = rng.normal(0, scale, (n_out, rank)).astype(np.float32)
            b[0, :] = 0.0  # keep the demo model's bias dimension (residual dim 0) untouched: text stays printable
            w.add_tensor(f"blk.{layer}.{name}.weight.lora_a", a)
            w.add_tensor(f"blk.{layer}.{name}.weight.lora_b", b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
