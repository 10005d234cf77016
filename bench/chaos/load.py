"""Open-loop traffic for the chaos benchmark: requests start at a fixed rate whatever happens to the earlier ones.

A closed loop (each client waits for its answer before the next) slows down with the system and hides faults;
here request i starts at i / rate seconds, so a stalled backend shows as requests in flight and latency, never as
fewer requests. Mixed: half streaming, half JSON; about a third repeat a few greedy questions (cache hits); a
small fixed rate names the cloud tier's model (vLLM). Each request ends as exactly one of:

- answered  a whole answer: JSON with choices, or SSE chunks then `data: [DONE]` with no error event;
- error     an explicit failure: an OpenAI error object with its status, or an SSE error event then `[DONE]`;
- lost      anything else: a stream cut without `[DONE]`, a dropped connection, a body that is neither;
- hung      no end within the client's timeout.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass

import aiohttp

__all__ = ["Result", "run_load"]

QUESTIONS = ["What is a tier?", "Name a colour.", "Count to three.", "Say hello.", "What is two plus two?",
             "Name a fruit.", "Spell cat.", "What day follows Monday?"]


@dataclass(slots=True)
class Result:
    started: float  # seconds since the run's start
    ended: float = 0.0
    kind: str = "hung"  # answered | error | lost | hung
    detail: str = ""
    stream: bool = False
    cloud: bool = False
    tier: str = ""
    status: int = 0

    @property
    def latency(self) -> float:
        return self.ended - self.started


def _body(i: int, rng: random.Random, cloud: bool, max_tokens: int) -> dict:
    stream = i % 2 == 0
    if not cloud and rng.random() < 0.35:
        messages, temperature = [{"role": "user", "content": rng.choice(QUESTIONS)}], 0  # cacheable
    else:
        messages, temperature = [{"role": "user", "content": f"Tell me something, request {i}."}], 1
    body = {"model": "tiergate-cloud" if cloud else "auto", "messages": messages, "max_tokens": max_tokens,
            "temperature": temperature, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def _one(session: aiohttp.ClientSession, url: str, body: dict, res: Result, timeout_s: float,
               t0: float) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, json=body) as r:
                res.status, res.tier = r.status, r.headers.get("x-tiergate-tier", "")
                if r.status != 200:
                    raw = await r.read()
                    try:
                        err = json.loads(raw)["error"]
                        ok = isinstance(err, dict) and isinstance(err.get("message"), str)
                    except (ValueError, KeyError, TypeError):
                        ok = False
                    res.kind = "error" if ok else "lost"
                    res.detail = f"http_{r.status}:{err.get('code') if ok else 'not_an_openai_error'}"
                    return
                if not res.stream:
                    data = await r.json(content_type=None)
                    res.kind = "answered" if isinstance(data, dict) and data.get("choices") else "lost"
                    return
                done, error = False, None
                async for line in r.content:
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        break
                    if payload.startswith(b'{"error"'):
                        error = json.loads(payload)["error"]
                if not done:
                    res.kind, res.detail = "lost", "stream_cut_without_done"
                elif error is not None:
                    res.kind, res.detail = "error", f"sse:{error.get('code')}"
                else:
                    res.kind = "answered"
    except TimeoutError:
        res.kind, res.detail = "hung", f"no end within {timeout_s:g}s"
    except (aiohttp.ClientError, ConnectionError) as exc:
        res.kind, res.detail = "lost", f"client_{type(exc).__name__}"
    finally:
        res.ended = time.monotonic() - t0


async def run_load(url: str, key: str, rate: float, duration_s: float, *, cloud_rate: float = 1.0,
                   max_tokens: int = 16, timeout_s: float = 120.0, seed: int = 0,
                   at: list[tuple[float, object]] | None = None) -> tuple[list[Result], dict[str, float]]:
    """Send `rate` requests per second for `duration_s` (plus `cloud_rate` per second to the cloud tier), wait for
    every one to end, and return them. `at` holds (second, callable) faults, each run on a thread at its time;
    their actual times come back."""
    rng = random.Random(seed)
    url = url.rstrip("/") + "/v1/chat/completions"
    # A new connection per request: a kept-alive connection the server closed while idle fails the next request
    # sent on it before the server sees it (ServerDisconnectedError), which is the client's race, not a request
    # the gateway lost. With one connection per request, a connection that ends without an answer is the server's.
    conn = aiohttp.TCPConnector(limit=0, force_close=True)
    results: list[Result] = []
    tasks: list[asyncio.Task] = []
    fired: dict[str, float] = {}
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(connector=conn, headers={"Authorization": f"Bearer {key}"}) as session:
        t0 = time.monotonic()

        async def fault(when: float, action) -> None:
            # each fault on its own timer: one that blocks (a replacement node starting) must not delay the next
            await asyncio.sleep(max(0.0, t0 + when - time.monotonic()))
            fired[getattr(action, "__name__", str(action))] = round(time.monotonic() - t0, 3)
            await loop.run_in_executor(None, action)

        fault_task = asyncio.gather(*(fault(when, action) for when, action in at or []))
        n_edge, n_cloud = int(rate * duration_s), int(cloud_rate * duration_s)
        schedule = sorted([(i / rate, False) for i in range(n_edge)] + [(i / cloud_rate, True) for i in range(n_cloud)]
                          if cloud_rate > 0 else [(i / rate, False) for i in range(n_edge)])
        for i, (when, cloud) in enumerate(schedule):
            delay = t0 + when - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            body = _body(i, rng, cloud, max_tokens)
            res = Result(time.monotonic() - t0, stream=bool(body["stream"]), cloud=cloud)
            results.append(res)
            tasks.append(asyncio.create_task(_one(session, url, body, res, timeout_s, t0)))
        await asyncio.gather(*tasks)
        await fault_task
    return results, fired
