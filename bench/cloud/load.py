"""One routing row of bench/cloud: a request sequence through one front end, measured at the vLLM servers.

Closed loop: `concurrency` clients send streaming chat requests back to back through the front end. Before the
row every server's prefix cache is emptied (`POST /reset_prefix_cache`, vLLM's dev mode), so every row starts
cold. Measured: the prefix-cache hit rate from vLLM's own counters (hit tokens / queried tokens over all servers),
each server's share of requests (`vllm:request_success_total`), its time-averaged load (requests in flight,
by Little's law: the growth of `vllm:e2e_request_latency_seconds_sum`, the seconds its requests spent in it, over
the row's wall time; vLLM's running/waiting gauges, sampled, missed most of a short row), time to the first
content token, completion tokens from usage, and failed requests (an error status, a broken stream, no content).
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench.cloud.fronts import KEY

__all__ = ["run_row"]


def _read(text: str) -> dict[str, float]:
    want = {"vllm:prefix_cache_queries_total": "queries", "vllm:prefix_cache_hits_total": "hits",
            "vllm:request_success_total": "done", "vllm:e2e_request_latency_seconds_sum": "busy_s"}
    out = dict.fromkeys(want.values(), 0.0)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in want:
                out[want[s.name]] += s.value
    return out


async def _metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as r:
        return _read(await r.text())


async def _one(session: aiohttp.ClientSession, front: str, body: dict) -> dict:
    t0 = time.perf_counter()
    ttft, tokens = None, 0
    try:
        async with session.post(front + "/v1/chat/completions", json=body,
                                headers={"Authorization": f"Bearer {KEY}"}) as r:
            if r.status != 200:
                return {"error": f"HTTP {r.status}", "total_s": time.perf_counter() - t0}
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                d = json.loads(line[6:])
                if d.get("usage"):
                    tokens = d["usage"].get("completion_tokens") or 0
                if ttft is None and any((c.get("delta") or {}).get("content") for c in d.get("choices") or ()):
                    ttft = time.perf_counter() - t0
    except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError) as e:
        return {"error": type(e).__name__, "total_s": time.perf_counter() - t0}
    out = {"ttft_s": ttft, "tokens": tokens, "total_s": time.perf_counter() - t0}
    if ttft is None:
        out["error"] = "no content"
    return out


async def _row(front: str, model: str, servers: list[str], workload: list[tuple[str, str]], concurrency: int,
               max_tokens: int) -> dict:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        for url in servers:
            async with session.post(url + "/reset_prefix_cache") as r:
                if r.status != 200:
                    raise RuntimeError(f"{url}/reset_prefix_cache answered {r.status}: VLLM_SERVER_DEV_MODE=1?")
        before = [await _metrics(session, u) for u in servers]
        queue = list(workload)
        results: list[dict] = []

        async def client() -> None:
            while queue:
                system, user = queue.pop(0)
                body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                        "stream_options": {"include_usage": True},
                        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
                results.append(await _one(session, front, body))

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
        after = [await _metrics(session, u) for u in servers]
    per = [{k: a[k] - b[k] for k in ("queries", "hits", "done")} | {"mean_load": (a["busy_s"] - b["busy_s"]) / elapsed}
           for a, b in zip(after, before, strict=True)]
    return {"elapsed_s": elapsed, "requests": results, "servers": per}


def run_row(front: str, model: str, servers: list[str], workload: list[tuple[str, str]], concurrency: int,
            max_tokens: int = 16) -> dict:
    return asyncio.run(_row(front, model, servers, workload, concurrency, max_tokens))
