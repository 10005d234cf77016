"""Was a cached answer right for a request? Compare it with the answer the tier gave for that request.

Used by the error bound (`cache.errbound`) for verified would-be hits and judged misses: the tier answered the
request anyway, so the cached candidate's answer is compared with the fresh one, off the request path (after
the response has gone out).

- `EmbeddingJudge` (the default): both answers through the cache's own embedder; equivalent when their cosine
  reaches `judge_threshold` (0.90). Cheap (two embeddings on the embedder's thread), and blunt: it cannot tell
  two short answers that differ in one number ("4" / "5"), so it errs towards "equivalent" there.
- `HttpJudge`: an OpenAI-compatible chat model the operator names (`TIERGATE_CACHE_JUDGE_URL`,
  `TIERGATE_CACHE_JUDGE_MODEL`), asked whether the cached answer also answers the request; "yes" or "no".

Whatever the judge gets wrong adds to the measured false-hit rate (a lenient judge lets the bound drift up).
A judge that cannot answer (timeout, error) gives no label: nothing is learnt from that request.
"""

from __future__ import annotations

import asyncio
import re
from typing import Protocol

import aiohttp
import numpy as np
import structlog

from tiergate.cache.batcher import EmbeddingBatcher

__all__ = ["EmbeddingJudge", "HttpJudge", "Judge"]

log = structlog.get_logger("tiergate.cache.judge")


class Judge(Protocol):
    async def same(self, question: str, cached: str, fresh: str) -> bool | None:
        """True when the cached answer is as good an answer to `question` as the fresh one; None: no verdict."""
        ...


class EmbeddingJudge:
    def __init__(self, batcher: EmbeddingBatcher, threshold: float = 0.90) -> None:
        self._batcher = batcher
        self.threshold = threshold

    async def same(self, question: str, cached: str, fresh: str) -> bool | None:
        if not cached.strip() or not fresh.strip():
            return None
        if cached.strip() == fresh.strip():
            return True
        a, b = await asyncio.gather(self._batcher.embed(cached), self._batcher.embed(fresh))
        return float(np.dot(a.values, b.values)) >= self.threshold


_PROMPT = """You check a cache. A user asked:

<question>
{question}
</question>

Answer A was given to a similar, earlier question. Answer B was just produced for this question.

<answer_a>
{cached}
</answer_a>

<answer_b>
{fresh}
</answer_b>

Is answer A a correct and complete answer to the user's question, as good as answer B? Reply with one word: yes or no."""


class HttpJudge:
    """An OpenAI-compatible chat endpoint as the judge (temperature 0, one word)."""

    def __init__(self, url: str, model: str, api_key: str | None = None, timeout_s: float = 30.0) -> None:
        base = url.rstrip("/")
        self._url = base if base.endswith("/chat/completions") else f"{base}/chat/completions"
        self._model = model
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def same(self, question: str, cached: str, fresh: str) -> bool | None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        body = {"model": self._model, "temperature": 0, "max_tokens": 3, "messages": [
            {"role": "user", "content": _PROMPT.format(question=question[:4000], cached=cached[:4000],
                                                       fresh=fresh[:4000])}]}
        try:
            async with self._session.post(self._url, json=body, headers=self._headers) as resp:
                if resp.status != 200:
                    log.warning("cache_judge_failed", status=resp.status)
                    return None
                data = await resp.json(content_type=None)
            content = data["choices"][0]["message"]["content"]
        except (aiohttp.ClientError, TimeoutError, KeyError, IndexError, TypeError, ValueError) as exc:
            log.warning("cache_judge_failed", error=repr(exc)[:200])
            return None
        # Only a first word of exactly yes or no is a verdict: a null content, "none" or "not sure" is not.
        first = re.match(r"[a-z]+", content.strip().lower()) if isinstance(content, str) else None
        return {"yes": True, "no": False}.get(first.group() if first else "")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
