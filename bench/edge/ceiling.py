"""CPU cost per token of bare `llama_decode` calls at batch 1/4/8/16 on one thread: no sampling, no server.

    .venv/bin/python -m bench.edge.ceiling MODEL.gguf     (prints JSON: {batch: CPU ms per token})

What any server could reach on this CPU at best, and how much batching alone saves. CPU time, not wall time, so
other work on the machine barely moves it. Run in a child so the benchmark's own process never loads llama.cpp.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["kernel_ceiling"]


def _measure(model: Path, steps: int = 48) -> dict[int, float]:
    # only in the measuring child process: it loads llama.cpp's library, which the parent never needs
    from tiergate.edge_node.engine.batch import Batch
    from tiergate.edge_node.engine.runtime import LlamaRuntime, RuntimeConfig

    rt = LlamaRuntime(RuntimeConfig(model_path=model, ctx_per_seq=256, parallel=16, check_memory=False))
    ll, b, out = rt.llama, Batch(rt.llama, 64), {}
    try:
        for bs in (1, 4, 8, 16):
            for s in range(16):
                ll.llama_memory_seq_rm(rt.memory, s, -1, -1)
            t0 = time.process_time()
            for p in range(steps):
                b.token[:bs] = 200 + p
                b.pos[:bs] = p
                b.seq[:bs] = range(bs)
                b.logits[:bs] = 1
                b.struct.n_tokens = bs
                if ll.llama_decode(rt.ctx, b.struct) != 0:
                    raise SystemExit("llama_decode failed in the kernel measurement")
            out[bs] = round((time.process_time() - t0) / (steps * bs) * 1e3, 3)
    finally:
        rt.close()
    return out


def kernel_ceiling(model: Path) -> dict[int, float]:
    out = subprocess.run([sys.executable, "-m", "bench.edge.ceiling", str(model)], capture_output=True, text=True,
                         check=True)
    return {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


if __name__ == "__main__":
    print(json.dumps(_measure(Path(sys.argv[1]))))
