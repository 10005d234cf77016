"""`train_lora` on a GPU, on an export the CPU rounds of bench/flywheel trained on: the GPU side of a one-off check.

    python3 bench/flywheel/gpu_train.py --model SmolLM2-135M-Instruct.Q4_1.gguf --export export-2000.jsonl \
        --epochs 1.0 --rank 16 --lr 0.002 --batch-size 8 --heldout-share 0.1 --newest-share 0.05 [--steps 45] --out RUN

Meant for a machine with a GPU and torch, transformers and peft but without this project installed (put its
`training/` and `core/` on the path as `tiergate.training` and `tiergate.core`, and `gguf`). It splits the export as
`tiergate distill train` does, trains, and writes the adapter (f16 safetensors: what llama.cpp's converter makes of it
anyway) and a JSON report (device, versions, wall and CPU time, steps, losses, peak GPU memory) into RUN. Convert
and gate the adapter where llama.cpp runs, as a CPU-trained one (docs/distill.md, "The same training on a GPU").
Not run in CI: CI has no GPU.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import types
from pathlib import Path


def _without_llama_cpp() -> None:
    """Only check_tokenizer needs llama.cpp, and it is device-independent: it runs where the CLI runs, not here."""
    stub = types.ModuleType("llama_cpp")

    class Llama:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("llama.cpp is not used on the GPU machine")

    stub.Llama = Llama  # type: ignore[attr-defined]
    sys.modules.setdefault("llama_cpp", stub)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--export", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--heldout-share", type=float, default=0.2)
    ap.add_argument("--newest-share", type=float, default=0.1)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=None)
    a = ap.parse_args()
    _without_llama_cpp()
    # after the stub: tiergate.training.lora imports llama_cpp at module level
    import peft
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    from tiergate.training.data import dedupe, load_export, split
    from tiergate.training.lora import TrainConfig, load_base, train_lora

    cuda = torch.cuda.is_available()
    report: dict[str, object] = {"cuda": cuda, "device": torch.cuda.get_device_name(0) if cuda else "cpu",
                                 "torch": torch.__version__, "transformers": transformers.__version__,
                                 "peft": peft.__version__}
    rows = dedupe(load_export(a.export))
    parts = split(rows, a.heldout_share, a.newest_share)
    report |= {"unique_rows": len(rows), "train_rows": len(parts.train), "heldout_rows": len(parts.heldout)}
    t0 = time.monotonic()
    base, tok = load_base(a.model)
    report["load_s"] = round(time.monotonic() - t0, 2)
    losses: list[tuple[int, int, float]] = []
    cfg = TrainConfig(rank=a.rank, alpha=2 * a.rank, lr=a.lr, epochs=a.epochs, batch_size=a.batch_size,
                      max_len=a.max_len, threads=4)
    t1, c1 = time.monotonic(), time.process_time()
    adapter = train_lora(base, tok, parts.train, cfg, Path("/tmp/gpu-run") / a.out.name, resume=False,
                         max_steps=a.steps, progress=lambda s, t, loss: losses.append((s, t, loss)))
    if cuda:
        torch.cuda.synchronize()
        report["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
    report |= {"train_wall_s": round(time.monotonic() - t1, 2), "train_cpu_s": round(time.process_time() - c1, 2),
               "steps": losses[-1][0], "first_loss": round(losses[0][2], 4), "last_loss": round(losses[-1][2], 4),
               "mean_last10_loss": round(sum(x[2] for x in losses[-10:]) / min(10, len(losses)), 4),
               "config": cfg.as_dict()}
    a.out.mkdir(parents=True, exist_ok=True)
    weights = load_file(adapter / "adapter_model.safetensors")
    save_file({k: v.half() for k, v in weights.items()}, a.out / "adapter_model.safetensors")
    (a.out / "adapter_config.json").write_text((adapter / "adapter_config.json").read_text())
    (a.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
