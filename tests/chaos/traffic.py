"""Real client traffic for chaos tests, and the verdict on every request it sent.

`Traffic` runs N client loops on its own thread and event loop (so the test thread is free to break
things), each sending chat completions through the gateway with aiohttp — streaming or not — and
classifying how each one ended:

- complete     200 with a whole answer: JSON with choices, or SSE chunks then `data: [DONE]`, no error event;
- error_json   a non-200 whose body is an OpenAI error object (an explicit, well-formed refusal);
- error_sse    a stream that ended with an SSE `error` event followed by `data: [DONE]`;
- lost         anything else: no answer within the client timeout (a hang), a stream cut without [DONE],
               a connection dropped, a body that is neither an answer nor an OpenAI error.

Times are `time.monotonic()`, the same clock the test thread uses to stamp its faults.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self

import aiohttp

__all__ = ["Outcome", "Traffic", "summarize"]


@dataclass
class Outcome:
    worker: int
    seq: int
    stream: bool
    started: float
    ended: float = 0.0
    kind: str = "lost"  # complete | error_json | error_sse | lost
    status: int = 0
    code: str | None = None  # error code (OpenAI `code`), or the client-side failure for `lost`
    tier: str | None = None
    cache: str | None = None
    rule: str | None = None
    fallback_from: str | None = None
    model: str | None = None  # the backend's model name in the answer: tells which node served it
    chunks: int = 0  # content chunks received before the end
    first_chunk_at: float | None = None
    tag: str = ""  # what the body factory said about this request
    live_key: str | None = None

    @property
    def error_kind(self) -> str:
        return f"{self.kind}:{self.status}:{self.code}"


@dataclass
class _Live:
    """Streams in flight that have begun: which backend model is streaming them (for 'kill mid-stream')."""

    by_model: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Traffic:
    """`with Traffic(url, key, body) as t: ...` — clients loop until the block ends, then `t.outcomes`."""

    def __init__(self, url: str, key: str, body: Callable[[int, int], tuple[dict, str]], *, workers: int = 4,
                 timeout_s: float = 60.0, pause_s: float = 0.0) -> None:
        self.url = url.rstrip("/") + "/v1/chat/completions"
        self.key = key
        self.body = body  # (worker, seq) -> (request body, tag)
        self.workers = workers
        self.timeout_s = timeout_s
        self.pause_s = pause_s
        self.outcomes: list[Outcome] = []
        self.live = _Live()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.t_start = 0.0
        self.t_end = 0.0

    # ---- control from the test thread -------------------------------------------------------------------

    def __enter__(self) -> Self:
        ready = threading.Event()

        def main() -> None:
            self._loop = asyncio.new_event_loop()
            self._stop = asyncio.Event()
            ready.set()
            self._loop.run_until_complete(self._run())
            self._loop.close()

        self._thread = threading.Thread(target=main, name="chaos-traffic", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Let every request in flight end (each is bounded by the client timeout), then return."""
        if self._thread is None:
            return
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(self.timeout_s + 30)
        assert not self._thread.is_alive(), "traffic did not stop: a request outlived its own timeout"
        self._thread = None

    def done(self, pred: Callable[[Outcome], bool] = lambda o: True) -> list[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if pred(o)]

    def wait_for(self, pred: Callable[[Outcome], bool], n: int = 1, timeout_s: float = 60.0,
                 what: str = "requests") -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.done(pred)) < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s}s waiting for {n} {what}; "
                                     f"so far: {summarize(self.done())}")
            time.sleep(0.05)

    def streaming(self, model: str | None = None) -> int:
        """Streams that have sent their first chunk and not ended: served by `model`, or by any model."""
        with self.live.lock:
            return self.live.by_model[model] if model is not None else sum(self.live.by_model.values())

    def wait_streaming_on(self, model: str, timeout_s: float = 60.0) -> None:
        """Until at least one stream served by `model` has begun and not ended."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.streaming(model) > 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"no stream in flight on {model} after {timeout_s}s")
            time.sleep(0.01)

    # ---- the clients --------------------------------------------------------------------------------------

    async def _run(self) -> None:
        self.t_start = time.monotonic()
        conn = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(connector=conn, headers={"Authorization": f"Bearer {self.key}"}) as s:
            await asyncio.gather(*(self._client(s, w) for w in range(self.workers)))
        self.t_end = time.monotonic()

    async def _client(self, session: aiohttp.ClientSession, worker: int) -> None:
        assert self._stop is not None
        seq = 0
        while not self._stop.is_set():
            body, tag = self.body(worker, seq)
            out = Outcome(worker, seq, bool(body.get("stream")), time.monotonic(), tag=tag)
            try:
                async with asyncio.timeout(self.timeout_s):
                    await self._one(session, body, out)
            except TimeoutError:
                out.kind, out.code = "lost", "client_timeout"
            except (aiohttp.ClientError, ConnectionError) as exc:
                out.kind, out.code = "lost", f"client_{type(exc).__name__}"
            finally:
                if out.first_chunk_at is not None and out.stream:
                    with self.live.lock:
                        self.live.by_model[out.live_key] -= 1
            out.ended = time.monotonic()
            with self._lock:
                self.outcomes.append(out)
            seq += 1
            if self.pause_s:
                await asyncio.sleep(self.pause_s)

    async def _one(self, session: aiohttp.ClientSession, body: dict, out: Outcome) -> None:
        async with session.post(self.url, json=body) as r:
            out.status = r.status
            h = r.headers
            out.tier, out.cache, out.rule = h.get("x-tiergate-tier"), h.get("x-tiergate-cache"), h.get("x-tiergate-rule")
            out.fallback_from = h.get("x-tiergate-fallback-from")
            if r.status != 200:
                raw = await r.read()
                err = _openai_error(raw)
                if err is None:
                    out.kind, out.code = "lost", f"malformed_error_body:{raw[:80]!r}"
                else:
                    out.kind, out.code = "error_json", err.get("code") or err.get("type")
                return
            if not out.stream:
                data = await r.json(content_type=None)
                ok = isinstance(data, dict) and data.get("choices")
                out.kind = "complete" if ok else "lost"
                out.model = data.get("model") if isinstance(data, dict) else None
                out.chunks = 1 if ok else 0
                if not ok:
                    out.code = "malformed_answer"
                return
            error: dict | None = None
            done = False
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                if error is not None:
                    error = {"code": "data_after_error"}  # an error event must be the last before [DONE]
                    continue
                chunk = json.loads(payload)
                if "error" in chunk:
                    error = chunk["error"]
                    continue
                if out.model is None and chunk.get("model"):
                    out.model = chunk["model"]
                if chunk.get("choices"):
                    out.chunks += 1
                    if out.first_chunk_at is None:
                        out.first_chunk_at = time.monotonic()
                        out.live_key = out.model
                        with self.live.lock:
                            self.live.by_model[out.model] += 1
            if not done:
                out.kind, out.code = "lost", "stream_cut_without_done"
            elif error is not None:
                out.kind, out.code = "error_sse", error.get("code") or error.get("type")
            elif out.chunks:
                out.kind = "complete"
            else:
                out.kind, out.code = "lost", "empty_stream"


def _openai_error(raw: bytes) -> dict | None:
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("message"), str) or not isinstance(err.get("type"), str):
        return None
    return err


def summarize(outcomes: list[Outcome], fault_at: float | None = None,
              recovered: Callable[[Outcome], bool] | None = None) -> dict:
    """Requests sent/completed, errors by kind, lost; recovery = fault → first success (started after the
    fault) on the path `recovered` accepts."""
    kinds = Counter(o.kind for o in outcomes)
    errors = Counter(o.error_kind for o in outcomes if o.kind in ("error_json", "error_sse"))
    lost = Counter(o.code for o in outcomes if o.kind == "lost")
    out: dict = {"sent": len(outcomes), "completed": kinds["complete"],
                 "errors": sum(errors.values()), "errors_by_kind": dict(errors),
                 "lost": kinds["lost"], "lost_by_reason": dict(lost),
                 "streams": sum(o.stream for o in outcomes)}
    if fault_at is not None:
        ok_after = [o.ended for o in outcomes
                    if o.kind == "complete" and o.started >= fault_at and (recovered is None or recovered(o))]
        out["recovery_s"] = round(min(ok_after) - fault_at, 3) if ok_after else None
    return out
