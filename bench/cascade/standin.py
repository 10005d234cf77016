"""The cloud stand-in's own answers (optional, `--stand-in`): the second view of "the cloud is right".

In production the cloud tier is a 70B model, so the main view counts every escalated answer as right. The
stand-in this project can run (vLLM serving SmolLM2-135M-Instruct dequantized to float32 from the same GGUF,
cloud_pool/real_model.py) is the edge model with more precision, so scored by the same checkers it is about
as often right as the edge: the second view shows what the cascade measures against that stand-in, and is
no estimate of a real cloud's quality.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bench.cascade.runner import Answer, ask_all
from bench.cascade.tasks import Item
from tiergate.cloud_pool.process import VllmProcess, free_port
from tiergate.cloud_pool.spec import CpuOptions, VllmSpec
from tiergate.cloud_pool.vllm_env import missing_reason, vllm_python
from tiergate.core.paths import tiergate_home

__all__ = ["STANDIN_MODEL_DIR", "stand_in_answers"]

STANDIN_MODEL_DIR = tiergate_home() / "models" / "smollm2-135m-instruct-hf"  # written by scripts/setup-vllm.sh
_NAME = "cloud-standin"


def stand_in_answers(items: Sequence[Item], max_tokens: int, workdir: Path, concurrency: int = 8,
                     start_timeout_s: float = 900) -> list[Answer]:
    """Start one vLLM server on the stand-in model, ask every item (greedy, batched), stop it."""
    python = vllm_python()
    if python is None:
        raise SystemExit(f"--stand-in: {missing_reason()}")
    if not (STANDIN_MODEL_DIR / "config.json").is_file():
        raise SystemExit(f"--stand-in: no stand-in model at {STANDIN_MODEL_DIR} (run scripts/setup-vllm.sh)")
    spec = VllmSpec.model_validate(dict(
        name="cascade-standin", model=str(STANDIN_MODEL_DIR), served_model_name=_NAME, device="cpu",
        dtype="float32", max_model_len=2048, max_num_seqs=concurrency, enforce_eager=True, host="127.0.0.1",
        cpu=CpuOptions(kvcache_space_gib=1, omp_threads_bind="nobind", threads=1), env={"HF_HUB_OFFLINE": "1"},
    ))
    server = VllmProcess.from_spec(spec, workdir, python=str(python), port=free_port())
    try:
        server.wait_healthy(start_timeout_s)
        return ask_all(server.base_url, items, max_tokens, None, concurrency, model=_NAME)
    finally:
        server.terminate()
