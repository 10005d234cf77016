"""Embed concurrent requests together, in one worker thread, never on the event loop.

Requests that arrive within `linger_ms` of each other (or while the worker is busy) are embedded in one
call: a batch of 8 costs far less than 8 single calls, and the event loop stays free while the ONNX
session runs (onnxruntime releases the GIL). Within a batch, texts are grouped by length so padding to the
longest does not make short prompts pay for a long one.

Tested in `tests/cache/test_embedder_batcher.py`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from tiergate.cache.embedder import Embedding, OnnxEmbedder
from tiergate.cache.metrics import CacheMetrics
from tiergate.core.tasks import cancel_and_wait

__all__ = ["EmbeddingBatcher", "Vector"]


@dataclass(frozen=True, slots=True)
class Vector:
    values: np.ndarray  # (dim,) float32, L2-normalised
    truncated: bool


class EmbeddingBatcher:
    def __init__(self, embedder: OnnxEmbedder, metrics: CacheMetrics, *, linger_ms: float = 1.0,
                 max_batch: int = 32) -> None:
        self.embedder = embedder
        self.dim = embedder.dim
        self._metrics = metrics
        self._linger = linger_ms / 1000.0
        self._max_batch = max_batch
        self._queue: asyncio.Queue[tuple[str, asyncio.Future[Vector]]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiergate-embed")

    async def start(self) -> None:
        if self._task is None:
            self._queue = asyncio.Queue()
            self._task = asyncio.create_task(self._run(), name="tiergate-embed-batcher")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._queue is not None:
            while not self._queue.empty():
                _, fut = self._queue.get_nowait()
                if not fut.done():
                    fut.set_exception(RuntimeError("embedding batcher stopped"))
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiergate-embed")

    async def embed(self, text: str) -> Vector:
        if self._task is None or self._queue is None:
            await self.start()
        assert self._queue is not None
        fut: asyncio.Future[Vector] = asyncio.get_running_loop().create_future()
        await self._queue.put((text, fut))
        return await fut

    async def embed_many(self, texts: list[str]) -> list[Vector]:
        """Embed a known list now (CLI, warm-up): one call per length group, still off the loop."""
        if not texts:
            return []
        emb = await asyncio.get_running_loop().run_in_executor(self._pool, self._embed_sync, texts)
        return [Vector(emb.vectors[i], bool(emb.truncated[i])) for i in range(len(texts))]

    async def _run(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            deadline = loop.time() + self._linger
            while len(batch) < self._max_batch:
                if not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                    continue
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:  # asyncio.timeout: 3.11's wait_for can swallow a stop()'s cancellation that races an item
                    async with asyncio.timeout(remaining):
                        batch.append(await self._queue.get())
                except TimeoutError:
                    break
            live = [(t, f) for t, f in batch if not f.done()]  # drop requests whose caller gave up
            if not live:
                continue
            try:
                emb = await loop.run_in_executor(self._pool, self._embed_sync, [t for t, _ in live])
            except Exception as exc:  # noqa: BLE001 - handed to every waiter; the loop keeps running
                for _, f in live:
                    if not f.done():
                        f.set_exception(exc)
                continue
            for i, (_, f) in enumerate(live):
                if not f.done():
                    f.set_result(Vector(emb.vectors[i], bool(emb.truncated[i])))

    def _embed_sync(self, texts: list[str]) -> Embedding:
        started = time.perf_counter()
        out = _embed_grouped(self.embedder.embed, texts, self.dim)
        self._metrics.embedding_seconds.observe(time.perf_counter() - started)
        self._metrics.embedding_batch.observe(len(texts))
        return out


def _embed_grouped(embed: Callable[[list[str]], Embedding], texts: list[str], dim: int) -> Embedding:
    """Embed in groups of similar length (by characters: a cheap proxy for tokens), keep the input order."""
    if len(texts) <= 2:
        return embed(texts)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    vectors = np.zeros((len(texts), dim), np.float32)
    truncated = np.zeros(len(texts), bool)
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and len(texts[order[end]]) <= 2 * max(len(texts[order[start]]), 32):
            end += 1
        idx = order[start:end]
        part = embed([texts[i] for i in idx])
        vectors[idx] = part.vectors
        truncated[idx] = part.truncated
        start = end
    return Embedding(vectors, truncated)
