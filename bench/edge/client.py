"""The load bench/edge puts on a server: N concurrent streams, each sending streaming chat requests back to back.

Every server gets the same request bodies. Tokens are counted from the stream's `usage` (OpenAI's
`stream_options.include_usage`), not from chunks, since a chunk may carry several tokens or none. The end-of-
generation tokens are banned with `logit_bias` so that every request generates exactly `max_tokens` tokens on
every server: the same work for all, whatever the model would have said. A server whose stream carries no usage
(llama-cpp-python's) is credited `max_tokens` only for a request that ended with finish_reason "length".
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp

__all__ = ["Req", "body", "prompt", "run_round"]

_WORDS = ("harbour", "glacier", "orchard", "lantern", "compass", "meadow", "violin", "quarry", "falcon", "canyon",
          "ember", "pepper", "saddle", "tunnel", "walnut", "ribbon", "thunder", "marble", "island", "cobalt")


@dataclass(slots=True)
class Req:
    """One request as the client saw it (times in seconds from the round's start)."""

    sent: float
    first: float | None = None  # first chunk with content
    last: float | None = None  # last chunk with content
    tokens: int = 0  # completion tokens: usage, or max_tokens when the server sends none and it ended on length
    usage: bool = False  # the count came from the server's usage
    chunks: int = 0
    finish: str | None = None
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.sent

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (decode speed as one stream saw it)."""
        if self.first is None or self.last is None or self.tokens < 2:
            return None
        return (self.last - self.first) / (self.tokens - 1)


def prompt(i: int) -> str:
    w = [_WORDS[(i * 7 + k * 3) % len(_WORDS)] for k in range(6)]
    return f"Story {i}: write a long story about a {w[0]}, a {w[1]} and a {w[2]}, set near a {w[3]} in {w[4]}."


def body(i: int, max_tokens: int, banned: list[int]) -> dict:
    """The request every server gets; sampling spelled out so that no server's defaults differ."""
    return {"model": "bench", "messages": [{"role": "user", "content": prompt(i)}], "max_tokens": max_tokens,
            "temperature": 0.7, "top_k": 40, "top_p": 1.0, "min_p": 0.05, "seed": 1000 + i, "stream": True,
            "stream_options": {"include_usage": True}, "logit_bias": {str(t): -100 for t in banned}}


async def _one(session: aiohttp.ClientSession, url: str, payload: dict, t0: float) -> Req:
    r = Req(time.perf_counter() - t0)
    try:
        async with session.post(url + "/v1/chat/completions", json=payload) as resp:
            if resp.status != 200:
                r.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return r
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                d = json.loads(line[6:])
                if u := d.get("usage"):
                    r.tokens, r.usage = int(u.get("completion_tokens") or 0), True
                for ch in d.get("choices") or ():
                    if (ch.get("delta") or {}).get("content"):
                        now = time.perf_counter() - t0
                        r.first = now if r.first is None else r.first
                        r.last = now
                        r.chunks += 1
                    r.finish = ch.get("finish_reason") or r.finish
    except (TimeoutError, aiohttp.ClientError) as e:
        r.error = f"{type(e).__name__}: {e}"
        return r
    if not r.usage and r.finish == "length":
        r.tokens = payload["max_tokens"]
    return r


async def _round(url: str, streams: int, per_stream: int, max_tokens: int, banned: list[int], offset: int,
                 ) -> tuple[list[Req], float]:
    timeout = aiohttp.ClientTimeout(total=3600)
    # A new connection per request, for every server alike: llama-server closes a connection after a streamed
    # answer, and a reused one fails the stream's next request ("Can not write request body").
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        t0 = time.perf_counter()

        async def stream(s: int) -> list[Req]:
            return [await _one(session, url, body(offset + s * per_stream + k, max_tokens, banned), t0)
                    for k in range(per_stream)]

        done = await asyncio.gather(*(stream(s) for s in range(streams)))
        return [r for rs in done for r in rs], time.perf_counter() - t0


def run_round(url: str, streams: int, per_stream: int, max_tokens: int, banned: list[int], offset: int,
              ) -> tuple[list[Req], float]:
    """`streams` closed-loop clients, `per_stream` requests each; returns the requests and the round's wall time."""
    return asyncio.run(_round(url, streams, per_stream, max_tokens, banned, offset))
