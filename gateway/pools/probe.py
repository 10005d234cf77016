"""One health poll of a vLLM server: `/health`, then `/metrics` (its load), and now and then `/v1/models`.

A server that answers but is not vLLM, or serves another model than its tier expects, is as unhealthy as one
that does not answer; `Unhealthy` says which (the kind labels `tiergate_cloud_poll_failures`). The model check
also reads the served model's context (`max_model_len`), which the pool compares with its tier's `max_context`.
"""

from __future__ import annotations

import dataclasses

import aiohttp

from tiergate.gateway.pools.vllm_metrics import NotVllmError, VllmMetrics, parse

__all__ = ["Unhealthy", "probe"]


class Unhealthy(Exception):
    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


async def probe(session: aiohttp.ClientSession, base: str, model: str | None, tier: str) -> VllmMetrics:
    """The server's load reading; with `model`, also check that it serves that model. Raises `Unhealthy`."""
    async with session.get(f"{base}/health") as resp:
        if resp.status != 200:
            raise Unhealthy("http_status", f"/health answered HTTP {resp.status}")
    async with session.get(f"{base}/metrics") as resp:
        if resp.status != 200:
            raise Unhealthy("not_vllm", f"not a vLLM server: /metrics answered HTTP {resp.status}")
        text = await resp.text()
    try:
        reading = parse(text)
    except NotVllmError as exc:
        raise Unhealthy("not_vllm", str(exc)) from None
    except ValueError as exc:
        raise Unhealthy("not_vllm", f"not a vLLM server: /metrics is not Prometheus text ({exc})") from None
    if model is None:
        return reading
    async with session.get(f"{base}/v1/models") as resp:
        if resp.status != 200:
            raise Unhealthy("not_vllm", f"/v1/models answered HTTP {resp.status}")
        try:
            body = await resp.json(content_type=None)
        except ValueError:
            body = None
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise Unhealthy("not_vllm", "not a vLLM server: /v1/models is not an OpenAI model list")
    served = [str(item.get("id")) for item in body["data"] if isinstance(item, dict)]
    if model not in served:
        raise Unhealthy("wrong_model", f"wrong model: serves {served}, tier {tier!r} expects {model!r}")
    entry = next(item for item in body["data"] if isinstance(item, dict) and str(item.get("id")) == model)
    ctx = entry.get("max_model_len")
    if isinstance(ctx, int) and not isinstance(ctx, bool) and ctx > 0:
        reading = dataclasses.replace(reading, max_model_len=ctx)
    return reading
